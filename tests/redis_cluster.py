"""The tests' Redis Cluster: the harness the benchmarks use too (bench/harness/redis_cluster.py)."""

from bench.harness.redis_cluster import LocalCluster

__all__ = ["LocalCluster"]
