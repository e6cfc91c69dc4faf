"""Soak test: a real TorchServe at moderate load, good and bad requests mixed, for N minutes.

    python -m bench.experiments.soak      # 10 minutes, builds its own archive from the demo graph
    python -m bench.experiments.soak --minutes 2 --archive model_store/gnn.mar

Starts its own server (tests/servers/torchserve.py: free loopback ports, private dirs, stopped
by PID), paces ``--rate`` requests/s over ``--connections`` keep-alive connections, and checks
every answer: a good request must get 200 with the same probabilities as at the start (the
sampler is deterministic), a bad one its own 4xx. Every ``--sample-every`` seconds it records
the RSS and open file descriptors of the frontend and of each worker. The verdict: no
unexpected answer, worker RSS growth (from the end of the warm-up to the end) under
``--max-rss-growth`` percent, and no file-descriptor growth. Exit status 1 when one fails.
Bounded: the run stops at ``--minutes`` (plus the server's start and stop).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import requests

from tests.servers.torchserve import ROOT, TorchServe, worker_processes

DEMO_IDS = range(2000)  # graph_assets/demo: integer IDs 0..1999


@dataclass(frozen=True)
class Probe:
    """One request of the mix and what it must get back."""

    kind: str
    body: bytes
    status: int
    node_ids: tuple[int, ...] = ()


def request_mix(rng: random.Random, max_ids: int) -> Probe:
    """About 80% good requests (one ID or a short list) and 20% bad ones of five kinds."""
    roll = rng.random()
    if roll < 0.5:
        node = rng.choice(DEMO_IDS)
        return Probe("single", json.dumps({"node_id": node}).encode(), 200, (node,))
    if roll < 0.8:
        nodes = tuple(rng.sample(DEMO_IDS, rng.randint(2, 8)))
        return Probe("list", json.dumps({"node_ids": list(nodes)}).encode(), 200, nodes)
    bad = [
        Probe("not-json", b'{"node_id": 4', 400),
        Probe("wrong-type", b'{"node_id": 1.5}', 400),
        Probe("unknown-id", json.dumps({"node_id": 10**9 + rng.randint(0, 999)}).encode(), 404),
        Probe("too-many", json.dumps({"node_ids": [1] * (max_ids + 1)}).encode(), 413),
        Probe("binary", bytes(rng.getrandbits(8) for _ in range(32)), 400),
    ]
    return rng.choice(bad)


@dataclass
class Tally:
    """What the clients saw, shared between threads under one lock."""

    statuses: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, status: int | str, seconds: float, problem: str | None) -> None:
        with self.lock:
            self.statuses[f"{kind} {status}"] += 1
            self.latencies.append(seconds)
            if problem is not None and len(self.unexpected) < 1000:
                self.unexpected.append(problem)


class Soak:
    """Clients and a sampler against one started server."""

    def __init__(self, server: TorchServe, args: argparse.Namespace) -> None:
        self.server = server
        self.args = args
        self.tally = Tally()
        self.reference: dict[int, list[float]] = {}
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def url(self) -> str:
        return f"{self.server.inference_url}/predictions/gnn"

    def take_reference(self) -> None:
        """Every demo node's probabilities once, before the soak starts (batches of 64)."""
        session = requests.Session()
        headers = {**self.server.auth("inference"), "Content-Type": "application/json"}
        nodes = list(DEMO_IDS)
        for start in range(0, len(nodes), 64):
            chunk = nodes[start : start + 64]
            body = json.dumps({"node_ids": chunk})
            response = session.post(self.url(), data=body, headers=headers, timeout=60)
            response.raise_for_status()
            for node, prediction in zip(chunk, response.json()["predictions"], strict=True):
                self.reference[node] = prediction["probabilities"]

    def judge(self, probe: Probe, response: requests.Response) -> str | None:
        if response.status_code != probe.status:
            return f"{probe.kind}: expected {probe.status}, got {response.status_code}"
        try:
            body = response.json()
        except ValueError:
            return f"{probe.kind}: the body is not JSON: {response.text[:100]!r}"
        if probe.status != 200:
            if body.get("code") != probe.status or not body.get("message"):
                return f"{probe.kind}: error body without code/message: {body}"
            return None
        predictions = [body] if probe.kind == "single" else body.get("predictions", [])
        got = [p.get("node_id") for p in predictions]
        if got != list(probe.node_ids):
            return f"{probe.kind}: answered nodes {got}, asked {list(probe.node_ids)}"
        for node, prediction in zip(probe.node_ids, predictions, strict=True):
            diff = np.abs(np.array(prediction["probabilities"]) - self.reference[node]).max()
            if diff > 1e-5:
                return f"{probe.kind}: node {node} differs from its first answer by {diff}"
        return None

    def client(self, index: int, deadline: float) -> None:
        rng = random.Random(index)
        headers = {**self.server.auth("inference"), "Content-Type": "application/json"}
        interval = self.args.connections / self.args.rate
        next_send = time.monotonic() + rng.random() * interval
        session = requests.Session()
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                time.sleep(max(0.0, next_send - time.monotonic()))
                next_send += interval
                probe = request_mix(rng, self.args.max_ids)
                start = time.monotonic()
                try:
                    response = session.post(
                        self.url(), data=probe.body, headers=headers, timeout=30
                    )
                except requests.RequestException as error:
                    failure = f"{probe.kind}: {error!r}"[:300]
                    self.tally.add(probe.kind, "error", time.monotonic() - start, failure)
                    session.close()
                    session = requests.Session()
                    continue
                seconds = time.monotonic() - start
                problem = self.judge(probe, response)
                self.tally.add(probe.kind, response.status_code, seconds, problem)
        finally:
            session.close()  # so that the last fd sample does not count our own connections

    def sample(self) -> dict[str, Any]:
        """RSS (MiB) and open fds of the frontend and of each worker, keyed by PID."""
        assert self.server.pid is not None
        processes = {"frontend": psutil.Process(self.server.pid)}
        processes |= {f"worker {w.pid}": w for w in worker_processes(self.server)}
        sample: dict[str, Any] = {"t": time.monotonic(), "processes": {}}
        for name, process in processes.items():
            try:
                sample["processes"][name] = {
                    "rss_mib": process.memory_info().rss / 2**20,
                    "fds": process.num_fds(),
                }
            except psutil.Error:
                continue
        return sample

    def sampler(self, deadline: float) -> None:
        while not self.stop.wait(self.args.sample_every) and time.monotonic() < deadline:
            self.samples.append(self.sample())

    def run(self) -> dict[str, Any]:
        self.take_reference()
        started = time.monotonic()
        deadline = started + self.args.minutes * 60
        warm_until = started + min(self.args.warmup, self.args.minutes * 60 / 3)
        threads = [
            threading.Thread(target=self.client, args=(i, deadline), daemon=True)
            for i in range(self.args.connections)
        ]
        threads.append(threading.Thread(target=self.sampler, args=(deadline,), daemon=True))
        for thread in threads:
            thread.start()
        try:
            while time.monotonic() < deadline:
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
                done = sum(self.tally.statuses.values())
                elapsed = time.monotonic() - started
                print(
                    f"  {elapsed:6.0f} s  {done} requests  {len(self.tally.unexpected)} unexpected",
                    flush=True,
                )
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=60)
        self.samples.append(self.sample())
        return self.verdict(started, warm_until)

    def verdict(self, started: float, warm_until: float) -> dict[str, Any]:
        baseline = next((s for s in self.samples if s["t"] >= warm_until), self.samples[0])
        final = self.samples[-1]
        growth = {}
        for name, end in final["processes"].items():
            begin = baseline["processes"].get(name)
            if begin is None:
                continue  # a process that started after the baseline (a restarted worker)
            growth[name] = {
                "rss_mib": [round(begin["rss_mib"], 1), round(end["rss_mib"], 1)],
                "rss_growth_pct": round(100 * (end["rss_mib"] / begin["rss_mib"] - 1), 2),
                "fds": [begin["fds"], end["fds"]],
            }
        workers_before = {n for n in baseline["processes"] if n.startswith("worker")}
        workers_after = {n for n in final["processes"] if n.startswith("worker")}
        latencies = np.array(self.tally.latencies) * 1000
        total = int(sum(self.tally.statuses.values()))
        duration = final["t"] - started
        worker_growth = [g["rss_growth_pct"] for n, g in growth.items() if n.startswith("worker")]
        fd_growth = [g["fds"][1] - g["fds"][0] for g in growth.values()]
        result = {
            "minutes": round(duration / 60, 2),
            "requests": total,
            "requests_per_s": round(total / duration, 1),
            "statuses": dict(sorted(self.tally.statuses.items())),
            "unexpected": len(self.tally.unexpected),
            "unexpected_examples": self.tally.unexpected[:10],
            "latency_ms": {
                "p50": round(float(np.percentile(latencies, 50)), 1),
                "p99": round(float(np.percentile(latencies, 99)), 1),
                "max": round(float(latencies.max()), 1),
            },
            "baseline_after_s": round(baseline["t"] - started, 1),
            "processes": growth,
            "workers_restarted": sorted(workers_before ^ workers_after),
            "max_worker_rss_growth_pct": max(worker_growth, default=0.0),
            "max_fd_growth": max(fd_growth, default=0),
        }
        result["passed"] = bool(
            result["unexpected"] == 0
            and not result["workers_restarted"]
            and result["max_worker_rss_growth_pct"] < self.args.max_rss_growth
            and result["max_fd_growth"] <= 0
        )
        return result


