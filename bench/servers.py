"""The servers under test: TorchServe (reusing the integration tests' fixture) and uvicorn.

Every server binds free loopback ports, keeps its state in its own directory and is stopped by
PID in a ``finally``; nothing here looks processes up by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests

from tests.integration.server import TorchServe, free_ports

ROOT = Path(__file__).resolve().parents[1]
_WORKER_SCRIPT = "model_service_worker.py"
_ZYGOTE_MODULE = "gnnserve_prefork.zygote"


# TorchServe answers 503 once a model's queue holds job_queue_size requests (default 100):
# 128 connections would overflow it, so the suite allows more. Everything else is the shipped
# config.properties.
EXTRA_CONFIG = "job_queue_size=1024\n"


@contextlib.contextmanager
def torchserve(
    home: Path, model_store: Path, models: list[str], prefork: bool = True
) -> Iterator[TorchServe]:
    """A TorchServe serving ``models`` (``name=file.mar``), stopped by PID on exit; its workers
    forked from one zygote as ``make serve`` runs them (prefork/), or plain when ``prefork`` is
    False.

    ``home`` is emptied first: every run starts with fresh logs and an empty temp dir.
    """
    shutil.rmtree(home, ignore_errors=True)
    server = TorchServe(home=home, model_store=model_store, prefork=prefork)
    try:
        print(f"  starting TorchServe with {', '.join(models)}", flush=True)
        server.start(",".join(models), timeout=600, extra_config=EXTRA_CONFIG)
        yield server
    finally:
        server.stop()


def scale_workers(server: TorchServe, model: str, workers: int) -> None:
    """Sets a model's workers to exactly ``workers`` and waits until they are up."""
    response = requests.put(
        f"{server.management_url}/models/{model}",
        params={"min_worker": str(workers), "max_worker": str(workers), "synchronous": "true"},
        headers=server.auth("management"),
        timeout=600,
    )
    response.raise_for_status()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        described = requests.get(
            f"{server.management_url}/models/{model}",
            headers=server.auth("management"),
            timeout=10,
        ).json()
        states = [w["status"] for entry in described for w in entry.get("workers", [])]
        if len(states) == workers and all(s == "READY" for s in states):
            return
        time.sleep(1)
    raise TimeoutError(f"{model}: {workers} workers not READY after 600 s")


def graph_checksum(server: TorchServe, model: str) -> str:
    """The checksum of the graph a model serves (from the handler's ``describe_handle``)."""
    described = requests.get(
        f"{server.management_url}/models/{model}",
        params={"customized": "true"},
        headers=server.auth("management"),
        timeout=10,
    ).json()
    custom = described[0]["customizedMetadata"]
    if isinstance(custom, str):
        custom = json.loads(custom)
    return str(custom["graph"]["checksum"])


def model_worker_pids(server: TorchServe, model: str) -> list[int]:
    """PIDs of one model's workers, as TorchServe's describe API lists them."""
    described = requests.get(
        f"{server.management_url}/models/{model}", headers=server.auth("management"), timeout=10
    ).json()
    return [int(w["pid"]) for entry in described for w in entry.get("workers", []) if w.get("pid")]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (vanished ones count 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def worker_pids(server: TorchServe) -> list[int]:
    """PIDs of every Python process that makes up this server's workers: the frontend's worker
    children (plain workers, or pre-fork launchers) and, with pre-forking, the zygote and the
    workers forked from it (they share its command line)."""
    if server.pid is None:
        return []
    frontend = psutil.Process(server.pid)
    pids = []
    for child in frontend.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(_WORKER_SCRIPT in part for part in child.cmdline()):
                pids.append(child.pid)
    zygote_args = f"{_ZYGOTE_MODULE} --frontend-pid {server.pid}"
    for process in psutil.process_iter(["cmdline"]):
        if zygote_args in " ".join(process.info["cmdline"] or []):
            pids.append(process.pid)
    return sorted(set(pids))


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


@dataclass
class Uvicorn:
    """A uvicorn process serving one FastAPI baseline on a free loopback port."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def uvicorn(env: dict[str, str], log: Path, timeout: float = 600) -> Iterator[Uvicorn]:
    """Starts ``bench.baseline_app`` under uvicorn (one process), stopped by PID on exit."""
    (port,) = free_ports(1)
    command = [sys.executable, "-m", "uvicorn", "--factory", "bench.baseline_app:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out
        )
    server = Uvicorn(port=port, process=process)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {process.returncode}; see {log}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn not ready after {timeout} s; see {log}")
            time.sleep(0.5)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
