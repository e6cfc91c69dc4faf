"""A real TorchServe for the integration tests and the benchmarks: free loopback ports, private
dirs, stopped by PID; and what they ask of a started one (workers, their PIDs, its graph)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil
import requests

from tests.servers.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SHIPPED_CONFIG = ROOT / "config.properties"
PREFORK_HOOK = ROOT / "prefork"
WORKER_SCRIPT = "model_service_worker.py"
ZYGOTE_MODULE = "gnnserve_prefork.zygote"


LARGEST_BATCH = re.compile(
    r"gnn batches: \d+ in [\d.]+ s, requests per batch mean [\d.]+ max (\d+)"
)


def largest_batches(log_text: str) -> list[int]:
    """The largest batch of each batch summary the handler logged (handler.pipeline.metrics)."""
    return [int(size) for size in LARGEST_BATCH.findall(log_text)]


@dataclass
class TorchServe:
    """One TorchServe whose state (temp, logs, keys) lives in ``home``."""

    home: Path
    model_store: Path
    inference_port: int = 0
    management_port: int = 0
    metrics_port: int = 0
    # TorchServe always opens its gRPC APIs too: inference (and, with
    # ts_open_inference_protocol=true, the Open Inference Protocol's service) and management.
    grpc_inference_port: int = 0
    grpc_management_port: int = 0
    pid: int | None = None
    # Set by restart() only: the ports to keep instead of picking free ones.
    fixed_ports: tuple[int, int, int] | None = None
    # Workers forked from a zygote (prefork/, docs/operations.md "Worker memory").
    prefork: bool = False
    # Added to the server's environment, which its workers inherit (e.g. an update secret).
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.inference_port}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def grpc_inference_target(self) -> str:
        """``host:port`` of the gRPC inference API, as ``grpc.insecure_channel`` takes it."""
        return f"127.0.0.1:{self.grpc_inference_port}"

    def keys(self) -> dict[str, str]:
        data = json.loads((self.home / "key_file.json").read_text())
        return {name: entry["key"] for name, entry in data.items()}

    def auth(self, api: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys()[api]}"}

    def env(self) -> dict[str, str]:
        tmp = self.home / "tmp"
        return {
            **os.environ,
            "TEMP": str(tmp),
            "TMPDIR": str(tmp),
            "LOG_LOCATION": str(self.home / "logs"),
            "METRICS_LOCATION": str(self.home / "logs"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **({"PYTHONPATH": str(PREFORK_HOOK)} if self.prefork else {}),
            **self.extra_env,
        }

    def write_config(self, extra: str = "") -> Path:
        """The repo's shipped config.properties with free ports and this test's model store."""
        ports = self.fixed_ports or tuple(free_ports(3))
        self.inference_port, self.management_port, self.metrics_port = ports
        self.grpc_inference_port, self.grpc_management_port = free_ports(2)
        overrides = {
            "grpc_inference_port": str(self.grpc_inference_port),
            "grpc_management_port": str(self.grpc_management_port),
            "inference_address": f"http://127.0.0.1:{self.inference_port}",
            "management_address": f"http://127.0.0.1:{self.management_port}",
            "metrics_address": f"http://127.0.0.1:{self.metrics_port}",
            "model_store": str(self.model_store),
        }
        lines = []
        for line in SHIPPED_CONFIG.read_text().splitlines():
            key = line.split("=", 1)[0].strip()
            lines.append(f"{key}={overrides.pop(key)}" if key in overrides else line)
        lines += [f"{key}={value}" for key, value in overrides.items()]
        config = self.home / "config.properties"
        config.write_text("\n".join(lines) + "\n" + extra)
        return config

    def start(self, models: str, timeout: float = 240.0, extra_config: str = "") -> None:
        for sub in ("tmp", "logs"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        config = self.write_config(extra_config)
        command = [str(BIN / "torchserve"), "--start", "--ts-config", str(config)]
        self._launch(
            [*command, "--model-store", str(self.model_store), "--models", models], timeout
        )

    def start_from_snapshot(self, timeout: float = 240.0) -> None:
        """Restarts with no config file: TorchServe then loads its last snapshot (same ports)."""
        self.pid = None
        (self.home / "key_file.json").unlink(missing_ok=True)
        self._launch(
            [str(BIN / "torchserve"), "--start", "--model-store", str(self.model_store)], timeout
        )

    def _launch(self, command: list[str], timeout: float) -> None:
        # The daemonized frontend inherits stdout: a file, not a pipe, or run() never returns.
        with open(self.home / "logs" / "start.out", "ab") as out:
            subprocess.run(
                command,
                cwd=self.home,
                env=self.env(),
                check=True,
                stdout=out,
                stderr=out,
                timeout=120,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read_pid()
            if self.pid is not None and not psutil.pid_exists(self.pid):
                raise RuntimeError(f"TorchServe exited during start; see {self.home / 'logs'}")
            if self._all_models_ready():
                return
            time.sleep(1)
        raise TimeoutError(f"TorchServe not ready after {timeout} s; see {self.home / 'logs'}")

    def wait_for_log(
        self, *patterns: str, name: str = "model_log.log", timeout: float = 30.0
    ) -> str:
        """The text of ``logs/<name>`` once every regex in ``patterns`` matches it. A worker's log
        line can reach the file after its response reached the client: TorchServe relays the
        worker's output to its log files on a thread of its own."""
        path = self.home / "logs" / name
        deadline = time.monotonic() + timeout
        while True:
            text = path.read_text() if path.exists() else ""
            missing = [pattern for pattern in patterns if not re.search(pattern, text)]
            if not missing:
                return text
            if time.monotonic() > deadline:
                raise TimeoutError(f"{missing} not in {path} after {timeout} s")
            time.sleep(0.05)

    def _all_models_ready(self) -> bool:
        if not (self.home / "key_file.json").exists():
            return False
        try:
            listed = requests.get(
                f"{self.management_url}/models", headers=self.auth("management"), timeout=5
            )
            if listed.status_code != 200 or not listed.json().get("models"):
                return False
            return self.models_ready([model["modelName"] for model in listed.json()["models"]])
        except (requests.RequestException, ValueError, KeyError):
            return False

    def models_ready(self, names: Sequence[str]) -> bool:
        """Whether each named model has workers and all of them are READY."""
        try:
            for name in names:
                described = requests.get(
                    f"{self.management_url}/models/{name}",
                    headers=self.auth("management"),
                    timeout=5,
                ).json()
                workers = [w for entry in described for w in entry.get("workers", [])]
                if not workers or any(w["status"] != "READY" for w in workers):
                    return False
            return True
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return False

    def _read_pid(self) -> None:
        pid_file = self.home / "tmp" / ".model_server.pid"
        if self.pid is None and pid_file.exists() and pid_file.read_text().strip():
            self.pid = int(pid_file.read_text().strip())

    def stop(self) -> None:
        """SIGTERM the frontend and its workers by PID, then SIGKILL what is left."""
        self._read_pid()
        if self.pid is None or not psutil.pid_exists(self.pid):
            return
        try:
            frontend = psutil.Process(self.pid)
            processes = [frontend, *frontend.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(processes, timeout=30)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=10)
        self.pid = None

    def kill(self) -> None:
        """kill -9 of the frontend and every worker at once, by PID: a crash, not a stop."""
        self._read_pid()
        if self.pid is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            frontend = psutil.Process(self.pid)
            processes = [*frontend.children(recursive=True), frontend]
            for process in processes:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signal.SIGKILL)
            psutil.wait_procs(processes, timeout=30)
        self.pid = None

    def restart(self, models: str, timeout: float = 240.0, extra_config: str = "") -> None:
        """stop(), then start() on the same ports, as an operator's restart does.

        The new server writes new keys: clients must re-read ``keys()``.
        """
        ports = (self.inference_port, self.management_port, self.metrics_port)
        self.stop()
        self.fixed_ports = ports
        try:
            self.start(models, timeout=timeout, extra_config=extra_config)
        finally:
            self.fixed_ports = None