def build_archive(out: Path, workers: int) -> Path:
    """The demo graph, GraphSAGE with a short training run and the default fanouts."""
    command = [
        str(ROOT / "build_mar.sh"),
        "--epochs",
        "20",
        "--device",
        "cpu",
        "--min-workers",
        str(workers),
        "--max-workers",
        str(workers),
        "--export-path",
        str(out),
    ]
    print("==> building the soak archive:", " ".join(command), flush=True)
    subprocess.run(command, check=True, timeout=900, stdout=subprocess.DEVNULL)
    return out / "gnn.mar"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak")
    parser.add_argument("--rate", type=float, default=40.0, help="requests/s over all clients")
    parser.add_argument("--connections", type=int, default=8, help="client connections")
    parser.add_argument("--workers", type=int, default=2, help="workers of a built archive")
    parser.add_argument(
        "--archive", type=Path, help="serve this .mar (name gnn) instead of building one"
    )
    parser.add_argument("--max-ids", type=int, default=1024, help="the archive's max IDs")
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="seconds before the RSS baseline"
    )
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds per sample")
    parser.add_argument(
        "--max-rss-growth", type=float, default=5.0, help="allowed worker RSS growth, %%"
    )
    parser.add_argument("--json-out", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gnnserve-soak-") as tmp:
        home = Path(tmp)
        store = home / "model_store"
        store.mkdir()
        if args.archive:
            (store / "gnn.mar").symlink_to(args.archive.resolve())
        else:
            build_archive(store, args.workers)
        server = TorchServe(home=home / "server", model_store=store)
        try:
            print(f"==> starting TorchServe in {home / 'server'}", flush=True)
            server.start("gnn=gnn.mar")
            print(f"==> soaking for {args.minutes} min at {args.rate} requests/s", flush=True)
            result = Soak(server, args).run()
        finally:
            server.stop()
    print(json.dumps(result, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
