"""Replica figures for the shared update log on Redis, measured side by side in one run.

``python -m bench.experiments.replicas`` on the suite's 1M-edge synthetic graph (100,000 nodes,
128 features, GraphSAGE, fanouts [10,10], one worker per server), a real redis-server with the
shipped durable config (``appendfsync always``) and two TorchServe instances A and B on
loopback:

1. replica lag: update requests sent to A at ``--rate`` per second (open loop, one operation
   each); B is read back to back meanwhile, and an update's lag is the time from A's 200 to the
   end of the first read on B whose ``graph_version`` includes it (so it counts up to one read
   of B on top of the follower's own delay);
2. read latency on B: the same back-to-back reads, first with no update stream (quiet), then
   during the stream;
3. update throughput in-process (the handler's own classes, one writer): the Redis log against
   the file log, 1 and 100 operations per request.

Results go to ``--out`` (JSON) and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

from bench.experiments.updates import throughput
from bench.harness.artifacts import GRAPHS, ArchiveSpec, Artifacts
from graph_assets import open_store
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.live_graph import LiveGraph
from tests.servers.redis_server import RedisServer
from tests.servers.torchserve import TorchServe

SECRET = "bench-replicas-update-secret"
WORK = Path(__file__).resolve().parents[2] / "build" / "bench"  # the suite's, cached graphs too


@dataclass
class Reads:
    """Back-to-back reads of one server: when each ended, its latency, the seq it saw."""

    ends: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)


def read_until(server: TorchServe, stop: threading.Event, nodes: int, reads: Reads) -> None:
    rng, url = random.Random(5), f"{server.inference_url}/predictions/gnn"
    with requests.Session() as session:
        session.headers.update(server.auth("inference"))
        while not stop.is_set():
            start = time.perf_counter()
            answer = session.post(url, json={"node_id": rng.randrange(nodes)}, timeout=30)
            end = time.perf_counter()
            answer.raise_for_status()
            reads.ends.append(end)
            reads.latencies_ms.append((end - start) * 1000)
            reads.seqs.append(int(answer.json()["graph_version"].rsplit("+", 1)[1]))


def send_updates(server: TorchServe, rate: float, seconds: float, nodes: int) -> dict[int, float]:
    """Open loop at ``rate``/s for ``seconds``: the time of each acknowledged seq's 200."""
    rng, url = random.Random(6), f"{server.inference_url}/predictions/gnn"
    acknowledged: dict[int, float] = {}
    with requests.Session() as session:
        session.headers.update({**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET})
        start = time.perf_counter()
        for sent in range(int(rate * seconds)):
            pause = start + sent / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            node = rng.randrange(nodes)
            x = [rng.uniform(-1, 1) for _ in range(128)]
            body = {"op": "update", "operations": [{"type": "set_features", "id": node, "x": x}]}
            answer = session.post(url, json=body, timeout=30)
            if answer.status_code == 200:
                acknowledged[answer.json()["seq"]] = time.perf_counter()
    return acknowledged


def lags_ms(acknowledged: dict[int, float], reads: Reads) -> list[float]:
    """Per acknowledged seq: from its 200 to the first read of B that ended holding it."""
    ends, seqs = np.array(reads.ends), np.array(reads.seqs)
    lags = []
    for seq, acked in acknowledged.items():
        holding = np.flatnonzero((seqs >= seq) & (ends >= acked))
        if holding.size:
            lags.append((ends[holding[0]] - acked) * 1000)
    return lags


def percentiles(values: list[float]) -> dict[str, float]:
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2), "n": len(values)}


def replica_figures(artifacts: Artifacts, redis: RedisServer, args: argparse.Namespace) -> dict:
    spec = ArchiveSpec("1M", updates=True)
    folder = artifacts.gnn_archive(spec)
    nodes = GRAPHS["1M"].nodes
    env = {"GNNSERVE_UPDATE_SECRET": SECRET, "GNNSERVE_UPDATE_LOG_URL": redis.url}
    with contextlib.ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            home = Path(tempfile.mkdtemp(prefix=f"replica-{name}-", dir=artifacts.work))
            server = TorchServe(home=home, model_store=folder.parent, extra_env=env)
            stack.callback(server.stop)
            server.start(f"gnn={folder.name}", timeout=600)
            servers.append(server)
        a, b = servers
        phases: dict[str, tuple[Reads, dict[int, float]]] = {}
        for phase in ("quiet", "stream"):
            stop, reads = threading.Event(), Reads()
            reader = threading.Thread(target=read_until, args=(b, stop, nodes, reads))
            reader.start()
            acknowledged: dict[int, float] = {}
            if phase == "stream":
                acknowledged = send_updates(a, args.rate, args.seconds, nodes)
            else:
                time.sleep(args.seconds)
            stop.set()
            reader.join()
            phases[phase] = (reads, acknowledged)
    (quiet, _), (stream, acknowledged) = phases["quiet"], phases["stream"]
    return {
        "update_rate_per_s": args.rate,
        "updates_acknowledged": len(acknowledged),
        "replica_lag": percentiles(lags_ms(acknowledged, stream)),
        "read_quiet": percentiles(quiet.latencies_ms),
        "read_under_stream": percentiles(stream.latencies_ms),
    }


def throughput_figures(artifacts: Artifacts, redis: RedisServer, seconds: float) -> dict:
    store_dir = artifacts.store("1M")
    figures = {}
    with tempfile.TemporaryDirectory(dir=artifacts.work) as tmp:
        for per_request in (1, 100):
            file_live = LiveGraph(open_store(store_dir), Path(tmp) / f"t{per_request}.log")
            redis.client().flushall()
            redis_live = LiveGraph(open_store(store_dir), None, redis_log=RedisLogConfig(redis.url))
            try:
                file_rate = throughput(file_live, per_request, seconds)
                redis_rate = throughput(redis_live, per_request, seconds)
            finally:
                file_live.close()
                redis_live.close()
            figures[f"{per_request}_ops"] = {
                "file_ops_per_s": round(file_rate),
                "redis_ops_per_s": round(redis_rate),
                "ratio": round(redis_rate / file_rate, 2),
            }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.experiments.replicas", description=__doc__
    )
    parser.add_argument("--rate", type=float, default=100.0, help="update requests per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=Path("docs/bench-results/replicas.json"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    artifacts = Artifacts(args.work)
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="redis-", dir=args.work))).start()
    try:
        results = {
            "replicas": replica_figures(artifacts, redis, args),
            "throughput": throughput_figures(artifacts, redis, args.seconds / 2),
        }
    finally:
        redis.stop()
    replicas = results["replicas"]
    results["read_p99_ratio"] = round(
        replicas["read_under_stream"]["p99_ms"] / replicas["read_quiet"]["p99_ms"], 2
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
