"""Two archives on one TorchServe measured side by side: warmed up alike, then closed-loop levels
in pairs whose order alternates, so that neither always runs first while the machine's load
drifts. The experiments that compare two ways of serving one graph share these steps."""

from __future__ import annotations

import json
from typing import Any

import requests

from bench.harness import loadgen
from bench.harness.watch import CpuWatch
from tests.servers.torchserve import TorchServe

CONNECTIONS = 32


def alternate(pair: tuple[str, str], round_index: int) -> tuple[str, str]:
    """``pair`` in order on even rounds and reversed on odd ones, so neither side always runs
    first (the overlay grows and the machine's background load drifts during a run)."""
    return pair if round_index % 2 == 0 else (pair[1], pair[0])


def level(
    target: loadgen.Target, concurrency: int, cpu: CpuWatch, seconds: float
) -> dict[str, Any]:
    """One closed-loop level: throughput, latency, errors, the worker's CPU per answer."""
    before = cpu.read()[0]
    result = loadgen.closed_loop(target, concurrency, seconds, int(seconds * 20_000), 180)
    worker_ms = 1000 * (cpu.read()[0] - before) / max(result.ok, 1)
    return {
        "throughput": result.throughput,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "ok": result.ok,
        "errors": result.errors,
        "error_kinds": result.error_kinds,
        "worker_cpu_ms_per_request": round(worker_ms, 4),
    }


def check_answers(url: str, auth: dict[str, str], body: bytes) -> None:
    """One request answered with one prediction per ID, before anything is measured."""
    answer = requests.post(url, data=body, headers=auth, timeout=60)
    asked = len(json.loads(body)["node_ids"])
    if answer.status_code != 200 or len(answer.json()["predictions"]) != asked:
        raise RuntimeError(f"{url}: {answer.status_code} {answer.text[:300]}")


def warmed_targets(
    server: TorchServe, systems: tuple[str, str], payload: list[bytes]
) -> tuple[dict[str, loadgen.Target], dict[str, CpuWatch]]:
    """Each archive's load target (named as its system) and CPU watch, after one checked
    answer and a 5 s warm-up at 32 connections each."""
    auth = server.auth("inference")
    targets = {
        name: loadgen.Target(f"{server.inference_url}/predictions/{name}", payload, auth)
        for name in systems
    }
    for target in targets.values():
        check_answers(target.url, auth, payload[0])
    cpu = {name: CpuWatch.of(server, name) for name in systems}
    for target in targets.values():
        loadgen.closed_loop(target, CONNECTIONS, 5.0, 100_000, timeout_s=180)
    return targets, cpu


def paired_levels(
    targets: dict[str, loadgen.Target],
    cpu: dict[str, CpuWatch],
    systems: tuple[str, str],
    pairs: int,
    seconds: float,
) -> list[dict[str, Any]]:
    """``pairs`` pairs at 32 connections, then at one, each printed as it ends."""
    levels: list[dict[str, Any]] = []
    for concurrency in (CONNECTIONS, 1):
        for pair in range(pairs):
            measured = {
                name: level(targets[name], concurrency, cpu[name], seconds)
                for name in alternate(systems, pair)
            }
            levels.append({"concurrency": concurrency, "pair": pair} | measured)
            print(
                f"    c={concurrency:<3} pair {pair}: "
                + " | ".join(
                    f"{name} {measured[name]['throughput']:7.1f} req/s p50 "
                    f"{measured[name]['p50_ms']:6.2f} p99 {measured[name]['p99_ms']:6.2f} ms"
                    for name in systems
                ),
                flush=True,
            )
    return levels
