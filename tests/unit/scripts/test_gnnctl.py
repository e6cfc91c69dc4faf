"""gnnctl: management calls go straight to the management API, never through a proxy."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

GNNCTL = Path(__file__).resolve().parents[3] / "scripts" / "gnnctl.py"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def load_gnnctl() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gnnctl", GNNCTL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recording(ThreadingHTTPServer):
    """A loopback server that answers every GET with ``answer`` and records what it was sent."""

    def __init__(self, status: int, body: object) -> None:
        super().__init__(("127.0.0.1", 0), Recorder)
        self.answer = (status, body)
        self.seen: list[tuple[str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Recorder(BaseHTTPRequestHandler):
    server: Recording

    def do_GET(self) -> None:
        self.server.seen.append((self.requestline, dict(self.headers)))
        answer = self.server.answer
        status, body = answer.pop(0) if isinstance(answer, list) else answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    do_PUT = do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[Callable[[int, object], Recording]]:
    """Starts loopback servers on free ports; stops them after the test."""
    servers: list[Recording] = []

    def make(status: int, body: object) -> Recording:
        httpd = Recording(status, body)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd

    yield make
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_management_calls_ignore_proxy_variables(server, tmp_path, monkeypatch):
    management = server(200, [{"modelName": "gnn"}])
    proxy = server(502, {"message": "this is the proxy"})
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, proxy.url)
        monkeypatch.setenv(name.lower(), proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "management-key-1"}}))
    gnnctl = load_gnnctl()
    args = gnnctl._parser().parse_args(
        ["--management", management.url, "--key-file", str(key_file), "status"]
    )
    assert gnnctl.run(args) == [{"modelName": "gnn"}]
    assert proxy.seen == []  # the key never went to the proxy
    ((line, headers),) = management.seen
    assert line.startswith("GET /models ")
    assert headers["Authorization"] == "Bearer management-key-1"


def test_a_scale_that_races_torchserves_bookkeeping_is_retried(server, tmp_path, monkeypatch):
    race = {"code": 500, "message": "java.util.ConcurrentModificationException"}
    management = server(200, [])
    management.answer = [(500, race), (500, race), (200, {"status": "Workers updated"})]
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "management-key-1"}}))
    gnnctl = load_gnnctl()
    monkeypatch.setattr(gnnctl, "RETRY_BACKOFF_S", 0.0)
    args = gnnctl._parser().parse_args(
        ["--management", management.url, "--key-file", str(key_file), "scale", "gnn", "1"]
    )
    assert gnnctl.run(args) == {"status": "Workers updated"}
    assert [line.split()[0] for line, _ in management.seen] == ["PUT"] * 3


def test_any_other_error_is_not_retried(server, tmp_path):
    management = server(200, [])
    management.answer = [(500, {"code": 500, "message": "something else"})]
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "management-key-1"}}))
    gnnctl = load_gnnctl()
    args = gnnctl._parser().parse_args(
        ["--management", management.url, "--key-file", str(key_file), "scale", "gnn", "1"]
    )
    with pytest.raises(SystemExit, match="failed with 500: something else"):
        gnnctl.run(args)
    assert len(management.seen) == 1


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_register_reaches_a_server_on_other_ports(server, tmp_path):
    """``make register MANAGEMENT=...`` calls the management API at that address."""
    management = server(200, {"status": "Model registered"})
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "management-key-2"}}))
    done = subprocess.run(
        ["make", "--no-print-directory", "register", "MAR=gnn_v2.0.mar",
         f"MANAGEMENT={management.url}"],
        cwd=GNNCTL.parents[1], env={"GNNSERVE_KEY_FILE": str(key_file), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ((line, headers),) = management.seen
    assert line.startswith("POST /models?url=gnn_v2.0.mar&initial_workers=1&synchronous=true ")
    assert headers["Authorization"] == "Bearer management-key-2"
