"""A real redis-server for the tests and the benchmarks: the shipped durable configuration
(deploy/redis/redis.conf) on a free loopback port with its own directory, stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.servers.ports import free_ports
from tests.servers.torchserve import ROOT

SHIPPED_REDIS_CONFIG = ROOT / "deploy" / "redis" / "redis.conf"
MISSING = (
    "redis-server is not installed: the Redis update log is tested against a real one. "
    "Install it with: sudo apt-get install -y redis-server"
)


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@dataclass
class RedisServer:
    """One redis-server whose data (the append-only file) lives in ``home``."""

    home: Path
    port: int = 0
    config: Path = SHIPPED_REDIS_CONFIG
    db: int = 0  # the database ``url`` and ``client`` select (tests share one server by db)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{self.db}"

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        """Starts it (on the same port and data as before, after a stop or a kill) and waits
        until it answers PING, having loaded its append-only file."""
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError(MISSING)
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.port:
            (self.port,) = free_ports(1)
        overrides = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.home),
            "daemonize": "no",
            "protected-mode": "yes",
            "logfile": str(self.home / "redis.log"),
            "pidfile": str(self.home / "redis.pid"),
        }
        args = [binary, str(self.config)]
        for name, value in overrides.items():
            args += [f"--{name}", value]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        client = self.client()
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self.process.returncode}: "
                        f"{self.log_text()[-2000:]}"
                    )
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server on port {self.port} did not answer PING")
                time.sleep(0.02)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=self.db, socket_timeout=5)

    def log_text(self) -> str:
        log = self.home / "redis.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def stop(self) -> None:
        """SIGTERM (Redis flushes the append-only file and exits), then waits for the PID."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """kill -9: no shutdown, no flush beyond what ``appendfsync`` already made durable."""
        self._signal(signal.SIGKILL)

    def _signal(self, number: int, timeout_s: float = 20.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, number)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)
        self.process = None
