"""Memory of one vs two registered versions that carry the same graph.

``python -m bench.experiments.version_memory`` builds two archives (1.0 sage, 2.0 gcn) from one
synthetic graph, starts TorchServe with 1.0, reads every node's features through requests, then
registers 2.0 and does the same. After each phase it prints, per worker, the proportional set
size (PSS, from /proc/<pid>/smaps) of the graph's memory-mapped files and of the whole process:
with the shared graph cache, two versions hold the graph once, each worker accounting for half
of it.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import requests

from tests.servers.torchserve import ROOT, TorchServe, worker_processes

MIB = 1 << 20


def build(store: Path, nodes: int, edges: int, *options: str) -> None:
    command = [str(ROOT / "build_mar.sh"), "--synthetic", str(nodes), str(edges)]
    command += ["--epochs", "2", "--fanouts", "2,2", "--export-path", str(store), *options]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def graph_and_total_pss(pid: int) -> tuple[float, float]:
    """(PSS of mappings under the graph cache, PSS of the whole process), in MiB."""
    graph = total = 0
    path = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and "-" in fields[0]:
            path = fields[-1]
        elif fields and fields[0] == "Pss:":
            kib = int(fields[1])
            total += kib
            if "gnnserve-graph-cache" in path:
                graph += kib
    return graph * 1024 / MIB, total * 1024 / MIB


def touch_every_node(server: TorchServe, version: str, nodes: int) -> None:
    url = f"{server.inference_url}/predictions/gnn/{version}"
    session = requests.Session()
    for start in range(0, nodes, 1000):
        ids = list(range(start, min(start + 1000, nodes)))
        response = session.post(
            url, json={"node_ids": ids}, headers=server.auth("inference"), timeout=300
        )
        response.raise_for_status()


def report(phase: str, server: TorchServe) -> None:
    rows = [graph_and_total_pss(worker.pid) for worker in worker_processes(server)]
    graph = sum(row[0] for row in rows)
    total = sum(row[1] for row in rows)
    per_worker = ", ".join(f"{g:.0f}/{t:.0f}" for g, t in rows)
    print(
        f"{phase}: {len(rows)} worker(s); graph PSS {graph:.0f} MiB, total PSS {total:.0f} MiB "
        f"(per worker graph/total: {per_worker})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--edges", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "model_store"
        build(store, args.nodes, args.edges, "--arch", "sage")
        build(store, args.nodes, args.edges, "--arch", "gcn", "--version", "2.0")
        features_mib = args.nodes * 128 * 4 / MIB
        print(f"graph: {args.nodes} nodes, {args.edges} edges, features {features_mib:.0f} MiB")
        server = TorchServe(home=Path(tmp) / "server", model_store=store)
        try:
            server.start("gnn=gnn.mar")
            touch_every_node(server, "1.0", args.nodes)
            report("one version (1.0)", server)
            requests.post(
                f"{server.management_url}/models",
                params={"url": "gnn_v2.0.mar", "initial_workers": "1", "synchronous": "true"},
                headers=server.auth("management"),
                timeout=600,
            ).raise_for_status()
            touch_every_node(server, "2.0", args.nodes)
            touch_every_node(server, "1.0", args.nodes)
            report("two versions (1.0 + 2.0)", server)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
