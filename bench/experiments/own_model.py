"""The user's own model against the preset it equals, side by side in one run (1M edges).

1. In process: sample+gather+forward of a batch of 32 single-node requests with fanouts
   [10,10], the user-class archive (``torch_geometric.nn.models.GraphSAGE`` by its dotted path)
   against the ``sage`` preset, same weights; the two engines alternate round by round so that
   both see the same phase of the machine. Ratio of the medians.
2. Served: the user-class archive's throughput at 32 connections against the echo archive's
   (TorchServe's floor: a handler that does nothing), batch 16 / 5 ms, in pairs back to back.
3. Build: ``build_mar.sh`` with the user's class on the 1M-edge store; the verification's
   seconds and their share of the build.

    python -m bench.experiments.own_model [--pairs 3] [--seconds 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments import microbench
from bench.experiments.suite import bodies
from bench.harness import loadgen
from bench.harness.artifacts import CLASSES, FEATURES, GRAPHS, ROOT, Artifacts
from bench.systems import servers
from graph_assets import open_store
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model.export import load_model
from tests.servers.torchserve import TorchServe

SAGE = "torch_geometric.nn.models.GraphSAGE"
SAGE_ARGS = {
    "in_channels": FEATURES,
    "hidden_channels": 64,
    "num_layers": 2,
    "out_channels": CLASSES,
}


def plain_weights(artifacts: Artifacts) -> Path:
    """The preset's random weights as the plain PyG model saves them (no ``gnn.`` prefix)."""
    path = artifacts.work / "own_model" / "sage_plain.pt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        preset = torch.load(artifacts.model_dir() / "model.pt", weights_only=True)
        torch.save({key.removeprefix("gnn."): value for key, value in preset.items()}, path)
    return path


def user_archive(artifacts: Artifacts) -> tuple[Path, float]:
    """The unpacked user-class archive on the 1M store (batch 16 / 5 ms, [10,10]) and the
    seconds its build took (built anew: the build time is the figure)."""
    shutil.rmtree(artifacts.archives / "own_1M", ignore_errors=True)
    started = time.perf_counter()
    folder = artifacts.built(
        "own_1M",
        [
            *("--store", str(artifacts.store("1M"))),
            *("--model-class", SAGE, "--model-args", json.dumps(SAGE_ARGS)),
            *("--weights", str(plain_weights(artifacts))),
            *("--fanouts", "10,10", "--batch-size", "16", "--max-batch-delay", "5"),
            *("--min-workers", "1", "--max-workers", "1", "--device", "cpu"),
        ],
    )
    return folder, time.perf_counter() - started


def in_process(preset: Path, user: Path, store_path: Path, rounds: int) -> dict[str, Any]:
    """Median sample+gather+forward (ms) of each engine at batch 32, alternating rounds."""
    store = open_store(store_path, verify_checksum=False)
    microbench.touch_features(store)
    settings = ServingSettings(fanouts=(10, 10), torch_threads=1)
    engines = {}
    for name, folder in (("preset", preset), ("user", user)):
        model, _ = load_model(folder)
        engines[name] = NodeClassificationEngine.create(
            store, model, settings, torch.device("cpu"), "1.0"
        )
    per_round: dict[str, list[float]] = {name: [] for name in engines}
    for index in range(rounds):
        for name, engine in engines.items():
            (row,) = microbench.run_engine(engine, "1M", 1, (32,), 50, 5, seed=index)
            per_round[name].append(row.sample_gather_forward)
    medians = {name: float(np.median(values)) for name, values in per_round.items()}
    return {
        "preset_ms": round(medians["preset"], 3),
        "user_ms": round(medians["user"], 3),
        "ratio": round(medians["user"] / medians["preset"], 3),
        "rounds": rounds,
    }


def served(artifacts: Artifacts, user: Path, pairs: int, seconds: float) -> dict[str, Any]:
    """Throughput at 32 connections, echo then the user-class archive, ``pairs`` times."""
    echo = artifacts.echo_archive(16, 5)
    models = [f"echo={echo.name}", f"own_1M={user.name}"]
    payload = bodies(GRAPHS["1M"].nodes)
    rows: list[dict[str, Any]] = []
    with servers.torchserve(artifacts.work / "run" / "own_model", artifacts.archives, models) as ts:
        server: TorchServe = ts
        auth = server.auth("inference")
        targets = {
            name: loadgen.Target(f"{server.inference_url}/predictions/{name}", payload, auth)
            for name in ("echo", "own_1M")
        }
        for target in targets.values():
            loadgen.closed_loop(target, 32, 5.0, 200_000, timeout_s=180)  # JIT warm-up
        for pair in range(pairs):
            for name, target in targets.items():
                result = loadgen.closed_loop(target, 32, seconds, 200_000, timeout_s=180)
                rows.append({"pair": pair, "system": name, **result.summary()})
                print(
                    f"    {name:<8} pair {pair}: {result.throughput:8.1f} req/s  p50 "
                    f"{result.p50_ms:6.2f}  p99 {result.p99_ms:7.2f} ms  errors {result.errors}",
                    flush=True,
                )
    ratios = [
        ours["throughput"] / echo["throughput"]
        for echo, ours in zip(rows[0::2], rows[1::2], strict=True)
    ]
    return {"pairs": rows, "ratio_median": round(float(np.median(ratios)), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench", help="build dir")
    parser.add_argument("--rounds", type=int, default=7, help="in-process rounds per engine")
    parser.add_argument("--pairs", type=int, default=3, help="echo/ours throughput pairs")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per load level")
    parser.add_argument("--out", type=Path, help="JSON results file")
    args = parser.parse_args()
    artifacts = Artifacts(args.work)
    preset = artifacts.base_archive("1M")
    user, build_seconds = user_archive(artifacts)
    verification = json.loads((user / "build_info.json").read_text())["verification"]
    build = {
        "build_s": round(build_seconds, 1),
        "verify_s": verification["seconds"],
        "verify_share": round(verification["seconds"] / build_seconds, 3),
        "worst_abs_diff": verification["worst_abs_diff"],
    }
    print("== build (1M edges, user GraphSAGE class):", build, flush=True)
    process = in_process(preset, user, artifacts.store("1M"), args.rounds)
    print("== in process, batch 32, [10,10]:", process, flush=True)
    print("== served, 32 connections, batch 16 / 5 ms", flush=True)
    throughput = served(artifacts, user, args.pairs, args.seconds)
    print("   user-class / echo (median of pairs):", throughput["ratio_median"], flush=True)
    if args.out:
        results = {"build": build, "in_process": process, "served": throughput}
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
