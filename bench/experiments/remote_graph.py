"""Serving from a graph in a Redis Cluster against serving the same graph from the local store,
side by side in one run: what issue 26's backend costs a served request.

``python -m bench.experiments.remote_graph [--pairs 3] [--seconds 8] [--out FILE]``

A 3-primary, 3-replica cluster on loopback (tests/servers/redis_cluster.py) holds two synthetic
graphs (128 float32 features, 8 classes, seed 0; bench/harness/artifacts.py): the 1M-edge one
(100,000 nodes) and the 10M-edge one (1,000,000 nodes), each loaded with ``load_store`` (the
code of ``python -m graph_assets load-redis``), timed. Three archives with the same random
GraphSAGE weights (``--weights``), fanouts [10,10], batch 16 / 5 ms, one worker, one intra-op
thread, CPU, the default cache (``gnn.remote_cache_mb`` 256):

1. local: the 1M store in the archive;
2. remote: the 1M graph in the cluster (``--graph-location redis://.../g1m``);
3. remote_10M: the 10M graph in the cluster, served for the memory and cache figures only;
4. remote_sized, remote_10M_sized: 2 and 3 with a cache sized for the working set
   (``--remote-cache-mb 64``, ``SIZED_CACHE_MB``), for the memory ratio at that size (info).

One TorchServe serves all three. Every request asks for 10-14 node IDs (mean 12). Measured, in
this order:

- in process (info): the engine on the local store and on a ``RemoteStore`` of the cluster
  (cache warm) answers the same batches of 16 requests alternately; the median of each stage;
- served: after a warm-up of each, local and remote back to back in ``--pairs`` pairs, the order
  alternating from pair to pair, at 32 connections (throughput) and then at one (p50), uniformly
  random IDs, the same sequence of requests for both; the figures are the medians of the pairs'
  ratios, remote over local;
- Redis round trips per batch: from the worker's batch log line (handler.pipeline.metrics: the mean
  per batch of each interval), weighted by the interval's batches, over the remote pairs;
- cache: the same load, IDs drawn by Zipf(1.1) rank from a random permutation of the nodes, on
  each remote archive for ``--zipf-seconds``; the hit ratio and throughput of the second half;
- memory: the PSS (``/proc/<pid>/smaps_rollup``, the pid from the describe API) of each remote
  worker before its first request (its graph opened, nothing cached) and once it has served
  that Zipf load;
- Redis: the load rate (rows/s: nodes, edges and IDs written), ``used_memory`` summed over the
  primaries per graph, and ``MEMORY USAGE`` of a sample of blocks' in-lists and feature rows:
  bytes per edge and per feature byte (one copy; the replicas hold a second).

``--memory-only`` loads the graphs, starts the same server with the same archives, and measures
only the Zipf load and the memory (about 3 minutes instead of 7-10). Results go to ``--out``
(JSON) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments.suite import finish_run, machine
from bench.experiments.typed_graph import stage_medians, stage_row
from bench.harness import loadgen
from bench.harness.artifacts import GRAPHS, ROOT, Artifacts
from bench.harness.paired import (
    CONNECTIONS,
    check_answers,
    paired_levels,
    warmed_targets,
)
from bench.harness.watch import host_steal, memory_of
from bench.systems import servers
from graph_assets import GraphStore, open_store
from graph_assets.remote import RemoteStore, load_store, open_remote_store
from graph_assets.remote.connect import connect
from graph_assets.remote.layout import ADJ, DEFAULT_BLOCK_SIZE, RemoteLayout, features_field
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model.export import load_model
from tests.servers.redis_cluster import LocalCluster
from tests.servers.torchserve import TorchServe, model_worker_pids

SYSTEMS = ("local", "remote")
FANOUTS = (10, 10)
HOPS = len(FANOUTS)
BATCH, DELAY = 16, 5
IDS = (10, 14)
PREFIXES = {"1M": "g1m", "10M": "g10m"}
DEFAULT_CACHE_MB = 256  # gnn.remote_cache_mb's default
SIZED_CACHE_MB = 64  # about the 1M graph's Zipf working set
LATENCY_TARGET, THROUGHPUT_TARGET, MEMORY_TARGET = 1.5, 0.6, 1.2
SAMPLED_BLOCKS = 256
BATCH_LINE = re.compile(
    r"W-\d+-(?P<model>\S+?)_[\d.]+-stdout MODEL_LOG - gnn batches: (?P<batches>\d+) in .*?"
    r"Redis per batch (?P<round_trips>[\d.]+) round trips, (?P<kib>[\d.]+) KiB, "
    r"(?P<read_ms>[\d.]+) ms, cache hit ratio (?P<hit_ratio>[\d.]+)"
)


# -- requests ---------------------------------------------------------------------------------


def uniform_bodies(nodes: int, count: int, seed: int = 3) -> list[bytes]:
    """``count`` requests of 10-14 uniformly random node IDs (synthetic IDs are 0..N-1)."""
    rng = np.random.default_rng(seed)
    return [
        json.dumps(
            {"node_ids": rng.integers(0, nodes, rng.integers(*IDS, endpoint=True)).tolist()}
        ).encode()
        for _ in range(count)
    ]


def zipf_bodies(nodes: int, count: int, seed: int = 4) -> list[bytes]:
    """``count`` requests of 10-14 IDs drawn by Zipf(1.1) rank from a random permutation of the
    nodes: a few nodes are asked for very often, most rarely."""
    rng = np.random.default_rng(seed)
    ranked = rng.permutation(nodes)
    bodies = []
    for _ in range(count):
        ranks = np.minimum(rng.zipf(1.1, rng.integers(*IDS, endpoint=True)), nodes) - 1
        bodies.append(json.dumps({"node_ids": ranked[ranks].tolist()}).encode())
    return bodies


# -- the cluster ------------------------------------------------------------------------------


@contextmanager
def cluster(home: Path) -> Iterator[LocalCluster]:
    """A 3+3 cluster under ``home``, stopped by PID on exit."""
    started = LocalCluster(home).start()
    try:
        yield started
    finally:
        started.stop()


def primaries_memory(redis: LocalCluster) -> int:
    """``used_memory`` summed over the cluster's primaries (one copy of the data)."""
    total = 0
    for node in redis.nodes:
        client = node.client()
        try:
            if client.info("replication")["role"] == "master":
                total += int(client.info("memory")["used_memory"])
        finally:
            client.close()
    return total


