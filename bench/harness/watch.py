"""What a measurement cost besides its own numbers: the servers' CPU time and memory, and the
CPU time the hypervisor gave to other guests (a shared VM's speed drifts within minutes)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.servers.torchserve import TorchServe, model_worker_pids


def host_steal() -> tuple[int, int]:
    """(steal, all) CPU ticks of this VM since boot, from /proc/stat: steal is time the
    hypervisor ran other guests while ours wanted the CPU, the drift this page's caveat is about."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return ticks[7], sum(ticks)


def steal_percent(before: tuple[int, int]) -> float:
    """Share of the CPU ticks since ``before`` that the hypervisor stole, in percent."""
    steal, total = host_steal()
    return round(100 * (steal - before[0]) / max(total - before[1], 1), 1)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (vanished ones count 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


@dataclass(frozen=True)
class CpuWatch:
    """A model's worker processes and the frontend, whose CPU time a level accounts for."""

    workers: list[int]
    frontend: int

    @classmethod
    def of(cls, server: TorchServe, model: str) -> CpuWatch:
        assert server.pid is not None
        return cls(model_worker_pids(server, model), server.pid)

    def read(self) -> tuple[float, float]:
        return cpu_seconds(self.workers), cpu_seconds([self.frontend])


@dataclass(frozen=True)
class Memory:
    """Sums over processes of ``/proc/<pid>/smaps_rollup`` fields, in MiB."""

    processes: int
    pss: float
    pss_anon: float
    pss_file: float
    rss: float


def memory_of(pids: list[int]) -> Memory:
    """Total proportional set size: shared pages are split among the processes mapping them."""
    totals = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0, "Rss": 0}
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in totals:
                totals[key] += int(rest.split()[0])  # kB
    mib = {key: value / 1024 for key, value in totals.items()}
    return Memory(len(pids), mib["Pss"], mib["Pss_Anon"], mib["Pss_File"], mib["Rss"])
