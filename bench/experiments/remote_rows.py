"""What precomputed rows kept in a Redis Cluster cost (graph_assets.remote.rows), in process:
loading them beside the graph, the memory they take there, and batched reads against the
memory-mapped rows, on a 3-primary cluster (3 replicas) on loopback.

``python -m bench.experiments.remote_rows`` (``--nodes``, ``--edges``) builds a synthetic graph
(default 100,000 nodes, 1M edges, 128 features), precomputes a 2-layer GCN's rows (64 wide,
then the classes), loads the graph and then the rows into the cluster, and measures the load
(seconds, MiB, rows/s), the primaries' ``used_memory`` the rows add per row byte, and the p50
of a read of ``B`` random nodes' output rows and of their out-lists (B = 10, 100, 1,000),
cold (cache off) and warm (every block cached), against the memory-mapped rows; each read is
one round trip. A markdown table goes to stdout, the figures to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments.remote_reads import p50_ms
from graph_assets import generate_synthetic, open_store
from graph_assets.remote import load_store, open_remote_store
from graph_assets.remote.connect import connect
from model import build_model
from model.precompute import load_to_redis, open_precomputed, open_remote_precomputed, precompute
from tests.servers.redis_cluster import LocalCluster

BATCHES = (10, 100, 1000)
PREFIX = "rows"


def used_memory(url: str) -> int:
    """The bytes the cluster's primaries use, summed."""
    client = connect(url, 5000)
    try:
        replies = client.info("memory", target_nodes="primaries")
        return sum(int(reply["used_memory"]) for reply in replies.values())
    finally:
        client.close()


def measure(nodes: int, edges: int, repeats: int, home: Path) -> dict[str, Any]:
    generate_synthetic(nodes, edges, home / "store", feature_dim=128, seed=0)
    store = open_store(home / "store")
    torch.manual_seed(0)
    model = build_model(
        {"arch": "gcn", "in_dim": 128, "out_dim": store.num_classes, "hidden_dim": 64}
    ).eval()
    started = time.perf_counter()
    meta = precompute(model, store, home / "p", "weights", progress=False)
    built = time.perf_counter() - started
    cluster = LocalCluster(home / "cluster").start()
    try:
        client = connect(cluster.url, 5000)
        try:
            load_store(store, client, PREFIX, shown_url=cluster.url)
        finally:
            client.close()
        before = used_memory(cluster.url)
        started = time.perf_counter()
        load_to_redis(home / "p", f"{cluster.url}/{PREFIX}", store.checksum)
        loaded = time.perf_counter() - started
        added = used_memory(cluster.url) - before
        files = meta["files"]
        row_bytes = sum(f["bytes"] for name, f in files.items() if name.startswith("layer_"))
        out_bytes = sum(f["bytes"] for name, f in files.items() if name.startswith("out_"))
        local = open_precomputed(home / "p", store, "weights")
        rng = np.random.default_rng(1)
        reads = []
        for size in BATCHES:
            batches = [rng.choice(store.num_nodes, size, replace=False) for _ in range(repeats)]
            row: dict[str, Any] = {"batch": size}
            row["local_rows_ms"] = p50_ms(partial(local.read, 1), batches)
            row["local_out_ms"] = p50_ms(local.out_neighbours, batches)
            for name, cache_mb in (("cold", 0.0), ("warm", 4096.0)):
                graph = open_remote_store(
                    cluster.url, PREFIX, store.checksum, cache_mb=cache_mb, timeout_ms=5000
                )
                try:
                    rows = open_remote_precomputed(home / "p", graph, "weights")
                    if name == "warm":
                        for batch in batches:
                            rows.read(1, batch)
                            rows.out_neighbours(batch)
                    trips = graph.counters.round_trips
                    row[f"{name}_rows_ms"] = p50_ms(partial(rows.read, 1), batches)
                    row[f"{name}_out_ms"] = p50_ms(rows.out_neighbours, batches)
                    row[f"{name}_trips_per_read"] = (graph.counters.round_trips - trips) / (
                        2 * repeats
                    )
                finally:
                    graph.close()
            reads.append(row)
    finally:
        cluster.stop()
    return {
        "nodes": store.num_nodes,
        "edges": store.num_edges,
        "precompute_s": round(built, 2),
        "load_s": round(loaded, 2),
        "load_mib": round((row_bytes + out_bytes) / 2**20, 1),
        "load_rows_per_s": round(store.num_nodes / loaded),
        "redis_bytes_per_row_byte": round(added / (row_bytes + out_bytes), 2),
        "reads": reads,
    }


def table(figures: dict[str, Any]) -> str:
    lines = [
        f"{figures['nodes']:,} nodes, {figures['edges']:,} edges: precompute "
        f"{figures['precompute_s']} s, load {figures['load_mib']} MiB in {figures['load_s']} s "
        f"({figures['load_rows_per_s']:,} rows/s), Redis "
        f"{figures['redis_bytes_per_row_byte']} bytes per byte loaded",
        "",
        "| batch | rows local | rows cold | rows warm | out-lists local | cold | warm "
        "| round trips per read cold / warm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in figures["reads"]:
        lines.append(
            f"| {r['batch']} | {r['local_rows_ms']:.3f} ms | {r['cold_rows_ms']:.2f} ms | "
            f"{r['warm_rows_ms']:.3f} ms | {r['local_out_ms']:.3f} ms | {r['cold_out_ms']:.2f} ms "
            f"| {r['warm_out_ms']:.3f} ms | {r['cold_trips_per_read']:.1f} / "
            f"{r['warm_trips_per_read']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        figures = measure(args.nodes, args.edges, args.repeats, Path(home))
    print(table(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