def load(
    redis: LocalCluster, store: GraphStore, prefix: str, block_size: int = DEFAULT_BLOCK_SIZE
) -> dict[str, Any]:
    """Loads ``store`` under ``prefix``, timed, with what it adds to the primaries' memory."""
    before = primaries_memory(redis)
    client = connect(redis.url, 60_000)
    try:
        report = load_store(store, client, prefix, shown_url=redis.url, block_size=block_size)
        sizes = sampled_sizes(client, store, prefix, block_size)
    finally:
        client.close()
    if not report.complete:
        raise RuntimeError(f"the load of {prefix} did not complete: {report}")
    used = primaries_memory(redis) - before
    return {
        "rows": report.rows,
        "value_bytes": report.bytes,
        "seconds": round(report.seconds, 2),
        "rows_per_s": round(report.rows / report.seconds),
        "used_memory_bytes": used,
        "used_memory_per_edge_and_feature_byte": round(
            used / (store.num_edges * 4 + store.num_nodes * store.feature_dim * 4), 3
        ),
        **sizes,
    }


def sampled_sizes(client: Any, store: GraphStore, prefix: str, block_size: int) -> dict[str, float]:
    """``MEMORY USAGE`` of ``SAMPLED_BLOCKS`` random blocks' in-lists and feature rows: Redis
    bytes per edge (an in-list holds its block's pointers and sources) and per feature byte."""
    layout = RemoteLayout.of_store(store, block_size)
    keys = layout.keys(prefix)
    rng = np.random.default_rng(5)
    blocks = rng.choice(layout.num_blocks, min(SAMPLED_BLOCKS, layout.num_blocks), replace=False)
    adjacency = features = edges = rows = 0
    indptr = np.asarray(store.indptr)
    for block in blocks.tolist():
        start, stop = layout.block_nodes(block)
        adjacency += int(client.memory_usage(keys.block(block, ADJ)))
        features += int(client.memory_usage(keys.block(block, features_field(0))))
        edges += int(indptr[stop] - indptr[start])
        rows += stop - start
    return {
        "bytes_per_edge": round(adjacency / edges, 3),
        "bytes_per_feature_byte": round(features / (rows * store.feature_dim * 4), 3),
        "sampled_blocks": len(blocks),
    }