class Serve(Protocol):
    """The ``serve`` fixture (tests/integration/conftest.py):
    ``with serve(store, "gnn=gnn.mar") as server: ...``."""

    def __call__(
        self,
        model_store: Path,
        models: str,
        *,
        name: str = ...,
        home: Path | None = ...,
        extra_config: str = ...,
        env: Mapping[str, str] | None = ...,
        prefork: bool = ...,
    ) -> AbstractContextManager[TorchServe]: ...


class Register(Protocol):
    """The ``register`` fixture (tests/integration/conftest.py):
    ``with register(store, ["typed", "own"]) as server: ...``."""

    def __call__(
        self, model_store: Path, names: list[str]
    ) -> AbstractContextManager[TorchServe]: ...


# Registered archives get file names of their own in the shared model store, so that two
# modules' ``gnn.mar`` never meet there.
_registrations = itertools.count()


@contextlib.contextmanager
def register_archives(
    server: TorchServe, model_store: Path, names: Sequence[str], timeout: float = 600.0
) -> Iterator[TorchServe]:
    """Registers ``model_store``'s NAME.mar as model NAME, for each name, on a running server
    and waits until their workers are READY; unregisters them when the block ends, however it
    ends. The archives are hard-linked into the server's model store first: the shipped
    config registers bare file names from the model store only (allowed_urls). Registration
    is asynchronous, so the models' workers start side by side as at a server's start."""
    linked: dict[str, Path] = {}
    headers = server.auth("management")
    try:
        for name in names:
            target = server.model_store / f"registered{next(_registrations)}_{name}.mar"
            os.link(model_store / f"{name}.mar", target)
            linked[name] = target
            answer = requests.post(
                f"{server.management_url}/models",
                params={
                    "url": target.name,
                    "model_name": name,
                    "initial_workers": "1",  # the archive's --min-workers wins
                    "synchronous": "false",
                },
                headers=headers,
                timeout=timeout,
            )
            if answer.status_code not in (200, 202):
                raise RuntimeError(f"registering {name}: {answer.status_code} {answer.text}")
        deadline = time.monotonic() + timeout
        while not server.models_ready(names):
            for name in names:  # TorchServe drops a model whose workers all refuse to start
                described = requests.get(
                    f"{server.management_url}/models/{name}", headers=headers, timeout=10
                )
                if described.status_code == 404:
                    raise RuntimeError(f"{name} was dropped; see {server.home / 'logs'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{list(names)} not READY after {timeout} s")
            time.sleep(0.5)
        yield server
    finally:
        failed = []
        for name, target in linked.items():
            removed = requests.delete(
                f"{server.management_url}/models/{name}", headers=headers, timeout=timeout
            )
            if removed.status_code not in (200, 404):  # 404: it was dropped
                failed.append(f"{name}: {removed.status_code} {removed.text}")
            target.unlink()
        if failed:
            raise RuntimeError(f"unregistering failed: {failed}")


