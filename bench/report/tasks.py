"""Quality and latency of the link, graph, embedding, cold-start and explanation requests.

    python -m bench.report.tasks [--requests 200] [--explanations 30] [--out build/tasks]

Builds, with ``build_mar.sh`` as a user would: the node archive of the demo graph (GraphSAGE,
default fanouts 25,10), link archives of the demo graph (GraphSAGE encoder, dot and MLP
decoders) and graph archives of 1,000 synthetic graphs (GIN with sum pooling, GraphSAGE with
mean pooling). Quality comes from each archive's ``metrics.json`` (held-out AUC, hits@10/@50
and MRR; test accuracy). Latency: one TorchServe serving the node, the dot link and the GIN
graph archive with the default batching (``batchSize`` 8, ``maxBatchDelay`` 5 ms), one request
at a time over HTTP, so each number includes TorchServe's wait for a batch to fill.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests

from bench.systems.servers import torchserve
from graph_assets.input.graph_dataset import generate_graph_dataset
from tests.servers.torchserve import ROOT

DEMO_NODES = 2000
FEATURES = 32


def build(store: Path, log: Path, *options: str) -> None:
    with log.open("a") as out:
        subprocess.run(
            [str(ROOT / "build_mar.sh"), "--export-path", str(store), *options],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        )


def metrics(store: Path, archive: str) -> dict[str, Any]:
    return dict(json.loads(zipfile.ZipFile(store / archive).read("metrics.json")))


def timed(call: Callable[[], requests.Response], count: int) -> dict[str, float]:
    """p50/p99/mean milliseconds of ``count`` sequential calls (after 5 warm-up calls)."""
    for _ in range(5):
        call()
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        response = call()
        seconds.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
    ms = np.array(seconds) * 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "requests": count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="timed requests per kind")
    parser.add_argument("--explanations", type=int, default=30, help="timed explanations")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "tasks", help="work dir")
    args = parser.parse_args(argv)
    store, log = args.out / "model_store", args.out / "build.log"
    store.mkdir(parents=True, exist_ok=True)
    print(f"building archives (log: {log})", flush=True)
    build(store, log)
    build(store, log, "--task", "link", "--name", "link")
    build(store, log, "--task", "link", "--name", "link_mlp", "--decoder", "mlp")
    build(store, log, "--task", "graph", "--name", "graphs")
    build(store, log, "--task", "graph", "--name", "graphs_sage", "--arch", "sage")
    build(store, log, "--task", "graph", "--name", "graphs_sage_mean", "--arch", "sage",
          "--pooling", "mean")  # fmt: skip
    report: dict[str, Any] = {"quality": {}, "latency": {}}
    for archive in ("link", "link_mlp", "graphs", "graphs_sage", "graphs_sage_mean"):
        report["quality"][archive] = metrics(store, f"{archive}.mar")
        print(archive, json.dumps(report["quality"][archive]), flush=True)

    rng = np.random.default_rng(0)
    graphs = generate_graph_dataset(200, seed=123)
    inline = [{"graph": {"x": x.tolist(), "edge_index": e.tolist()}} for x, e, _ in graphs.graphs()]
    home = args.out / "server"
    with torchserve(home, store, ["gnn=gnn.mar", "link=link.mar", "graphs=graphs.mar"]) as ts:
        headers = {**ts.auth("inference"), "Content-Type": "application/json"}

        def post(path: str, body_of: Callable[[], Any]) -> Callable[[], requests.Response]:
            url = f"{ts.inference_url}/{path}"
            return lambda: requests.post(url, data=json.dumps(body_of()), headers=headers)

        def node() -> int:
            return int(rng.integers(0, DEMO_NODES))

        kinds: dict[str, tuple[Callable[[], requests.Response], int]] = {
            "node prediction": (post("predictions/gnn", lambda: {"node_id": node()}), 0),
            "node + embedding": (
                post("predictions/gnn", lambda: {"node_id": node(), "return_embedding": True}),
                0,
            ),
            "cold-start node (5 neighbours)": (
                post(
                    "predictions/gnn",
                    lambda: {
                        "new_node": {
                            "x": rng.normal(size=FEATURES).tolist(),
                            "neighbors": rng.integers(0, DEMO_NODES, 5).tolist(),
                        }
                    },
                ),
                0,
            ),
            "link pair": (post("predictions/link", lambda: {"src": node(), "dst": node()}), 0),
            "link 16 pairs": (
                post(
                    "predictions/link",
                    lambda: {"pairs": rng.integers(0, DEMO_NODES, (16, 2)).tolist()},
                ),
                0,
            ),
            "link top-10": (post("predictions/link", lambda: {"src": node(), "top_k": 10}), 0),
            "graph classification": (
                post("predictions/graphs", lambda: inline[int(rng.integers(0, len(inline)))]),
                0,
            ),
            "explanation: node": (post("explanations/gnn", lambda: {"node_id": node()}), 1),
            "explanation: pair": (
                post("explanations/link", lambda: {"src": node(), "dst": node()}),
                1,
            ),
            "explanation: graph": (
                post("explanations/graphs", lambda: inline[int(rng.integers(0, len(inline)))]),
                1,
            ),
        }
        for name, (call, is_explanation) in kinds.items():
            count = args.explanations if is_explanation else args.requests
            report["latency"][name] = timed(call, count)
            print(f"{name}: {json.dumps(report['latency'][name])}", flush=True)
        sample = requests.post(
            f"{ts.inference_url}/explanations/gnn", json={"node_id": 42}, headers=headers
        ).json()
        report["explanation_steps"] = sample["explanation"]["steps"]
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
