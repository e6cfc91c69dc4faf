"""Typed models on a GPU worker, in process: the node engine on a graph of several node types
set up as a CPU worker, as a GPU worker running the forward eagerly, and as a GPU worker with
its defaults (each type's features in GPU memory, the forward captured per padded bucket).

``python -m bench.experiments.gpu_typed [--users 20000] [--archs sage,gat] [--out FILE]``

The generated fraud graph (``--users`` users, a tenth as many merchants, half as many
featureless devices, five payments per user with two edge features; each relation's reverse
added, as ``--undirected`` does), a seeded untrained 2-layer recipe per ``--archs``, fanouts
``--fanouts``. Every mode answers the same batches of single-user requests per batch size
(seeded), ``--batches`` timed after ``--warmup``; the figures are the medians of the engine's
own stage times (a typed model's per-type gathers are part of its forward stage) and of the
whole batch. Each mode's answers to the first batches are checked
against the CPU worker's: the largest probability difference (at most 1e-5) and whether every
class agrees; the run exits 1 when one does not. ``--device cpu`` runs the GPU modes on the
CPU (per-type feature tables in host memory, the padded forward eager): a dry run of this
script and of the typed GPU path on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments.typed_exactness import recipe
from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from graph_assets.input.typed_input import read_graph
from handler.gpu.captured_forward import CapturedForward
from handler.gpu.device_features import TypedDeviceFeatures, typed_capacities
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine

MODES = ("cpu", "eager", "served")
CHECKED_BATCHES = 5
TOLERANCE = 1e-5


def build_store(folder: Path, users: int, seed: int = 0) -> GraphStore:
    """The fraud graph with its reverses, stored under ``folder``."""
    graph = fraud_graph(users, max(1, users // 10), max(1, users // 2), 5 * users, seed=seed)
    write_store(read_graph(write_fraud_graph_csv(graph, folder), undirected=True), folder / "s")
    return open_store(folder / "s")


def engine_for(
    store: GraphStore, model: torch.nn.Module, mode: str, device: torch.device, fanouts: list[int]
) -> NodeClassificationEngine:
    """The node engine of a worker set up as ``mode`` on ``device`` (the CPU worker always on
    the CPU). On a CPU ``device`` the GPU modes get what a GPU worker builds, set by hand:
    the per-type feature tables and (``served``) the captured forward, which runs eager."""
    on = torch.device("cpu") if mode == "cpu" else device
    section: dict[str, Any] = {"fanouts": fanouts, "torch_threads": 1}
    if on.type == "cuda":
        section["cuda_graphs"] = mode == "served"
    settings = ServingSettings.from_yaml_section(section)
    engine = NodeClassificationEngine.create(store, model, settings, on, "1.0")
    if on.type == "cpu" and mode != "cpu":
        capacities = typed_capacities(store, 1.0, 1 << 40)
        engine.ego.device_features = TypedDeviceFeatures(store, on, capacities)
        if mode == "served":
            engine.captured = CapturedForward(engine.model, on)
    return engine


def batches(store: GraphStore, size: int, count: int, seed: int) -> list[list[dict]]:
    """``count`` batches of ``size`` single-user requests (seeded)."""
    rng = np.random.default_rng(seed)
    users = store.schema.target_type.num_nodes
    return [
        [{"body": {"node_id": node}} for node in store.external_ids(rng.integers(0, users, size))]
        for _ in range(count)
    ]


def _sync(engine: NodeClassificationEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def time_engine(
    engine: NodeClassificationEngine, work: list[list[dict]], warmup: int
) -> tuple[dict[str, float], list[list[float]]]:
    """Median ms of each stage and of the whole batch over ``work`` after ``warmup``
    batches, and the probabilities of the first checked batches."""
    # The typed path gathers each type's features inside its "forward" stage.
    times: dict[str, list[float]] = {"sample": [], "forward": [], "total": []}
    answers: list[list[float]] = []
    for index, items in enumerate(work):
        _sync(engine)
        start = time.perf_counter()
        prepared = engine.prepare(items)
        responses = engine.respond(engine.run(prepared))
        _sync(engine)
        total = time.perf_counter() - start
        if index < CHECKED_BATCHES:
            for response in responses:
                if response.status != 200:
                    raise RuntimeError(f"{response.status}: {response.body}")
                answers.append(response.body["probabilities"])
        if index < warmup:
            continue
        for stage in ("sample", "forward"):
            times[stage].append(getattr(prepared.times, stage) * 1e3)
        times["total"].append(total * 1e3)
    return {name: float(np.median(values)) for name, values in times.items()}, answers


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnserve-gpu-typed-") as folder:
        store = build_store(Path(folder), args.users)
        for arch in args.archs.split(","):
            model = recipe(store, arch, len(fanouts))
            engines = {mode: engine_for(store, model, mode, device, fanouts) for mode in MODES}
            for size in (int(s) for s in args.batch_sizes.split(",")):
                work = batches(store, size, args.warmup + args.batches, seed=size)
                reference: list[list[float]] = []
                for mode, engine in engines.items():
                    medians, answers = time_engine(engine, work, args.warmup)
                    reference = reference or answers
                    diff = np.abs(np.subtract(answers, reference))
                    same = bool((np.argmax(answers, 1) == np.argmax(reference, 1)).all())
                    captured = engine.captured
                    rows.append(
                        {
                            "arch": arch,
                            "device": engine.device.type,
                            "mode": mode,
                            "batch": size,
                            **medians,
                            "max_abs_diff": float(diff.max()),
                            "classes_agree": same,
                            "forward_runs": "eager"
                            if captured is None or captured.eager_reason
                            else f"captured ({len(captured.keys)} graphs)",
                        }
                    )
                    print(f"  {rows[-1]}", flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| arch | device | mode | batch | sample ms | gather + forward ms | batch ms "
        "| forward runs | max abs diff from CPU | classes agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['arch']} | {r['device']} | {r['mode']} | {r['batch']} | {r['sample']:.3f} | "
        f"{r['forward']:.3f} | {r['total']:.3f} | {r['forward_runs']} | "
        f"{r['max_abs_diff']:.1e} | {'yes' if r['classes_agree'] else 'NO'} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=20_000, help="users of the fraud graph")
    parser.add_argument("--archs", default="sage,gat", help="typed recipes, comma list")
    parser.add_argument("--fanouts", default="10,5", help="comma list (default 10,5)")
    parser.add_argument("--batch-sizes", default="1,16,64", help="comma list")
    parser.add_argument("--batches", type=int, default=50, help="timed batches per size")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches per size")
    parser.add_argument("--device", default="cuda", help="the GPU modes' device (cuda or cpu)")
    parser.add_argument("--out", type=Path, help="JSON results")
    args = parser.parse_args()
    rows = run(args)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    bad = [r for r in rows if r["max_abs_diff"] > TOLERANCE or not r["classes_agree"]]
    if bad:
        raise SystemExit(f"{len(bad)} row(s) differ from the CPU worker's answers")


if __name__ == "__main__":
    main()
