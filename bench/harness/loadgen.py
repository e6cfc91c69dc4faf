"""HTTP load generator (asyncio + aiohttp) with latency accounting free of coordinated omission.

Two loops, both bounded by a request count and a deadline:

- closed loop (:func:`closed_loop`): ``concurrency`` connections, each sending its next request
  as soon as the previous answer arrives. A connection never waits on its own schedule, so the
  latency of a request is the time from its send to its last response byte. Throughput is
  answered requests over the time until the last answer.
- open loop (:func:`open_loop`): requests are *scheduled* at a fixed rate whatever the server
  does, and latency is counted from the scheduled send time, not the actual one: a request held
  back because every connection was busy is charged for its wait (wrk2's correction). This is
  the loop whose p99 is honest when the server stalls.

Requests still in flight when the deadline passes are awaited (up to the per-request timeout)
and counted; a request that times out counts as an error, never silently dropped.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np


@dataclass(frozen=True)
class Target:
    """Where to send and what: ``bodies`` are JSON bytes, cycled in order."""

    url: str
    bodies: Sequence[bytes]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class LevelResult:
    """One load level: counts, throughput, latency percentiles (ms) and the raw latencies.

    ``client_cpu_s`` is the load generator's own CPU time in the level, since it shares the
    machine with the server under test.
    """

    mode: str
    concurrency: int
    offered_rate: float | None
    sent: int
    ok: int
    errors: int
    error_kinds: dict[str, int]
    seconds: float
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    client_cpu_s: float
    latencies_ms: list[float]

    def summary(self) -> dict[str, object]:
        """Everything but the raw latencies (for tables and JSON)."""
        data = dict(self.__dict__)
        data.pop("latencies_ms")
        return data


class _Recorder:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.sent = 0
        self.last_done = 0.0

    def done(self, started: float, status: int | None, kind: str = "") -> None:
        now = time.perf_counter()
        self.last_done = max(self.last_done, now)
        if status is not None and 200 <= status < 300:
            self.latencies.append((now - started) * 1e3)
        else:
            self.errors[kind or f"http_{status}"] += 1


async def _send(
    session: aiohttp.ClientSession, target: Target, body: bytes, started: float, rec: _Recorder
) -> None:
    rec.sent += 1
    try:
        async with session.post(target.url, data=body, headers=target.headers) as response:
            await response.read()
            rec.done(started, response.status)
    except asyncio.TimeoutError:
        rec.done(started, None, "timeout")
    except aiohttp.ClientError as error:
        rec.done(started, None, type(error).__name__)


def _session(concurrency: int, timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"Content-Type": "application/json"},
    )


async def _closed(
    target: Target, concurrency: int, seconds: float, max_requests: int, timeout_s: float
) -> tuple[_Recorder, float]:
    rec = _Recorder()
    counter = iter(range(max_requests))
    async with _session(concurrency, timeout_s) as session:
        start = time.perf_counter()
        deadline = start + seconds

        async def connection() -> None:
            for index in counter:
                if time.perf_counter() >= deadline:
                    return
                body = target.bodies[index % len(target.bodies)]
                await _send(session, target, body, time.perf_counter(), rec)

        await asyncio.gather(*(connection() for _ in range(concurrency)))
    return rec, start


async def _open(
    target: Target, rate: float, concurrency: int, seconds: float, timeout_s: float
) -> tuple[_Recorder, float]:
    rec = _Recorder()
    count = max(1, int(rate * seconds))
    async with _session(concurrency, timeout_s) as session:
        start = time.perf_counter()
        tasks = []
        for index in range(count):
            scheduled = start + index / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = target.bodies[index % len(target.bodies)]
            tasks.append(asyncio.create_task(_send(session, target, body, scheduled, rec)))
        await asyncio.gather(*tasks)
    return rec, start


def _result(
    mode: str,
    concurrency: int,
    rate: float | None,
    rec: _Recorder,
    start: float,
    cpu_before: float,
) -> LevelResult:
    seconds = max(rec.last_done - start, 1e-9)
    lat = np.array(rec.latencies) if rec.latencies else np.array([float("nan")])
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return LevelResult(
        mode=mode,
        concurrency=concurrency,
        offered_rate=rate,
        sent=rec.sent,
        ok=len(rec.latencies),
        errors=sum(rec.errors.values()),
        error_kinds=dict(rec.errors),
        seconds=seconds,
        throughput=len(rec.latencies) / seconds,
        p50_ms=float(p50),
        p95_ms=float(p95),
        p99_ms=float(p99),
        max_ms=float(np.max(lat)),
        client_cpu_s=_cpu_seconds() - cpu_before,
        latencies_ms=rec.latencies,
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def closed_loop(
    target: Target,
    concurrency: int,
    seconds: float,
    max_requests: int,
    timeout_s: float = 60.0,
) -> LevelResult:
    """``concurrency`` connections back to back for ``seconds`` or ``max_requests`` sends."""
    cpu = _cpu_seconds()
    rec, start = asyncio.run(_closed(target, concurrency, seconds, max_requests, timeout_s))
    return _result("closed", concurrency, None, rec, start, cpu)


def open_loop(
    target: Target,
    rate: float,
    seconds: float,
    concurrency: int = 256,
    timeout_s: float = 60.0,
) -> LevelResult:
    """``rate * seconds`` requests scheduled at a fixed rate; latency from the scheduled time.

    ``concurrency`` caps open connections; a request waiting for one is charged for the wait.
    """
    cpu = _cpu_seconds()
    rec, start = asyncio.run(_open(target, rate, concurrency, seconds, timeout_s))
    return _result("open", concurrency, rate, rec, start, cpu)