# -- archives ---------------------------------------------------------------------------------


def build(
    artifacts: Artifacts,
    name: str,
    graph: str,
    location: str | None,
    cache_mb: int = DEFAULT_CACHE_MB,
) -> Path:
    """The archive ``name`` of ``graph``'s store with the shared random weights, its graph in
    the archive or, with ``location``, in Redis read through a cache of ``cache_mb`` (rebuilt:
    the cluster's ports change)."""
    extra = ["--graph-location", location, "--remote-cache-mb", str(cache_mb)] if location else []
    if location:
        shutil.rmtree(artifacts.archives / name, ignore_errors=True)
    return artifacts.built(
        name,
        [
            *("--store", str(artifacts.store(graph)), *extra),
            *("--weights", str(artifacts.model_dir() / "model.pt")),
            *("--fanouts", ",".join(map(str, FANOUTS)), "--torch-threads", "1"),
            *("--batch-size", str(BATCH), "--max-batch-delay", str(DELAY)),
            *("--min-workers", "1", "--max-workers", "1", "--device", "cpu"),
        ],
    )


# -- in process -------------------------------------------------------------------------------


def in_process(
    folder: Path, views: dict[str, GraphStore | RemoteStore], payload: list[bytes], rounds: int
) -> dict[str, Any]:
    """Median stage times (ms) of a batch of ``BATCH`` requests on each graph view, the two
    alternating round by round on the same batches; the first round warms the remote cache,
    as the served warm-up does."""
    model, _ = load_model(folder)
    settings = ServingSettings(fanouts=FANOUTS, torch_threads=1)
    engines = {
        name: NodeClassificationEngine.create(view, model, settings, torch.device("cpu"), "1.0")
        for name, view in views.items()
    }
    return stage_medians(SYSTEMS, engines, payload, 40, rounds)


# -- served -----------------------------------------------------------------------------------


def model_log(server: TorchServe) -> Path:
    """The log the workers' batch lines go to."""
    return server.home / "logs" / "model_log.log"


