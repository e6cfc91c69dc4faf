"""Stand-ins for TorchServe in the pre-fork tests: a frontend that starts one worker the way the
Java frontend does, and a ``ts/model_service_worker.py`` that reports what it sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PREFORK = Path(__file__).resolve().parents[3] / "prefork"

# The arguments TorchServe 0.12's frontend gives a worker script (WorkerLifeCycle).
TS_ARGS = [
    "--sock-type",
    "unix",
    "--sock-name",
    "/tmp/.ts.sock.9000",
    "--metrics-config",
    "/opt/ts/configs/metrics.yaml",
]

# Reports what a worker would see, then does what PREFORK_TEST_ACTION says: "exit CODE" or
# "sleep" (until it is killed).
FAKE_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
        "path0": sys.path[0], "marker": os.environ.get("PREFORK_TEST_MARKER"),
        "torch_loaded": "json" in sys.modules,
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    action, _, code = os.environ["PREFORK_TEST_ACTION"].partition(" ")
    if action == "sleep":
        time.sleep(60)
    sys.exit(int(code))
    """
)

# Stands in for the Java frontend: starts one worker, relays its exit status, and lives only
# as long as that (so the zygote, keyed by this PID, exits after it).
FAKE_FRONTEND = textwrap.dedent(
    """
    import subprocess, sys
    worker = subprocess.Popen([sys.executable, *sys.argv[1:]], cwd=sys.argv[1].rsplit("/", 2)[0])
    print(f"launcher {worker.pid}", flush=True)
    sys.exit(worker.wait())
    """
)


def write_worker(script: Path) -> Path:
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(FAKE_WORKER)
    return script


def prefork_env(tmp_path: Path, action: str, **extra: str) -> dict[str, str]:
    """The hook on the path, and ``tmp_path`` after it: the stand-in ``ts`` package there is
    the TorchServe whose worker script the zygote accepts."""
    return {
        **os.environ,
        "PYTHONPATH": f"{PREFORK}{os.pathsep}{tmp_path}",
        "GNNSERVE_PREFORK_IMPORTS": "json",  # light: these tests are about the plumbing
        "LOG_LOCATION": str(tmp_path / "logs"),
        "PREFORK_TEST_MARKER": "from-the-frontend",
        "PREFORK_TEST_ACTION": action,
        **extra,
    }


def frontend_command(script: Path) -> list[str]:
    return [sys.executable, "-c", FAKE_FRONTEND, str(script), *TS_ARGS]


def run_frontend(
    tmp_path: Path, script: Path, action: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        frontend_command(script),
        env=prefork_env(tmp_path, action, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start_frontend(tmp_path: Path, script: Path, action: str) -> subprocess.Popen[str]:
    """A frontend whose worker runs until it is killed; read its two lines with
    ``launcher_and_worker``."""
    return subprocess.Popen(
        frontend_command(script),
        env=prefork_env(tmp_path, action),
        stdout=subprocess.PIPE,
        text=True,
    )


def launcher_and_worker(frontend: subprocess.Popen[str]) -> tuple[int, dict]:
    assert frontend.stdout is not None
    launcher_pid = int(frontend.stdout.readline().split()[1])
    return launcher_pid, reported(frontend.stdout.readline())


def reported(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith("{")))


def launcher_pid(output: str) -> int:
    return int(output.split("launcher ")[1].split()[0])


def zygote_log(tmp_path: Path) -> str:
    return (tmp_path / "logs" / "gnnserve_prefork.log").read_text()
