"""Tools of the fault tests: test archives, worker PIDs, and a bounded many-connection client.

Test archives are copies of an archive that build_mar.sh built, changed entry by entry (another
handler file, a model-config YAML change, a broken file), so production code needs no test
hooks. Workers are found as children of the frontend's PID; nothing is ever found by name.
"""

from __future__ import annotations

import json
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import requests
import yaml

from tests.servers.torchserve import TorchServe, model_worker_pids, worker_processes

from .archives import write_small_graph
from .fault_handler import MARKERS

FAULT_HANDLER = Path(__file__).with_name("fault_handler.py")
MARKER_IDS = {fault: f"boom-{fault}" for fault in MARKERS.values()}
UNICODE_ID = "zoë-東京-🚀"
LONER_ID = "loner"


def write_fault_graph(directory: Path) -> Path:
    """The integration graph plus: isolated marker nodes (fault_handler.MARKERS in their first
    feature, no label), a unicode ID, an isolated node, a self-loop and duplicate edges."""
    write_small_graph(directory)
    nodes = pd.read_csv(directory / "nodes.csv", keep_default_na=False)
    features = [c for c in nodes.columns if c not in ("id", "label")]
    extra = []
    for value, fault in MARKERS.items():
        extra.append({"id": MARKER_IDS[fault], **dict.fromkeys(features, 0.0), "label": ""})
        extra[-1][features[0]] = value
    extra.append({"id": UNICODE_ID, **dict.fromkeys(features, 0.5), "label": "legit"})
    extra.append({"id": LONER_ID, **dict.fromkeys(features, -0.5), "label": "review"})
    pd.concat([nodes, pd.DataFrame(extra)]).to_csv(directory / "nodes.csv", index=False)
    edges = pd.read_csv(directory / "edges.csv")
    more = [("acct_1", UNICODE_ID), (UNICODE_ID, "acct_2"), (UNICODE_ID, UNICODE_ID)]
    more += [("acct_2", "acct_3")] * 3
    more_edges = pd.DataFrame(more, columns=["src", "dst"])
    pd.concat([edges, more_edges]).to_csv(directory / "edges.csv", index=False)
    return directory


def repack(
    source: Path,
    target: Path,
    *,
    handler: Path | None = None,
    yaml_changes: dict[str, Any] | None = None,
    edit: Callable[[str, bytes], bytes | None] | None = None,
) -> Path:
    """A copy of the archive ``source`` with another handler file, changed model-config YAML
    keys (``gnn`` merged one level deep), or entries changed by ``edit(name, data)`` (None
    drops the entry)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data: bytes | None = old.read(info)
            if info.filename == "MAR-INF/MANIFEST.json" and handler is not None:
                manifest = json.loads(data)
                manifest["model"]["handler"] = handler.name
                data = json.dumps(manifest, indent=2).encode()
            if info.filename == "model-config.yaml" and yaml_changes:
                config = yaml.safe_load(data)
                for key, value in yaml_changes.items():
                    if isinstance(value, dict):
                        config[key] = {**config.get(key, {}), **value}
                    else:
                        config[key] = value
                data = yaml.safe_dump(config, sort_keys=False).encode()
            if edit is not None and data is not None:
                data = edit(info.filename, data)
            if data is not None:
                # A fresh ZipInfo: writestr() would overwrite the source entry's sizes and CRC.
                entry = zipfile.ZipInfo(info.filename, info.date_time)
                new.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
        if handler is not None:
            new.write(handler, handler.name, compress_type=zipfile.ZIP_DEFLATED)
    return target


def describe(server: TorchServe, model: str) -> list[dict[str, Any]]:
    response = requests.get(
        f"{server.management_url}/models/{model}", headers=server.auth("management"), timeout=10
    )
    response.raise_for_status()
    return response.json()


def worker_pids(server: TorchServe, model: str) -> list[int]:
    """PIDs of the model's READY workers: children of the frontend that the management API
    lists for this model."""
    children = {process.pid for process in worker_processes(server)}
    return [pid for pid in model_worker_pids(server, model, ready=True) if pid in children]


def wait_for_workers(
    server: TorchServe, model: str, count: int, gone: set[int], timeout: float
) -> float:
    """Seconds until ``count`` READY workers, none of them in ``gone``, serve ``model``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            pids = worker_pids(server, model)
        except (requests.RequestException, psutil.Error):
            pids = []
        if len(pids) == count and not gone & set(pids):
            return time.monotonic() - start
        time.sleep(0.2)
    raise TimeoutError(f"{model}: not {count} fresh READY workers after {timeout} s")


