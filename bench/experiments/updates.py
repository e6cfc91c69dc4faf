"""Live-update figures: update throughput, read latency under an update stream, overlay memory.

``python -m bench.experiments.updates`` on a synthetic graph (default 100,000 nodes, 1M edges,
128 features), in-process with the handler's own classes and the update log on disk (every
acknowledged update is fsync'd):

1. update throughput: single-operation requests, then 100-operation requests (operations/s);
2. read latency (p50/p99 of one-node requests, fanouts [10,10], one worker) on a log that
   already holds ``--prefill`` update requests, first alone ("quiet"), then while a second
   process (another "worker") appends 10-edge update requests at a steady rate ("busy"). Each
   phase runs in two modes: closed loop (the next request as soon as the last one is answered,
   so the worker is never idle) and open loop (``--read-rate`` requests/s on average, arriving
   at random as independent clients send them; latency counts from each request's arrival, so
   a request that waits for the one before also pays for the wait: no coordinated omission).
   Each mode runs with the follower thread off (every batch replays what was appended) and on
   (as the handler runs it);
3. overlay memory per million added edges (RSS growth of a process applying them).

The quiet phases read the same prefilled log as the busy ones: once a graph has any update, reads
take the overlay's path (slower than the base graph's), so a quiet phase on an empty log would
count that path as interference from the stream. The base-graph figure is printed for reference.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import numpy as np
import psutil
import torch

from bench.harness.paired import alternate
from graph_assets import GraphStore, generate_synthetic, open_store
from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
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


def throughput(live: LiveGraph, per_request: int, seconds: float) -> float:
    """Operations per second that one writer gets acknowledged, for ``seconds``."""
    rng = random.Random(per_request)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += apply_ignoring_conflicts(live, random_edges(rng, live.store.num_nodes, per_request))
    return done / (time.perf_counter() - start)


def stream_updates(
    store_dir: str, log: str, rate: float, running: EventType, seconds: float
) -> None:
    """The other worker: while ``running`` is set, ``rate`` update requests per second (10
    operations each); ends after ``seconds`` if nobody stops it."""
    live = LiveGraph(open_store(Path(store_dir)), Path(log))
    rng = random.Random(99)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running.wait(timeout=0.1):
            continue
        start, sent = time.perf_counter(), 0
        while running.is_set():
            apply_ignoring_conflicts(live, random_edges(rng, live.store.num_nodes, 10))
            sent += 1
            pause = start + sent / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)


@dataclass(frozen=True)
class ReadMode:
    """How reads are sent: closed loop (``rate`` None: ``reads`` back to back) or open loop
    (``reads`` arriving at random, ``rate`` per second on average)."""

    reads: int
    rate: float | None = None

    def describe(self) -> str:
        if self.rate is None:
            return "closed loop"
        return f"open loop {self.rate:.0f}/s"


def reader(
    store: GraphStore, model: torch.nn.Module, log: Path | None, follow_ms: float
) -> tuple[NodeClassificationEngine, LiveGraph | None]:
    """One worker's engine over the log (None: the base graph alone), follower on or off."""
    live = LiveGraph(store, log, follow_interval_s=follow_ms / 1000) if log is not None else None
    settings = ServingSettings(fanouts=(10, 10))
    engine = NodeClassificationEngine.create(
        store, model, settings, torch.device("cpu"), "1.0", live=live
    )
    return engine, live


def read_latencies(engine: NodeClassificationEngine, mode: ReadMode) -> list[float]:
    """Milliseconds per one-node request, after 50 warm-up requests.

    Open loop: arrivals are a Poisson process (exponential gaps), so reads do not lock into
    step with the writer's fixed schedule, which would hide or exaggerate their collisions;
    latency counts from the arrival time, so a request that had to wait pays for it.
    """
    rng, arrivals = random.Random(1), random.Random(2)
    num_nodes = engine.store.num_nodes
    for _ in range(50):
        engine.handle([{"body": {"node_id": rng.randrange(num_nodes)}}])
    latencies = []
    arrival = time.perf_counter()
    for _ in range(mode.reads):
        node = rng.randrange(num_nodes)
        if mode.rate is None:
            arrival = time.perf_counter()
        else:
            arrival += arrivals.expovariate(mode.rate)
            pause = arrival - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        (answer,) = engine.handle([{"body": {"node_id": node}}])
        latencies.append((time.perf_counter() - arrival) * 1000)
        assert answer.status == 200
    return latencies


