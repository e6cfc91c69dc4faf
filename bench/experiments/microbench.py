"""In-process micro-benchmark of the handler's stages (parse, sample, gather, forward, format).

Drives ``NodeClassificationEngine`` directly, with request bodies as TorchServe hands them to
the handler (already-decoded JSON objects), one single-node request per seed, and reads the
engine's own ``StageTimes``. The feature pages are touched once before timing, as they are in
a worker that has served for a while; timings are medians over the timed batches.

    python -m bench.experiments.microbench --store STORE --model DIR --fanouts 10,10 --threads 1

On a GPU (``--device cuda``) the structure is on the GPU, as in a GPU worker, and
``--features`` says where the features are: ``host`` (the memory map, as served), ``pinned``
(a copy in page-locked host memory) or ``gpu`` (a copy in GPU memory).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graph_assets import GraphStore, open_store
from graph_assets.graph_view import GraphView
from handler.core.arrays import readonly_tensor
from handler.core.graph_source import mapped_graph
from handler.settings import ServingSettings, parse_fanouts
from handler.tasks.node.engine import NodeClassificationEngine
from model.export import load_model

STAGES = ("parse", "sample", "gather", "forward", "format")
FEATURE_PLACES = ("host", "pinned", "gpu")
BATCH_SIZES = (1, 8, 16, 32, 64)
_PAGE = 4096


@dataclass(frozen=True)
class StageRow:
    """Median milliseconds per stage for one batch size, plus the sampled subgraph's size."""

    graph: str
    fanouts: tuple[int, ...]
    threads: int
    device: str
    features: str
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


def place_features(engine: NodeClassificationEngine, place: str) -> None:
    """Gathers the engine's features (and degrees) from pinned host or GPU memory instead of
    the memory map (``host``, what serving does): what keeping them there would gain."""
    if place == "host":
        return
    if engine.device.type != "cuda":
        raise ValueError(f"--features {place} needs --device cuda; got {engine.device}")
    if place not in FEATURE_PLACES:
        raise ValueError(f"features must be one of {FEATURE_PLACES}; got {place!r}")
    store = mapped_graph(engine.store, "--features " + place)
    features, degrees = readonly_tensor(store.features), readonly_tensor(store.in_degree)
    if place == "pinned":
        features = features.clone().pin_memory()
    else:
        features, degrees = features.to(engine.device), degrees.to(engine.device)

    def gather(
        rows: torch.Tensor, view: GraphView | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:  # the stored graph's rows: no view but the store
        x = torch.index_select(features, 0, rows.to(features.device))
        degree = torch.index_select(degrees, 0, rows.to(degrees.device))
        return x.to(engine.device, non_blocking=True), degree.to(engine.device, non_blocking=True)

    engine.ego.gather = gather  # type: ignore[method-assign]


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
    features: str = "host",
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
                features=features,
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
    features: str = "host",
) -> list[StageRow]:
    """Builds an engine on ``store_path`` and times it (``threads`` intra-op threads)."""
    store = open_store(store_path, verify_checksum=False)
    touch_features(store)
    model, _ = load_model(model_dir)
    settings = ServingSettings(fanouts=fanouts, torch_threads=threads)
    engine = NodeClassificationEngine.create(store, model, settings, torch.device(device), "1.0")
    place_features(engine, features)
    return run_engine(engine, graph, threads, batch_sizes, batches, warmup, features)


def format_rows(rows: list[StageRow]) -> str:
    header = (
        "graph fanouts threads device/features batch | parse sample gather forward format | "
        "s+g+f (p90) | total | nodes edges"
    )
    lines = [header]
    for r in rows:
        fanouts = ",".join(str(f) for f in r.fanouts)
        lines.append(
            f"{r.graph} [{fanouts}] {r.threads} {r.device}/{r.features} {r.batch_size:>3} | "
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
        "--features", choices=FEATURE_PLACES, default="host", help="where features live"
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
        features=args.features,
    )
    print(format_rows(rows))


if __name__ == "__main__":
    main()