def log_offset(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def batch_reads(log: Path, model: str, since: int) -> dict[str, Any]:
    """The Redis figures of ``model``'s batch log lines written to ``log`` after byte
    ``since``: means per batch weighted by each interval's batches (a first interval of one
    batch left out), and the largest interval's mean round trips."""
    text = log.read_bytes()[since:].decode(errors="replace")
    lines = [m for m in BATCH_LINE.finditer(text) if m["model"] == model and int(m["batches"]) > 1]
    if not lines:
        raise RuntimeError(f"no batch log line of {model} with Redis figures in {log}")
    weights = [int(m["batches"]) for m in lines]

    def mean(key: str) -> float:
        return float(np.average([float(m[key]) for m in lines], weights=weights))

    return {
        "batches": sum(weights),
        "intervals": len(lines),
        "round_trips": round(mean("round_trips"), 3),
        "round_trips_max_interval": max(float(m["round_trips"]) for m in lines),
        "kib": round(mean("kib"), 2),
        "read_ms": round(mean("read_ms"), 3),
        "hit_ratio": round(mean("hit_ratio"), 4),
    }


def pairs(
    server: TorchServe, payload: list[bytes], count: int, seconds: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Pairs at 32 connections, then at one, the order alternating from pair to pair; and the
    remote worker's Redis figures over them."""
    targets, cpu = warmed_targets(server, SYSTEMS, payload)
    since = log_offset(model_log(server))
    levels = paired_levels(targets, cpu, SYSTEMS, count, seconds)
    return levels, batch_reads(model_log(server), "remote", since)


def idle_memory(server: TorchServe, models: list[str]) -> dict[str, float]:
    """Each model's worker PSS (MiB) before it served anything: its graph opened, nothing
    cached."""
    return {model: round(memory_of(model_worker_pids(server, model)).pss, 1) for model in models}


def zipf_and_memory(
    server: TorchServe, models: dict[str, int], seconds: float, idle: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Each remote archive under Zipf(1.1) requests at 32 connections for ``seconds``: the
    cache hit ratio of the second half, then the worker's PSS (and ``idle``, its PSS before
    its first request)."""
    auth = server.auth("inference")
    figures = {}
    for model, nodes in models.items():
        url = f"{server.inference_url}/predictions/{model}"
        target = loadgen.Target(url, zipf_bodies(nodes, 20_000), auth)
        check_answers(url, auth, target.bodies[0])
        loadgen.closed_loop(target, CONNECTIONS, seconds / 2, 1_000_000, timeout_s=180)
        since = log_offset(model_log(server))
        result = loadgen.closed_loop(target, CONNECTIONS, seconds / 2, 1_000_000, timeout_s=180)
        memory = memory_of(model_worker_pids(server, model))
        figures[model] = {
            "throughput": result.throughput,
            "errors": result.errors,
            "reads": batch_reads(model_log(server), model, since),
            "pss_idle_mib": idle[model],
            "pss_mib": round(memory.pss, 1),
            "pss_anon_mib": round(memory.pss_anon, 1),
            "pss_file_mib": round(memory.pss_file, 1),
        }
        print(f"    {model}: {figures[model]}", flush=True)
    return figures


# -- report -----------------------------------------------------------------------------------


def ratio(results: dict[str, Any], concurrency: int, key: str) -> tuple[float, list[float]]:
    """The median over pairs of remote / local ``key`` at ``concurrency``, and each pair's."""
    levels = [p for p in results["served"] if p["concurrency"] == concurrency]
    ratios = [p["remote"][key] / p["local"][key] for p in levels]
    return statistics.median(ratios), ratios


def _verdict(value: float, op: str, bound: float) -> str:
    return "met" if (value <= bound if op == "<=" else value >= bound) else "missed"


def table(results: dict[str, Any]) -> str:
    """The issue's six figures as a markdown table (the memory and cache ones alone after
    ``--memory-only``)."""
    rows = ["| figure | target | measured | detail |", "|---|---|---|---|"]
    served = "served" in results

    def medians(concurrency: int, key: str) -> str:
        levels = [p for p in results["served"] if p["concurrency"] == concurrency]
        remote = statistics.median(p["remote"][key] for p in levels)
        local = statistics.median(p["local"][key] for p in levels)
        return f"{remote:,.2f} vs {local:,.2f}"

    if served:
        p50, p50_pairs = ratio(results, 1, "p50_ms")
        rows.append(
            f"| p50 at 1 conn, 1M edges, [10,10], remote / local | <= {LATENCY_TARGET} "
            f"| {p50:.2f} | {_verdict(p50, '<=', LATENCY_TARGET)}: {medians(1, 'p50_ms')} ms "
            "(medians); pairs " + ", ".join(f"{r:.2f}" for r in p50_pairs) + " |"
        )
        tput, tput_pairs = ratio(results, CONNECTIONS, "throughput")
        rows.append(
            f"| throughput at {CONNECTIONS} conns, remote / local | >= {THROUGHPUT_TARGET} "
            f"| {tput:.2f} | {_verdict(tput, '>=', THROUGHPUT_TARGET)}: "
            f"{medians(CONNECTIONS, 'throughput')} req/s (medians); pairs "
            + ", ".join(f"{r:.2f}" for r in tput_pairs)
            + " |"
        )
    zipf = results["zipf"]
    small, large = zipf["remote"], zipf["remote_10M"]
    memory = large["pss_mib"] / small["pss_mib"]
    rows.append(
        f"| worker PSS serving 10M edges / 1M edges, remote | <= {MEMORY_TARGET} | {memory:.2f} "
        f"| {_verdict(memory, '<=', MEMORY_TARGET)}: {large['pss_mib']:,.0f} vs "
        f"{small['pss_mib']:,.0f} MiB (anonymous {large['pss_anon_mib']:,.0f} vs "
        f"{small['pss_anon_mib']:,.0f}) after the same Zipf load; before the first request "
        f"{large['pss_idle_mib']:,.0f} vs {small['pss_idle_mib']:,.0f} |"
    )
    if served:
        reads = results["reads"]
        rows.append(
            f"| Redis round trips per batch | <= hops + 2 = {HOPS + 2} "
            f"| {reads['round_trips']:.2f} "
            f"| {_verdict(reads['round_trips_max_interval'], '<=', HOPS + 2)}: mean over "
            f"{reads['batches']:,} batches of the remote pairs, largest interval "
            f"{reads['round_trips_max_interval']:.2f}; {reads['kib']:.1f} KiB and "
            f"{reads['read_ms']:.2f} ms of reads a batch |"
        )
    rows.append(
        f"| cache hit ratio, Zipf(1.1), default cache ({DEFAULT_CACHE_MB} MB) | report "
        f"| {large['reads']['hit_ratio']:.3f} | 10M edges (512 MB of features); 1M edges "
        f"{small['reads']['hit_ratio']:.3f}; {large['reads']['round_trips']:.2f} vs "
        f"{small['reads']['round_trips']:.2f} round trips, {large['reads']['kib'] / 1024:,.1f} "
        f"vs {small['reads']['kib'] / 1024:,.1f} MiB read a batch |"
    )
    sized_small, sized_large = zipf["remote_sized"], zipf["remote_10M_sized"]
    sized = sized_large["pss_mib"] / sized_small["pss_mib"]
    rows.append(
        f"| worker PSS 10M / 1M edges, remote, cache sized {SIZED_CACHE_MB} MB | info "
        f"| {sized:.2f} | {sized_large['pss_mib']:,.0f} vs {sized_small['pss_mib']:,.0f} MiB; "
        f"hit ratio {sized_large['reads']['hit_ratio']:.3f} vs "
        f"{sized_small['reads']['hit_ratio']:.3f}, Zipf throughput "
        f"{sized_large['throughput']:,.0f} vs {sized_small['throughput']:,.0f} req/s (at "
        f"{DEFAULT_CACHE_MB} MB: {large['throughput']:,.0f} vs {small['throughput']:,.0f}) |"
    )
    if served:
        local_pss = results["local_pss_mib"]
        rows.append(
            f"| (worker PSS, local 1M store) | info | {local_pss:,.0f} MiB | the store's pages "
            "shared through the page cache count in part |"
        )
        stages = results["in_process"]
        r, lo = stages["remote"], stages["local"]
        rows.append(stage_row("warm cache, remote / local", r, lo))
    loads = results["load"]
    big, one = loads["10M"], loads["1M"]
    rows.append(
        f"| load rate; Redis memory per edge and per feature byte | report "
        f"| {big['rows_per_s']:,} rows/s | 10M: {big['rows']:,} rows in {big['seconds']:.1f} s "
        f"(1M: {one['rows_per_s']:,} rows/s); {big['bytes_per_edge']:.2f} B per edge, "
        f"{big['bytes_per_feature_byte']:.3f} B per feature byte (MEMORY USAGE of "
        f"{big['sampled_blocks']} blocks); used_memory of the primaries "
        f"{big['used_memory_bytes'] / 2**20:,.0f} MiB for 10M, "
        f"{one['used_memory_bytes'] / 2**20:,.0f} MiB for 1M |"
    )
    return "\n".join(rows)


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench", help="build dir")
    parser.add_argument("--pairs", type=int, default=3, help="pairs per connection count")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per level")
    parser.add_argument(
        "--zipf-seconds", type=float, default=20.0, help="Zipf load per remote archive"
    )
    parser.add_argument("--rounds", type=int, default=3, help="in-process rounds per view")
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="nodes per block of both loads (load-redis --block-size)",
    )
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the loads, the Zipf load and the memory (no in-process and paired runs)",
    )
    parser.add_argument("--out", type=Path, help="JSON results file")
    args = parser.parse_args()
    started, steal, measured_on = time.perf_counter(), host_steal(), machine()
    artifacts = Artifacts(args.work)
    stores = {
        graph: open_store(artifacts.store(graph), verify_checksum=False) for graph in PREFIXES
    }
    local = build(artifacts, "remote_graph_local", "1M", None)
    results: dict[str, Any] = {
        "machine": measured_on,
        "config": {
            "graphs": {g: {"nodes": s.num_nodes, "edges": s.num_edges} for g, s in stores.items()},
            "arch": "sage (random weights, the same for every archive)",
            "fanouts": list(FANOUTS),
            "batch": [BATCH, DELAY],
            "ids_per_request": list(IDS),
            "cluster": "3 primaries + 3 replicas, loopback",
            "remote_cache_mb": DEFAULT_CACHE_MB,
            "sized_cache_mb": SIZED_CACHE_MB,
            "block_size": args.block_size,
            "memory_only": args.memory_only,
            "pairs": args.pairs,
            "seconds": args.seconds,
            "zipf_seconds": args.zipf_seconds,
        },
    }
    with tempfile.TemporaryDirectory(prefix="remote-graph-") as tmp, cluster(Path(tmp)) as redis:
        results["load"] = {}
        for graph, prefix in PREFIXES.items():
            results["load"][graph] = load(redis, stores[graph], prefix, args.block_size)
            print(f"== load {graph}: {results['load'][graph]}", flush=True)
        folders = {
            "local": local,
            "remote": build(artifacts, "remote_graph_remote", "1M", f"{redis.url}/g1m"),
            "remote_10M": build(artifacts, "remote_graph_10M", "10M", f"{redis.url}/g10m"),
            "remote_sized": build(
                artifacts, "remote_graph_sized", "1M", f"{redis.url}/g1m", SIZED_CACHE_MB
            ),
            "remote_10M_sized": build(
                artifacts, "remote_graph_10M_sized", "10M", f"{redis.url}/g10m", SIZED_CACHE_MB
            ),
        }
        models = [f"{name}={folder.name}" for name, folder in folders.items()]
        payload = uniform_bodies(GRAPHS["1M"].nodes, 20_000)
        if not args.memory_only:
            remote = open_remote_store(
                redis.url, "g1m", stores["1M"].checksum, cache_mb=DEFAULT_CACHE_MB, timeout_ms=5000
            )
            views: dict[str, GraphStore | RemoteStore] = {"local": stores["1M"], "remote": remote}
            results["in_process"] = in_process(local, views, payload, args.rounds)
            remote.close()
            print(f"== in process: {results['in_process']}", flush=True)
        home = artifacts.work / "run" / "remote_graph"
        zipf = {
            "remote": stores["1M"].num_nodes,
            "remote_10M": stores["10M"].num_nodes,
            "remote_sized": stores["1M"].num_nodes,
            "remote_10M_sized": stores["10M"].num_nodes,
        }
        with servers.torchserve(home, artifacts.archives, models) as server:
            idle = idle_memory(server, list(zipf))
            if not args.memory_only:
                print(f"== served, {CONNECTIONS} connections then 1, batch {BATCH} / {DELAY} ms")
                results["served"], results["reads"] = pairs(
                    server, payload, args.pairs, args.seconds
                )
                print(f"== Redis reads of the remote pairs: {results['reads']}", flush=True)
                local_pss = memory_of(model_worker_pids(server, "local")).pss
                results["local_pss_mib"] = round(local_pss, 1)
            results["zipf"] = zipf_and_memory(server, zipf, args.zipf_seconds, idle)
    finish_run(results, started, steal, table, args.out)


if __name__ == "__main__":
    main()
