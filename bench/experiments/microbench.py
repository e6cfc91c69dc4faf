"""In-process micro-benchmark of the handler's stages (parse, sample, gather, forward, format).

Drives ``NodeClassificationEngine`` directly, with request bodies as TorchServe hands them to
the handler (already-decoded JSON objects), one single-node request per seed, and reads the
engine's own ``StageTimes``. The feature pages are touched once before timing, as they are in
a worker that has served for a while; timings are medians over the timed batches.

    python -m bench.experiments.microbench --store STORE --model DIR --fanouts 10,10 --threads 1

On a GPU (``--device cuda``), ``--placement`` says how the worker is set up: ``served`` (the
GPU archive's defaults: sampling on the CPU, features in GPU memory, the forward as CUDA
graphs), ``eager`` (the same with the forward run eagerly) or ``gpu-sampling`` (sampling on
the GPU and features gathered from host memory, each stage on the GPU as it was before).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graph_assets import GraphStore, open_store
from handler.settings import ServingSettings, parse_fanouts
from handler.tasks.node.engine import NodeClassificationEngine
from model.export import load_model

STAGES = ("parse", "sample", "gather", "forward", "format")
PLACEMENTS = ("served", "eager", "gpu-sampling")
BATCH_SIZES = (1, 8, 16, 32, 64)
_PAGE = 4096


@dataclass(frozen=True)
class StageRow:
    """Median milliseconds per stage for one batch size, plus the sampled subgraph's size."""

    graph: str
    fanouts: tuple[int, ...]
    threads: int
    device: str
    placement: str
    batch_size: int
    batches: int
    parse: float
    sample: float
    gather: float
    forward: float
    format: float
    sample_gather_forward: float
    sample_gather_forward_p90: float
    total: float
    sampled_nodes: float
    sampled_edges: float


def touch_features(store: GraphStore) -> None:
    """Maps every page of the feature matrix into this process, as serving eventually does."""
    flat = np.asarray(store.features).reshape(-1)
    step = max(1, _PAGE // flat.itemsize)
    float(flat[::step].sum())


def placement_settings(placement: str) -> dict[str, object]:
    """The ``gnn:`` settings a GPU worker set up as ``placement`` runs with."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}; got {placement!r}")
    if placement == "gpu-sampling":
        return {"sampling_device": "gpu", "gpu_feature_fraction": 0.0, "cuda_graphs": False}
    return {"cuda_graphs": placement == "served"}


def _sync(engine: NodeClassificationEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def run_engine(
    engine: NodeClassificationEngine,
    graph: str,
    threads: int,
    batch_sizes: tuple[int, ...],
    batches: int,
    warmup: int,
    placement: str = "served",
    seed: int = 0,
) -> list[StageRow]:
    """Times ``batches`` random batches per batch size after ``warmup`` untimed ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for batch_size in batch_sizes:
        times: dict[str, list[float]] = {name: [] for name in (*STAGES, "total", "n", "e")}
        for index in range(warmup + batches):
            nodes = rng.integers(0, engine.store.num_nodes, batch_size)
            ids = engine.store.external_ids(nodes)
            items = [{"body": {"node_id": node}} for node in ids]
            _sync(engine)
            start = time.perf_counter()
            prepared = engine.prepare(items)
            engine.respond(engine.run(prepared))
            total = time.perf_counter() - start
            if index < warmup:
                continue
            for name in STAGES:
                times[name].append(getattr(prepared.times, name) * 1e3)
            times["total"].append(total * 1e3)
            times["n"].append(prepared.times.sampled_nodes)
            times["e"].append(prepared.times.sampled_edges)
        sgf = np.add(np.add(times["sample"], times["gather"]), times["forward"])
        med = {name: float(np.median(values)) for name, values in times.items()}
        rows.append(
            StageRow(
                graph=graph,
                fanouts=tuple(engine.settings.fanouts),
                threads=threads,
                device=engine.device.type,
                placement=placement,
                batch_size=batch_size,
                batches=batches,
                parse=med["parse"],
                sample=med["sample"],
                gather=med["gather"],
                forward=med["forward"],
                format=med["format"],
                sample_gather_forward=float(np.median(sgf)),
                sample_gather_forward_p90=float(np.percentile(sgf, 90)),
                total=med["total"],
                sampled_nodes=med["n"],
                sampled_edges=med["e"],
            )
        )
    return rows


def benchmark(
    store_path: Path,
    model_dir: Path,
    graph: str,
    fanouts: tuple[int, ...],
    threads: int,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    batches: int = 100,
    warmup: int = 10,
    device: str = "cpu",
    placement: str = "served",
) -> list[StageRow]:
    """Builds an engine on ``store_path`` and times it (``threads`` intra-op threads); on a
    GPU, set up as ``placement`` says."""
    store = open_store(store_path, verify_checksum=False)
    touch_features(store)
    model, _ = load_model(model_dir)
    gpu = placement_settings(placement) if device != "cpu" else {}
    settings = ServingSettings.from_yaml_section(
        {"fanouts": list(fanouts), "torch_threads": threads, **gpu}
    )
    engine = NodeClassificationEngine.create(store, model, settings, torch.device(device), "1.0")
    return run_engine(engine, graph, threads, batch_sizes, batches, warmup, placement)


def format_rows(rows: list[StageRow]) -> str:
    header = (
        "graph fanouts threads device/placement batch | parse sample gather forward format | "
        "s+g+f (p90) | total | nodes edges"
    )
    lines = [header]
    for r in rows:
        fanouts = ",".join(str(f) for f in r.fanouts)
        lines.append(
            f"{r.graph} [{fanouts}] {r.threads} {r.device}/{r.placement} {r.batch_size:>3} | "
            f"{r.parse:.3f} {r.sample:.3f} "
            f"{r.gather:.3f} {r.forward:.3f} {r.format:.3f} | {r.sample_gather_forward:.3f} "
            f"({r.sample_gather_forward_p90:.3f}) | {r.total:.3f} | {r.sampled_nodes:.0f} "
            f"{r.sampled_edges:.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path, required=True, help="graph store directory")
    parser.add_argument("--model", type=Path, required=True, help="model.pt + model_config.json")
    parser.add_argument("--fanouts", default="10,10", help="comma list (default 10,10)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batches", type=int, default=100, help="timed batches per size")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--placement", choices=PLACEMENTS, default="served", help="a GPU worker's set-up"
    )
    parser.add_argument("--batch-sizes", default="1,8,16,32,64", help="comma list")
    args = parser.parse_args()
    rows = benchmark(
        args.store,
        args.model,
        args.store.name,
        parse_fanouts(args.fanouts),
        args.threads,
        batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")),
        batches=args.batches,
        device=args.device,
        placement=args.placement,
    )
    print(format_rows(rows))


if __name__ == "__main__":
    main()
