"""Handler versions side by side: same TorchServe, same graph and weights, alternating levels.

Compares archives that differ only in code (for example this commit's handler against an older
commit's, the folder archive copied with the code directories replaced from ``git worktree``),
reporting throughput and the CPU time of each model's workers and of the frontend per request.
Medians over ``--rounds``; the first model is the reference for the ratio column.

    python -m bench.experiments.ab_handlers --store DIR \\
        echo=echo_b16_d5.mar before=gnn_before after=gnn_after
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.experiments.suite import bodies
from bench.harness import loadgen
from bench.harness.artifacts import GRAPHS, ROOT
from bench.harness.watch import CpuWatch
from bench.systems import servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="model store with the archives")
    parser.add_argument("models", nargs="+", help="name=archive, the reference first")
    parser.add_argument("--graph", default="1M", choices=sorted(GRAPHS))
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = [model.split("=", 1)[0] for model in args.models]
    payload = bodies(GRAPHS[args.graph].nodes)
    home = ROOT / "build" / "bench" / "run" / "ab"
    with servers.torchserve(home, args.store.resolve(), args.models) as server:
        auth = server.auth("inference")
        url = server.inference_url
        targets = {n: loadgen.Target(f"{url}/predictions/{n}", payload, auth) for n in names}
        watches = {name: CpuWatch.of(server, name) for name in names}
        for name in names * 2:  # the JVM compiles its hot paths in the first seconds
            loadgen.closed_loop(targets[name], args.connections, 4.0, 100_000, timeout_s=180)
        rows: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                before = watches[name].read()
                result = loadgen.closed_loop(
                    targets[name], args.connections, args.seconds, 100_000, timeout_s=180
                )
                worker, frontend = (
                    1000 * (now - then) / max(result.ok, 1)
                    for now, then in zip(watches[name].read(), before, strict=True)
                )
                rows[name].append((result.throughput, worker, frontend, result.p99_ms))
                print(
                    f"  {name:<10} {result.throughput:8.1f} req/s  worker {worker:.3f}  "
                    f"frontend {frontend:.3f} ms/request  p99 {result.p99_ms:.1f} ms",
                    flush=True,
                )
    medians = {n: [statistics.median(r[i] for r in rows[n]) for i in range(4)] for n in names}
    reference = medians[names[0]][0]
    print("| model | req/s | worker CPU ms/request | frontend CPU ms/request | p99 ms | ratio |")
    print("|---|---|---|---|---|---|")
    for name in names:
        throughput, worker, frontend, p99 = medians[name]
        print(
            f"| {name} | {throughput:.0f} | {worker:.3f} | {frontend:.3f} | {p99:.1f} | "
            f"{throughput / reference:.2f} |"
        )


if __name__ == "__main__":
    main()