def wait_for_exit(pids: set[int], timeout: float) -> int:
    """The first of ``pids`` whose process has ended (or is a zombie), within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pids:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return pid
            except psutil.NoSuchProcess:
                return pid
        time.sleep(0.05)
    raise TimeoutError(f"none of the workers {sorted(pids)} exited within {timeout} s")


@dataclass
class Record:
    """One request of the load driver: when it was sent and finished, and what came back."""

    sent: float
    done: float
    node: str
    outcome: str  # ok | wrong | failed | refused
    status: int | None = None
    detail: str = ""


@dataclass
class LoadDriver:
    """``connections`` threads, each with its own keep-alive connection, asking for the nodes in
    ``expected`` round robin and checking every 200 against the expected probabilities.

    Bounded: each thread stops at ``stop()``, after ``max_requests`` requests in all, or
    ``max_seconds`` after ``start()``, whichever comes first. Clients re-read the token after
    an auth refusal (a restarted server writes new keys).
    """

    server: TorchServe
    expected: dict[str, list[float]]
    model: str = "gnn"
    connections: int = 32
    max_requests: int = 20_000
    max_seconds: float = 120.0
    tolerance: float = 1e-5
    records: list[Record] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> LoadDriver:
        self._deadline = time.monotonic() + self.max_seconds
        nodes = list(self.expected)
        for i in range(self.connections):
            thread = threading.Thread(target=self._client, args=(nodes[i:] + nodes[:i],))
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Record]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a client did not stop"
        return self.records

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        """Blocks until ``count`` more requests have finished (the load is flowing)."""
        target = len(self.records) + count
        deadline = time.monotonic() + timeout
        while len(self.records) < target:
            assert time.monotonic() < deadline, f"load stalled at {len(self.records)} requests"
            time.sleep(0.05)

    def _client(self, nodes: list[str]) -> None:
        session = requests.Session()
        url = f"{self.server.inference_url}/predictions/{self.model}"
        headers = self._headers()
        i = 0
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            with self._lock:
                if len(self.records) >= self.max_requests:
                    return
            node = nodes[i % len(nodes)]
            i += 1
            sent = time.monotonic()
            try:
                response = session.post(url, json={"node_id": node}, headers=headers, timeout=30)
            except requests.RequestException as error:
                kind = type(error).__name__
                self._add(Record(sent, time.monotonic(), node, "refused", None, kind))
                session = requests.Session()
                time.sleep(0.05)
                continue
            record = Record(sent, time.monotonic(), node, *self._judge(node, response))
            self._add(record)
            if record.outcome == "refused":
                headers = self._headers()
                time.sleep(0.05)

    def _judge(self, node: str, response: requests.Response) -> tuple[str, int, str]:
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            return ("failed", status, response.text[:200])
        if status == 200:
            got = body.get("probabilities")
            if body.get("node_id") != node or got is None or len(got) != len(self.expected[node]):
                return ("wrong", status, json.dumps(body)[:300])
            error = float(np.max(np.abs(np.array(got) - np.array(self.expected[node]))))
            if error > self.tolerance:
                return ("wrong", status, f"max abs difference {error}")
            return ("ok", status, "")
        if status in (400, 401) and body.get("type") == "InvalidKeyException":
            return ("refused", status, "stale token")
        if status in (404, 503) and body.get("type") != "NotFound":
            return ("refused", status, str(body.get("message", ""))[:200])  # model not loaded
        return ("failed", status, json.dumps(body)[:300])

    def _headers(self) -> dict[str, str]:
        for _ in range(50):
            try:
                return self.server.auth("inference")
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)  # the key file is being rewritten by a starting server
        return {}

    def _add(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)


def summary(records: list[Record]) -> dict[str, Any]:
    """Counts per outcome and per status, for assertion messages and the report."""
    return {
        "requests": len(records),
        "outcomes": dict(Counter(r.outcome for r in records)),
        "statuses": dict(Counter(r.status for r in records)),
        "not_ok": [
            (round(r.sent, 3), r.node, r.outcome, r.status, r.detail)
            for r in records
            if r.outcome != "ok"
        ][:20],
    }


def reference_answers(server: TorchServe, nodes: list[str], model: str = "gnn") -> dict:
    """Each node's probabilities, asked one at a time (a batch of one)."""
    answers = {}
    for node in nodes:
        response = requests.post(
            f"{server.inference_url}/predictions/{model}",
            json={"node_id": node},
            headers=server.auth("inference"),
            timeout=30,
        )
        assert response.status_code == 200, response.text
        answers[node] = response.json()["probabilities"]
    return answers
