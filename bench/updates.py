"""Live-update figures: update throughput, read latency under an update stream, overlay memory.

``python -m bench.updates`` on a synthetic graph (default 100,000 nodes, 1M edges, 128
features), in-process with the handler's own classes and the update log on disk (every
acknowledged update is fsync'd):

1. update throughput: single-operation requests, then 100-operation requests (operations/s);
2. read latency (p50/p99 of one-node requests, fanouts [10,10]) alone, then while a second
   process (another "worker") appends updates to the same log at a steady rate, which the
   reader replays before each request as a worker does;
3. overlay memory per million added edges (RSS growth of a process applying them).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

from graph_assets import generate_synthetic, open_store
from graph_assets.overlay import GraphOverlay
from handler.engine import NodeClassificationEngine
from handler.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from model import Arch, ModelConfig, build_model


def random_edges(rng: random.Random, nodes: int, count: int) -> list[dict]:
    return [
        {"type": "add_edge", "src": a, "dst": b}
        for a, b in ((rng.randrange(nodes), rng.randrange(nodes)) for _ in range(count))
        if a != b
    ]


def apply_ignoring_conflicts(live: LiveGraph, operations: list[dict]) -> int:
    """Applies ``operations`` as one request; a random duplicate edge is dropped, not fatal."""
    try:
        live.update(UpdateRequest(operations))
        return len(operations)
    except Exception:
        return 0


def throughput(store_dir: Path, log: Path, per_request: int, seconds: float) -> float:
    live = LiveGraph(open_store(store_dir), log)
    rng = random.Random(per_request)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += apply_ignoring_conflicts(live, random_edges(rng, live.store.num_nodes, per_request))
    return done / (time.perf_counter() - start)


def stream_updates(store_dir: str, log: str, rate: float, seconds: float) -> None:
    """The other worker: ``rate`` update requests per second (10 operations each)."""
    live = LiveGraph(open_store(Path(store_dir)), Path(log))
    rng = random.Random(99)
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        apply_ignoring_conflicts(live, random_edges(rng, live.store.num_nodes, 10))
        sent += 1
        pause = start + sent / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)


def read_latencies(store_dir: Path, log: Path, requests: int) -> list[float]:
    store = open_store(store_dir)
    live = LiveGraph(store, log)
    torch.manual_seed(0)
    config = ModelConfig(arch=Arch.SAGE, in_dim=store.feature_dim, out_dim=store.num_classes)
    settings = ServingSettings(fanouts=(10, 10))
    engine = NodeClassificationEngine(
        store, build_model(config), settings, torch.device("cpu"), "1.0", live=live
    )
    rng = random.Random(1)
    latencies = []
    for _ in range(requests):
        node = rng.randrange(store.num_nodes)
        start = time.perf_counter()
        (answer,) = engine.handle([{"body": {"node_id": node}}])
        latencies.append((time.perf_counter() - start) * 1000)
        assert answer.status == 200
    return latencies


def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {timeout_s} s")
        time.sleep(0.1)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))]


def percentiles(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.2f} ms, p99 {p99(values):.2f} ms"


def overlay_memory(store_dir: Path, edges: int) -> float:
    """MiB of RSS growth per million edges added to an overlay (no log: memory only)."""
    overlay = GraphOverlay(open_store(store_dir))
    rng = random.Random(5)
    process = psutil.Process()
    before = process.memory_info().rss
    seq = 0
    for _ in range(edges // 10_000):
        batch = random_edges(rng, overlay.base.num_nodes, 10_000)
        seq += 1
        try:
            overlay.apply(batch, seq)
        except ValueError:
            seq -= 1
    added = sum(len(v) for v in overlay.in_lists.values()) - sum(
        int(overlay.base.in_degree[n]) for n in overlay.in_lists
    )
    grown = (process.memory_info().rss - before) / (1 << 20)
    return grown / (added / 1_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput phase")
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--stream-rate", type=float, default=50.0, help="update requests/s")
    parser.add_argument("--memory-edges", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_dir = Path(tmp) / "store"
        generate_synthetic(args.nodes, args.edges, store_dir)
        print(f"graph: {args.nodes} nodes, {args.edges} edges, 128 features")
        for per_request in (1, 100):
            rate = throughput(
                store_dir, Path(tmp) / f"t{per_request}.log", per_request, args.seconds
            )
            print(f"update throughput, {per_request} operation(s) per request: {rate:,.0f} ops/s")
        quiet = read_latencies(store_dir, Path(tmp) / "quiet.log", args.reads)
        print(f"reads alone: {percentiles(quiet)}")
        log = Path(tmp) / "busy.log"
        LiveGraph(open_store(store_dir), log)  # create it before both sides open it
        stream = multiprocessing.get_context("spawn").Process(
            target=stream_updates, args=(str(store_dir), str(log), args.stream_rate, 600.0)
        )
        empty = log.stat().st_size
        stream.start()
        try:
            # The writer imports torch first (seconds): measure only once it is appending.
            wait_until(lambda: log.stat().st_size > empty, timeout_s=120)
            busy = read_latencies(store_dir, log, args.reads)
        finally:
            stream.terminate()
            stream.join()
        applied = LiveGraph(open_store(store_dir), log).overlay.seq
        if applied == 0:
            raise RuntimeError("the update stream wrote nothing: the reads were not under load")
        print(
            f"reads with {args.stream_rate:.0f} update requests/s (10 ops each) from another "
            f"process: {percentiles(busy)}; {applied} update requests in the log; "
            f"p50 ratio {statistics.median(busy) / statistics.median(quiet):.2f}, "
            f"p99 ratio {p99(busy) / p99(quiet):.2f}"
        )
        print(
            f"overlay memory: {overlay_memory(store_dir, args.memory_edges):.0f} MiB per million "
            "added edges"
        )


if __name__ == "__main__":
    main()
