"""The benchmark suite: every system and baseline started and measured in one run.

    python -m bench.experiments.suite --profile quick   # `make bench`, under 10 minutes
    python -m bench.experiments.suite --profile full    # `make bench-full`

Experiments, in order: the in-process stage micro-benchmark; the serving floor (an echo archive
and our archive at several batch sizes, in one TorchServe, then the two back to back in pairs for
the floor target); latency and throughput per graph size
and fanouts; worker memory (total PSS) with 1, 2 and 4 workers; the FastAPI baselines (the seed
articles' whole-graph forward, and ``k_hop_subgraph``). Results go to one JSON file that
``python -m bench.report.benchmarks`` turns into docs/benchmarks.md's tables and plots.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments import microbench
from bench.harness import loadgen
from bench.harness.artifacts import GRAPHS, ROOT, ArchiveSpec, Artifacts
from bench.harness.watch import CpuWatch, host_steal, memory_of, steal_percent
from bench.systems import servers
from tests.servers.torchserve import TorchServe, graph_checksum, scale_workers, worker_pids

LEVELS = (1, 8, 32, 128)
CORES = os.cpu_count() or 1
_CDF_POINTS = np.linspace(0, 100, 201)


@dataclass(frozen=True)
class Profile:
    """How much of each experiment a run does."""

    name: str
    seconds: float  # per closed-loop level
    open_seconds: float
    batch_configs: tuple[tuple[int, int], ...]  # (batchSize, maxBatchDelay ms)
    size_levels: tuple[int, ...]
    seed_levels: tuple[int, ...]
    whole_graphs: tuple[str, ...]
    khop_graphs: tuple[str, ...]
    micro_graphs: tuple[str, ...]
    micro_batches: int
    memory_requests_per_worker: int
    warm_seconds: float  # unmeasured load on each model before its levels (JIT, caches, pages)
    floor_pairs: int  # echo and ours back to back at 32 connections, for the floor target

    @property
    def max_requests(self) -> int:
        return int(self.seconds * 20_000)


PROFILES = {
    "quick": Profile(
        name="quick",
        seconds=4.0,
        open_seconds=5.0,
        batch_configs=((16, 5), (1, 0), (32, 5)),
        size_levels=(1,),
        seed_levels=(1, 8),
        whole_graphs=("1M",),
        khop_graphs=("1M",),
        micro_graphs=("10M",),
        micro_batches=60,
        memory_requests_per_worker=12,
        warm_seconds=3.0,
        floor_pairs=3,
    ),
    "full": Profile(
        name="full",
        seconds=12.0,
        open_seconds=15.0,
        batch_configs=((16, 5), (1, 0), (4, 1), (8, 5), (32, 5), (32, 10), (64, 10)),
        size_levels=(1, 32),
        seed_levels=LEVELS,
        whole_graphs=("100K", "1M"),
        khop_graphs=("100K", "1M", "10M"),
        micro_graphs=("100K", "1M", "10M"),
        micro_batches=200,
        memory_requests_per_worker=16,
        warm_seconds=5.0,
        floor_pairs=5,
    ),
}


def bodies(num_nodes: int, count: int = 20_000, seed: int = 1) -> list[bytes]:
    """Single-node requests for uniformly random nodes (IDs are 0..N-1 in synthetic graphs)."""
    rng = np.random.default_rng(seed)
    return [b'{"node_id": %d}' % int(n) for n in rng.integers(0, num_nodes, count)]


def list_bodies(num_nodes: int, count: int, ids: int, seed: int = 2) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [
        json.dumps({"node_ids": rng.integers(0, num_nodes, ids).tolist()}).encode()
        for _ in range(count)
    ]


def finish_run(
    results: dict[str, Any],
    started: float,
    steal: tuple[int, int],
    table: Callable[[dict[str, Any]], str],
    out: Path | None,
) -> None:
    """Ends an experiment the same way everywhere: the host's steal and the run's time
    (``started``: ``time.perf_counter()``) recorded, the table printed, the JSON written."""
    results["steal_percent"] = steal_percent(steal)
    results["run_s"] = round(time.perf_counter() - started, 1)
    print(table(results), flush=True)
    print(f"(run took {results['run_s']} s; steal {results['steal_percent']}%)", flush=True)
    if out:
        out.write_text(json.dumps(results, indent=2) + "\n")


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and how busy the machine was."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_start": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


class Suite:
    """Runs a profile's experiments and collects their results."""

    def __init__(self, profile: Profile, work: Path) -> None:
        self.profile = profile
        self.work = work
        self.artifacts = Artifacts(work)
        self.results: dict[str, Any] = {
            "profile": profile.name,
            "machine": machine(),
            "micro": [],
            "load": [],
            "memory": [],
            "checks": [],
        }

    def level(
        self,
        system: str,
        target: loadgen.Target,
        concurrency: int,
        cpu: CpuWatch | None = None,
        **labels: Any,
    ) -> loadgen.LevelResult:
        """One closed-loop level, recorded as ``system`` with ``labels``; with ``cpu``, also the
        CPU time the model's workers and the frontend spent per answered request."""
        p = self.profile
        before = cpu.read() if cpu else None
        ticks = host_steal()
        result = loadgen.closed_loop(target, concurrency, p.seconds, p.max_requests, timeout_s=180)
        labels["steal_pct"] = steal_percent(ticks)
        if cpu and before and result.ok:
            workers, frontend = (now - then for now, then in zip(cpu.read(), before, strict=True))
            labels["worker_cpu_ms_per_request"] = round(1000 * workers / result.ok, 4)
            labels["frontend_cpu_ms_per_request"] = round(1000 * frontend / result.ok, 4)
        self._record(system, result, labels)
        return result

    def warm(self, target: loadgen.Target, concurrency: int, seconds: float) -> None:
        """Unmeasured load first: TorchServe's JVM compiles its hot paths during the first
        seconds of traffic (echo gained 30% between two runs a minute apart without this)."""
        loadgen.closed_loop(target, concurrency, seconds, self.profile.max_requests, timeout_s=180)

    def _record(self, system: str, result: loadgen.LevelResult, labels: dict[str, Any]) -> None:
        row = {"system": system, **labels, **result.summary()}
        latencies = result.latencies_ms or [float("nan")]
        row["cdf_ms"] = np.percentile(latencies, _CDF_POINTS).round(3).tolist()
        self.results["load"].append(row)
        print(
            f"    {system:<28} c={result.concurrency:<4} {result.throughput:8.1f} req/s  "
            f"p50 {result.p50_ms:7.2f}  p99 {result.p99_ms:8.2f} ms  errors {result.errors}",
            flush=True,
        )

    def micro(self) -> None:
        print("== in-process stage micro-benchmark", flush=True)
        model = self.artifacts.model_dir()
        runs = [(g, f, 1) for g in self.profile.micro_graphs for f in ((10, 10), (25, 10))]
        # Two threads on two shared cores: shows why workers default to one (spin-waits stall).
        runs.append(("10M", (10, 10), 2))
        stores = {graph: self.artifacts.store(graph) for graph, _, _ in runs}
        # A graph generated just now leaves up to ~1 GB of dirty pages: write them back before
        # timing, not while the timed stages share the two cores with the writeback.
        os.sync()
        for graph, fanouts, threads in runs:
            ticks = host_steal()
            rows = microbench.benchmark(
                stores[graph],
                model,
                graph,
                fanouts,
                threads,
                batches=self.profile.micro_batches,
            )
            steal = steal_percent(ticks)
            print(microbench.format_rows(rows), f"\n  host steal {steal}%", flush=True)
            self.results["micro"] += [asdict(row) | {"steal_pct": steal} for row in rows]
        torch.set_num_threads(os.cpu_count() or 1)

    def floor(self) -> None:
        """Echo archive vs ours at several batch sizes, all in one TorchServe, 1M edges."""
        print("== serving floor and batching (1M edges, SAGE [10,10])", flush=True)
        batch, delay = 16, 5
        echo = self.artifacts.echo_archive(batch, delay)
        specs = [ArchiveSpec("1M", (10, 10), b, d) for b, d in self.profile.batch_configs]
        # torch's default threads (one per core), as before torch_threads existed.
        specs.append(ArchiveSpec("1M", (10, 10), batch, delay, torch_threads=0))
        mars = [self.artifacts.gnn_archive(spec) for spec in specs]
        models = [f"echo={echo.name}"]
        models += [f"{s.name}={m.name}" for s, m in zip(specs, mars, strict=True)]
        payload = bodies(GRAPHS["1M"].nodes)
        home = self.work / "run" / "floor"
        with servers.torchserve(home, self.artifacts.archives, models) as server:
            self._check_graph(server, specs[0].name, "1M")
            auth = server.auth("inference")
            echo_target = loadgen.Target(f"{server.inference_url}/predictions/echo", payload, auth)
            targets = {
                spec: loadgen.Target(
                    f"{server.inference_url}/predictions/{spec.name}", payload, auth
                )
                for spec in specs
            }
            for target in (echo_target, *targets.values()):
                self.warm(target, 32, self.profile.warm_seconds)
            echo_cpu = CpuWatch.of(server, "echo")
            for concurrency in LEVELS:
                self.level(
                    "echo", echo_target, concurrency, echo_cpu, graph="1M", batch=batch, delay=delay
                )
            peak = 0.0
            for spec, target in targets.items():
                spec_cpu = CpuWatch.of(server, spec.name)
                for concurrency in LEVELS:
                    result = self.level(
                        "gnnserve",
                        target,
                        concurrency,
                        spec_cpu,
                        graph="1M",
                        fanouts=list(spec.fanouts),
                        batch=spec.batch_size,
                        delay=spec.max_batch_delay_ms,
                        threads=spec.torch_threads,
                    )
                    if spec == specs[0]:
                        peak = max(peak, result.throughput)
            main_name = specs[0].name
            main_cpu = CpuWatch.of(server, main_name)
            pair = {"graph": "1M", "batch": batch, "delay": delay}
            self._floor_pairs(echo_target, echo_cpu, targets[specs[0]], main_cpu, **pair)
            # One worker per core for both: the worker no longer idles while the frontend
            # hands it the next batch (TorchServe's own default is one worker per core).
            for model in ("echo", main_name):
                scale_workers(server, model, CORES)
            per_core: list[tuple[str, str, loadgen.Target, dict[str, Any]]] = [
                ("echo", "echo", echo_target, {}),
                ("gnnserve", main_name, targets[specs[0]], {"fanouts": [10, 10], "threads": 1}),
            ]
            for system, model, target, labels in per_core:
                self.warm(target, 32, self.profile.warm_seconds)
                labels |= {"graph": "1M", "batch": batch, "delay": delay, "workers": CORES}
                self.level(system, target, 32, CpuWatch.of(server, model), **labels)
            for model in ("echo", main_name):
                scale_workers(server, model, 1)
            # Open loop at 60% of our peak: latency from the scheduled send time.
            rate = round(0.6 * peak, -1)
            main = f"{server.inference_url}/predictions/{specs[0].name}"
            for system, url in (("echo", echo_target.url), ("gnnserve", main)):
                result = loadgen.open_loop(
                    loadgen.Target(url, payload, auth), rate, self.profile.open_seconds
                )
                labels = {"graph": "1M", "batch": batch, "delay": delay, "fanouts": [10, 10]}
                self._record(system, result, labels)

    def _floor_pairs(
        self,
        echo: loadgen.Target,
        echo_cpu: CpuWatch,
        ours: loadgen.Target,
        ours_cpu: CpuWatch,
        **labels: Any,
    ) -> None:
        """The floor target's levels, measured in pairs: echo then ours at 32 connections, back
        to back, so that both see the same phase of a machine whose speed drifts within minutes
        (the sweep above measures all of echo's levels before any of ours)."""
        labels["experiment"] = "floor_pairs"
        for pair in range(self.profile.floor_pairs):
            self.level("echo", echo, 32, echo_cpu, pair=pair, **labels)
            self.level(
                "gnnserve", ours, 32, ours_cpu, pair=pair, fanouts=[10, 10], threads=1, **labels
            )

    def sizes(self) -> None:
        """Latency per graph size and fanouts (batch 16 / 5 ms, and batch 1 for [10,10])."""
        print("== graph size and fanouts", flush=True)
        specs = [
            ArchiveSpec(graph, fanouts, 16, 5)
            for graph in ("100K", "1M", "10M")
            for fanouts in ((10, 10), (25, 10))
        ]
        specs += [ArchiveSpec(graph, (10, 10), 1, 0) for graph in ("100K", "1M", "10M")]
        mars = [self.artifacts.gnn_archive(spec) for spec in specs]
        models = [f"{s.name}={m.name}" for s, m in zip(specs, mars, strict=True)]
        with servers.torchserve(self.work / "run" / "sizes", self.artifacts.archives, models) as ts:
            auth = ts.auth("inference")
            for spec in specs:
                target = loadgen.Target(
                    f"{ts.inference_url}/predictions/{spec.name}",
                    bodies(GRAPHS[spec.graph].nodes),
                    auth,
                )
                self.warm(target, 8, 1.0)
                for concurrency in self.profile.size_levels:
                    self.level(
                        "gnnserve",
                        target,
                        concurrency,
                        graph=spec.graph,
                        fanouts=list(spec.fanouts),
                        batch=spec.batch_size,
                        delay=spec.max_batch_delay_ms,
                        experiment="sizes",
                    )

    def memory(self) -> None:
        """Total PSS of the workers with 1, 2 and 4 workers, on 1.13 GB of features, with
        workers forked from a zygote (the default) and as plain interpreters."""
        print("== worker memory (PSS), graph with 1.13 GB of features", flush=True)
        spec = ArchiveSpec("mem", (10, 10), 16, 5)
        mar = self.artifacts.gnn_archive(spec)
        for mode in ("prefork", "plain"):
            self._memory(mar, mode)

    def _memory(self, mar: Path, mode: str) -> None:
        print(f"  workers: {mode}", flush=True)
        home = self.work / "run" / f"memory-{mode}"
        graph = GRAPHS["mem"]
        models = [f"gnn={mar.name}"]
        prefork = mode == "prefork"
        with servers.torchserve(home, self.artifacts.archives, models, prefork) as server:
            auth = server.auth("inference")
            url = f"{server.inference_url}/predictions/gnn"
            for workers in (1, 2, 4):
                scale_workers(server, "gnn", workers)
                pids = worker_pids(server)
                idle = memory_of(pids)
                # Requests of 1024 random seeds touch ~100K feature rows each, so every worker
                # maps nearly all feature pages: the case where copies per worker would show.
                count = self.profile.memory_requests_per_worker * workers
                target = loadgen.Target(url, list_bodies(graph.nodes, count, 1024), auth)
                result = loadgen.closed_loop(target, 2 * workers, 300, count, timeout_s=300)
                loaded = memory_of(worker_pids(server))
                row = {
                    "mode": mode,
                    "workers": workers,
                    "feature_bytes": graph.feature_bytes,
                    "idle": asdict(idle),
                    "loaded": asdict(loaded),
                    "warm_requests": result.ok,
                    "warm_errors": result.errors,
                }
                self.results["memory"].append(row)
                print(
                    f"    {workers} worker(s), {idle.processes} processes: PSS idle "
                    f"{idle.pss:7.0f} MiB, after load "
                    f"{loaded.pss:7.0f} MiB (anon {loaded.pss_anon:.0f}, file "
                    f"{loaded.pss_file:.0f}); {result.ok} requests, {result.errors} errors",
                    flush=True,
                )

    def baselines(self) -> None:
        """The FastAPI designs, on the same stores and weights."""
        print("== FastAPI baselines", flush=True)
        model = self.artifacts.model_dir()
        # torch's default threads (as the seed articles run it), and one thread like our workers.
        runs = [("whole", g, 0) for g in self.profile.whole_graphs]
        runs += [("khop", g, 0) for g in self.profile.khop_graphs]
        runs += [("whole", "1M", 1), ("khop", "1M", 1)]
        for mode, graph, threads in runs:
            env = {
                "GNNSERVE_BENCH_MODE": mode,
                "GNNSERVE_BENCH_STORE": str(self.artifacts.store(graph)),
                "GNNSERVE_BENCH_MODEL": str(model),
                "GNNSERVE_BENCH_THREADS": str(threads or ""),
            }
            log = self.work / "logs" / f"uvicorn-{mode}-{graph}-t{threads}.log"
            with servers.uvicorn(env, log) as app:
                target = loadgen.Target(f"{app.url}/predict/node", bodies(GRAPHS[graph].nodes), {})
                self.warm(target, 1, 1.0)
                for concurrency in self.profile.seed_levels:
                    labels: dict[str, Any] = {
                        "graph": graph,
                        "fanouts": [-1, -1],
                        "threads": threads,
                    }
                    self.level(f"fastapi-{mode}", target, concurrency, **labels)

    def _check_graph(self, server: TorchServe, model: str, graph: str) -> None:
        """The archive serves the very graph the baselines load (same synthetic seed)."""
        served, local = graph_checksum(server, model), self.artifacts.checksum(graph)
        self.results["checks"].append({"model": model, "served": served, "local": local})
        if served != local:
            raise RuntimeError(f"{model} serves graph {served}, the baselines load {local}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench-results")
    parser.add_argument(
        "--only",
        nargs="*",
        choices=("micro", "floor", "sizes", "memory", "baselines"),
        help="run only these experiments (default: all)",
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so every server is stopped by its `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    suite = Suite(PROFILES[args.profile], args.work)
    started, ticks = time.monotonic(), host_steal()
    for name in args.only or ("micro", "floor", "sizes", "memory", "baselines"):
        getattr(suite, name)()
    suite.results["seconds"] = round(time.monotonic() - started, 1)
    suite.results["steal_pct"] = steal_percent(ticks)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"results-{args.profile}.json"
    out.write_text(json.dumps(suite.results, indent=1))
    print(f"wrote {out} ({suite.results['seconds']} s)")


if __name__ == "__main__":
    main()
