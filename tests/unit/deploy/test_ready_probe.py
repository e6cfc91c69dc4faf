"""deploy/kubernetes/ready.py, the readiness probe, against a stand-in management API.

The stand-in answers like TorchServe 0.12: 400 for a missing, wrong or expired token, an empty
body for `POST /token` (the new key goes into key_file.json). The real server is exercised by
the steps in deploy/README.md.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

READY_PY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "ready.py"


def load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gnnserve_ready_probe", READY_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ready = load_probe()


@dataclass
class FakeTorchServe:
    """Management API state: the keys it accepts and the workers it reports."""

    key_file: Path
    management_key: str | None = "m-1"
    api_key: str = "api"
    statuses: list[str] = field(default_factory=lambda: ["READY"])
    refreshed: int = 0

    def write_key_file(self) -> None:
        self.key_file.write_text(
            json.dumps(
                {
                    "management": {"key": self.management_key, "expiration time": "later"},
                    "inference": {"key": "i-1", "expiration time": "later"},
                    "API": {"key": self.api_key},
                }
            )
        )


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[FakeTorchServe, str]]:
    state = FakeTorchServe(key_file=tmp_path / "key_file.json")
    state.write_key_file()

    class Handler(BaseHTTPRequestHandler):
        def authorized(self, key: str | None) -> bool:
            return key is None or self.headers.get("Authorization") == f"Bearer {key}"

        def answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if not self.authorized(state.management_key):
                self.answer(400, b'{"code": 400, "type": "InvalidKeyException"}')
                return
            workers = [{"id": str(i), "status": s} for i, s in enumerate(state.statuses)]
            self.answer(200, json.dumps([{"modelName": "gnn", "workers": workers}]).encode())

        def do_POST(self):
            if self.path != "/token?type=management" or not self.authorized(state.api_key):
                self.answer(400, b"{}")
                return
            state.refreshed += 1
            state.management_key = f"m-{state.refreshed + 1}"
            state.write_key_file()
            self.answer(200, b"\n")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def probe(state: FakeTorchServe, url: str) -> int:
    return ready.main(["--url", url, "--key-file", str(state.key_file), "--timeout", "2"])


def test_ready_when_a_worker_is_ready(server, capsys):
    state, url = server
    state.statuses = ["UNLOADING", "READY"]
    assert probe(state, url) == 0
    assert "1 READY worker" in capsys.readouterr().out


def test_not_ready_while_the_model_loads(server, capsys):
    state, url = server
    state.statuses = ["UNLOADING"]
    assert probe(state, url) == 1
    assert "no READY worker" in capsys.readouterr().out


def test_an_expired_management_key_is_refreshed_with_the_api_key(server):
    state, url = server
    state.management_key = "m-rotated"  # what an expired key amounts to: refused
    assert probe(state, url) == 0
    assert state.refreshed == 1
    assert json.loads(state.key_file.read_text())["management"]["key"] == state.management_key


def test_without_a_key_file_it_asks_without_a_token(server):
    state, url = server
    state.key_file.unlink()
    state.management_key = None  # token authorization off
    assert probe(state, url) == 0


def test_a_refused_refresh_is_not_ready(server, capsys):
    state, url = server
    state.management_key, state.api_key = "m-rotated", "api-rotated"
    assert probe(state, url) == 1
    assert "did not describe" in capsys.readouterr().out


def test_not_ready_when_the_server_is_down(tmp_path, capsys):
    state = FakeTorchServe(key_file=tmp_path / "key_file.json")
    state.write_key_file()
    assert probe(state, "http://127.0.0.1:9") == 1
    assert "not ready" in capsys.readouterr().out
