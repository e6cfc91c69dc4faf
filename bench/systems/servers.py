"""How each system under test is started: TorchServe as the suite configures it (on the harness
the integration tests use too), and uvicorn serving the FastAPI baselines.

Every server binds free loopback ports, keeps its state in its own directory and is stopped by
PID in a ``finally``; nothing here looks processes up by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.servers.ports import free_ports
from tests.servers.torchserve import ROOT, TorchServe

# TorchServe answers 503 once a model's queue holds job_queue_size requests (default 100):
# 128 connections would overflow it, so the suite allows more. Everything else is the shipped
# config.properties.
EXTRA_CONFIG = "job_queue_size=1024\n"


@contextlib.contextmanager
def torchserve(
    home: Path,
    model_store: Path,
    models: list[str],
    prefork: bool = True,
    env: dict[str, str] | None = None,
) -> Iterator[TorchServe]:
    """A TorchServe serving ``models`` (``name=file.mar``), stopped by PID on exit; its workers
    forked from one zygote as ``make serve`` runs them (prefork/), or plain when ``prefork`` is
    False; ``env`` is added to its environment (an update secret, say).

    ``home`` is emptied first: every run starts with fresh logs and an empty temp dir.
    """
    shutil.rmtree(home, ignore_errors=True)
    server = TorchServe(home=home, model_store=model_store, prefork=prefork, extra_env=env or {})
    try:
        print(f"  starting TorchServe with {', '.join(models)}", flush=True)
        server.start(",".join(models), timeout=600, extra_config=EXTRA_CONFIG)
        yield server
    finally:
        server.stop()


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
    """Starts ``bench.systems.baseline_app`` under uvicorn (one process), stopped by PID on exit."""
    (port,) = free_ports(1)
    app = "bench.systems.baseline_app:create_app"
    command = [sys.executable, "-m", "uvicorn", "--factory", app]
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