def worker_processes(server: TorchServe) -> list[psutil.Process]:
    """The frontend's children that run TorchServe's Python worker: plain workers, or pre-fork
    launchers. One that exits while it is looked at is left out."""
    assert server.pid is not None
    processes = []
    for child in psutil.Process(server.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(WORKER_SCRIPT in part for part in child.cmdline()):
                processes.append(child)
    return processes


def worker_pids(server: TorchServe) -> list[int]:
    """PIDs of every Python process that makes up this server's workers: the frontend's worker
    children (:func:`worker_processes`) and, with pre-forking, the zygote and the workers forked
    from it (they share its command line)."""
    if server.pid is None:
        return []
    pids = [process.pid for process in worker_processes(server)]
    zygote_args = f"{ZYGOTE_MODULE} --frontend-pid {server.pid}"
    for process in psutil.process_iter(["cmdline"]):
        if zygote_args in " ".join(process.info["cmdline"] or []):
            pids.append(process.pid)
    return sorted(set(pids))


def model_worker_pids(server: TorchServe, model: str, ready: bool = False) -> list[int]:
    """PIDs of one model's workers, as TorchServe's describe API lists them (sorted; only the
    READY ones with ``ready``)."""
    response = requests.get(
        f"{server.management_url}/models/{model}", headers=server.auth("management"), timeout=10
    )
    if response.status_code == 404:  # not registered (TorchServe drops a model whose workers
        return []  # all refused to start, sooner or later): it has no workers
    response.raise_for_status()
    described = response.json()
    return sorted(
        int(w["pid"])
        for entry in described
        for w in entry.get("workers", [])
        if w.get("pid") and (not ready or w.get("status") == "READY")
    )


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