Results = dict[tuple[str, str, str], list[float]]  # (load, mode, follower) -> latencies


def set_load(running: EventType, log: Path, load: str) -> None:
    """Pauses the writer (quiet) or resumes it and waits for its next append (busy)."""
    if load == "quiet":
        running.clear()
        time.sleep(0.05)  # lets an append in flight finish
        return
    size = log.stat().st_size
    running.set()
    wait_until(lambda: log.stat().st_size > size, timeout_s=120)


def measure_reads(
    store: GraphStore,
    model: torch.nn.Module,
    log: Path,
    modes: list[ReadMode],
    rounds: int,
    follow_ms: float,
    running: EventType,
) -> Results:
    """Every (load, mode, follower) in ``rounds`` interleaved blocks of reads, each on a fresh
    worker whose follower is stopped before the next block starts."""
    results: Results = {}
    for round_index in range(rounds):
        for load in alternate(("quiet", "busy"), round_index):
            set_load(running, log, load)
            for mode in modes:
                for follower in alternate(("off", "on"), round_index):
                    engine, live = reader(store, model, log, follow_ms if follower == "on" else 0)
                    block = ReadMode(max(1, mode.reads // rounds), mode.rate)
                    try:
                        latencies = read_latencies(engine, block)
                    finally:
                        assert live is not None
                        live.close()
                    results.setdefault((load, mode.describe(), follower), []).extend(latencies)
    running.clear()
    return results


def prefill(store_dir: Path, log: Path, requests: int) -> None:
    """``requests`` 10-edge update requests, as a log a serving worker has been taking."""
    live = LiveGraph(open_store(store_dir), log)
    rng = random.Random(7)
    for _ in range(requests):
        apply_ignoring_conflicts(live, random_edges(rng, live.store.num_nodes, 10))
    live.close()


def logged_requests(store_dir: Path, log: Path) -> int:
    live = LiveGraph(open_store(store_dir), log)
    live.close()
    return live.overlay.seq


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


def latency_table(results: Results) -> list[str]:
    """One line per (mode, follower): quiet and busy p50/p99 and the busy/quiet ratios."""
    lines = [
        f"{'mode':<18}{'follower':<10}{'quiet p50/p99 ms':<19}{'busy p50/p99 ms':<18}"
        "ratio p50/p99 (goal <= 1.5)"
    ]
    for load, mode, follower in results:
        if load != "quiet":
            continue
        alone, loaded = results[load, mode, follower], results["busy", mode, follower]
        quiet_p50, busy_p50 = statistics.median(alone), statistics.median(loaded)
        lines.append(
            f"{mode:<18}{follower:<10}{quiet_p50:>6.2f} / {p99(alone):<8.2f}"
            f"{busy_p50:>6.2f} / {p99(loaded):<7.2f}"
            f"{busy_p50 / quiet_p50:>6.2f} / {p99(loaded) / p99(alone):.2f}"
        )
    return lines


def overlay_memory(store_dir: Path, edges: int) -> float:
    """MiB of RSS growth per million edges added to an overlay (no log: memory only)."""
    store = open_store(store_dir)
    overlay = GraphOverlay(store)
    rng = random.Random(5)
    process = psutil.Process()
    before = process.memory_info().rss
    seq = 0
    for _ in range(edges // 10_000):
        batch = random_edges(rng, store.num_nodes, 10_000)
        seq += 1
        try:
            overlay.apply(decode_operations(batch, store), seq)
        except ValueError:
            seq -= 1
    dirty = np.fromiter(overlay.changed_sources, dtype=np.int64)
    added = sum(len(v) for v in overlay.changed_sources.values()) - int(
        overlay.base.in_lists(dirty).indptr[-1]
    )
    grown = (process.memory_info().rss - before) / (1 << 20)
    return grown / (added / 1_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput phase")
    parser.add_argument(
        "--reads", type=int, default=2000, help="closed loop: reads per (load, follower)"
    )
    parser.add_argument(
        "--open-reads", type=int, default=2000, help="open loop: reads per (load, follower)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds the reads are split into"
    )
    parser.add_argument(
        "--read-rate", type=float, default=100.0, help="open loop: read requests/s, one worker"
    )
    parser.add_argument("--stream-rate", type=float, default=50.0, help="update requests/s")
    parser.add_argument(
        "--prefill", type=int, default=500, help="update requests in the log before any read"
    )
    parser.add_argument(
        "--follow-ms",
        type=float,
        default=ServingSettings().update_follow_interval_ms,
        help="follower poll interval when on (the handler's default)",
    )
    parser.add_argument("--memory-edges", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_dir = Path(tmp) / "store"
        generate_synthetic(args.nodes, args.edges, store_dir)
        print(f"graph: {args.nodes} nodes, {args.edges} edges, 128 features")
        for per_request in (1, 100):
            live = LiveGraph(open_store(store_dir), Path(tmp) / f"t{per_request}.log")
            rate = throughput(live, per_request, args.seconds)
            print(f"update throughput, {per_request} operation(s) per request: {rate:,.0f} ops/s")
        store = open_store(store_dir)
        torch.manual_seed(0)
        config = ModelConfig(arch=Arch.SAGE, in_dim=store.feature_dim, out_dim=store.num_classes)
        model = build_model(config)
        modes = [ReadMode(args.reads), ReadMode(args.open_reads, args.read_rate)]
        engine, _ = reader(store, model, None, 0)
        base = read_latencies(engine, modes[0])
        print(f"reads on the base graph, no update ever (closed loop): {percentiles(base)}")
        log = Path(tmp) / "updates.log"
        prefill(store_dir, log, args.prefill)
        spawn = multiprocessing.get_context("spawn")
        running = spawn.Event()
        stream = spawn.Process(
            target=stream_updates,
            args=(str(store_dir), str(log), args.stream_rate, running, 3600.0),
        )
        stream.start()
        try:
            # The writer imports torch first (seconds): the busy blocks wait for its appends.
            results = measure_reads(store, model, log, modes, args.rounds, args.follow_ms, running)
        finally:
            stream.terminate()
            stream.join()
        streamed = logged_requests(store_dir, log) - args.prefill
        if streamed <= 0:
            raise RuntimeError("the update stream wrote nothing: the reads were not under load")
        print(
            f"one worker, one-node reads, {args.rounds} interleaved rounds; log prefilled with "
            f"{args.prefill} update requests; busy = {args.stream_rate:.0f} update requests/s "
            f"(10 add_edge each) from another process ({streamed} appended in the busy blocks); "
            f"follower on = polls every {args.follow_ms:g} ms"
        )
        for line in latency_table(results):
            print(line)
        busy = results["busy", modes[0].describe(), "on"]
        print(
            "busy (closed loop, follower on) against the base graph with no update ever, i.e. "
            "with the overlay's own cost counted as interference: p50 ratio "
            f"{statistics.median(busy) / statistics.median(base):.2f}, "
            f"p99 ratio {p99(busy) / p99(base):.2f}"
        )
        # In a fresh process: this one's allocator holds memory freed by the phases above, which
        # the overlay would reuse without growing the RSS.
        with spawn.Pool(1) as pool:
            memory = pool.apply(overlay_memory, (store_dir, args.memory_edges))
        print(f"overlay memory: {memory:.0f} MiB per million added edges")


if __name__ == "__main__":
    main()
