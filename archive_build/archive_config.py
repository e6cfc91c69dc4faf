"""Writes an archive's model-config YAML: TorchServe's batching/worker keys plus our ``gnn:``.

TorchServe reads timeouts from this YAML, not from the register call, so those keys are always
written. minWorkers/maxWorkers are written only when the builder asks for them: in the YAML they
override the register call's ``initial_workers`` and ``default_workers_per_model``.
``build_mar.sh`` calls ``python -m archive_build.archive_config``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from graph_assets import StoreError, read_meta
from graph_assets.remote import open_remote_store
from graph_assets.remote.location import is_remote, parse_location
from handler.settings import (
    SAMPLING_DEVICES,
    TASKS,
    ServingSettings,
    check_explain_budget,
    default_fanouts,
    parse_fanouts,
    parse_relation_fanouts,
)

# (batchSize, maxBatchDelay ms) by deviceType: a CPU worker answers a small batch soonest; a
# GPU worker's forward costs about the same for 1 or 256 seeds, so it takes more requests at
# once (16: a batch of explanations, 2 s each by default, must fit responseTimeout's 60 s).
BATCHING = {"cpu": (8, 5), "gpu": (16, 2)}
# Workers per GPU: each samples on a CPU core of its own while the others' batches run on the
# GPU, and all of them map the one copy of the features that the GPU's keeper holds.
WORKERS_PER_GPU = 4


def torchserve_section(
    batch_size: int,
    max_batch_delay_ms: int,
    min_workers: int | None,
    max_workers: int | None,
    response_timeout_s: int,
    startup_timeout_s: int,
    device_type: str,
) -> dict[str, Any]:
    """TorchServe's own model-config keys, validated so a typo fails the build, not the server."""
    values = {
        "batchSize": batch_size,
        "maxBatchDelay": max_batch_delay_ms,
        **worker_keys(min_workers, max_workers),
        "responseTimeout": response_timeout_s,
        "startupTimeout": startup_timeout_s,
    }
    for key, value in values.items():
        floor = 0 if key == "maxBatchDelay" else 1
        if value < floor:
            raise ValueError(f"{key} must be >= {floor}; got {value}")
    if device_type not in ("cpu", "gpu"):
        raise ValueError(f"deviceType must be cpu or gpu; got {device_type!r}")
    return {**values, "deviceType": device_type}


def worker_keys(min_workers: int | None, max_workers: int | None) -> dict[str, int]:
    """minWorkers/maxWorkers when the builder gave both, else none, so that TorchServe's own
    settings choose. TorchServe ignores a pair unless 0 < minWorkers <= maxWorkers (logging only
    a warning), so a pair it would ignore fails the build instead."""
    if min_workers is None and max_workers is None:
        return {}
    if min_workers is None or max_workers is None:
        raise ValueError(
            "give --min-workers and --max-workers together (e.g. --min-workers 2 "
            "--max-workers 2), or neither to let TorchServe's settings choose"
        )
    if min_workers > max_workers:
        raise ValueError(f"minWorkers ({min_workers}) must not exceed maxWorkers ({max_workers})")
    return {"minWorkers": min_workers, "maxWorkers": max_workers}


def gpu_workers(gpus: int) -> int | None:
    """Workers of a GPU archive built on a machine with ``gpus`` GPUs: WORKERS_PER_GPU each
    (TorchServe hands workers GPUs round-robin); None leaves the count to TorchServe."""
    return WORKERS_PER_GPU * gpus if gpus > 0 else None


def local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def detect_device_type() -> str:
    """gpu when this machine has CUDA (the archive then asks TorchServe for GPU workers)."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def _relation_fanouts(path: Path | None) -> dict[str, tuple[int, ...]]:
    """``--fanouts-file``'s fanouts per relation (ValueError naming the file otherwise)."""
    if path is None:
        return {}
    try:
        return parse_relation_fanouts(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, ValueError) as error:
        raise ValueError(f"--fanouts-file {path}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="YAML file to write")
    parser.add_argument(
        "--model-config", type=Path, required=True, help="model_config.json (its num_layers = hops)"
    )
    parser.add_argument("--fanouts", help="comma list, -1 = all; default 25 then 10 per hop")
    parser.add_argument(
        "--fanouts-file",
        type=Path,
        help='fanouts per relation of a typed graph, JSON {"user__pays__merchant": [10, 5]}',
    )
    parser.add_argument(
        "--batch-size", type=int, help="TorchServe batchSize (default 8; on GPU workers 16)"
    )
    parser.add_argument(
        "--max-batch-delay", type=int, help="maxBatchDelay in ms (default 5; on GPU workers 2)"
    )
    parser.add_argument(
        "--min-workers", type=int, help="minWorkers (with --max-workers); default: not written"
    )
    parser.add_argument(
        "--max-workers", type=int, help="maxWorkers (with --min-workers); default: not written"
    )
    parser.add_argument("--response-timeout", type=int, default=60, help="responseTimeout, s")
    parser.add_argument("--startup-timeout", type=int, default=300, help="startupTimeout, s")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "gpu"), default="auto", help="deviceType"
    )
    parser.add_argument("--sampling-seed", type=int, default=0, help="seed of the sampler")
    defaults = ServingSettings()
    parser.add_argument(
        "--max-ids", type=int, default=defaults.max_ids_per_request, help="node IDs per request"
    )
    parser.add_argument(
        "--max-subgraph-nodes",
        type=int,
        default=defaults.max_subgraph_nodes,
        help="sampled ego-graph nodes per request; more is answered 413",
    )
    parser.add_argument(
        "--max-subgraph-edges",
        type=int,
        default=defaults.max_subgraph_edges,
        help="sampled ego-graph edges per request; more is answered 413",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=defaults.torch_threads,
        help="intra-op threads per worker (0 = one per core)",
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=defaults.metrics_interval_s,
        help="seconds of batches summed per metrics report and log line (0 = every batch)",
    )
    parser.add_argument(
        "--enable-updates", action="store_true", help="accept live graph updates (needs a secret)"
    )
    parser.add_argument(
        "--update-state-dir", default="", help="directory of the update log (outside the archive)"
    )
    parser.add_argument(
        "--update-secret-file", default="", help="file holding the update secret at serve time"
    )
    parser.add_argument(
        "--update-follow-interval",
        type=float,
        default=defaults.update_follow_interval_ms,
        help="ms between a worker's checks of the update log between batches (0 = no follower)",
    )
    parser.add_argument(
        "--min-version-wait",
        type=float,
        default=defaults.min_version_wait_ms,
        help="ms a prediction with min_graph_version may wait for the log (then 503)",
    )
    _add_task_options(parser, defaults)
    _add_graph_options(parser)
    args = parser.parse_args(argv)
    model_config = json.loads(args.model_config.read_text())
    num_layers = int(model_config["num_layers"])
    try:
        _check_task_options(args)
        if args.fanouts_file and not model_config.get("hetero"):
            raise ValueError(
                "--fanouts-file names relations of a graph of several; this graph has one "
                "(give --fanouts)"
            )
        graph_location, graph_checksum = _graph_reference(args)
        fanouts = parse_fanouts(args.fanouts) if args.fanouts else default_fanouts(num_layers)
        if args.task != "graph" and len(fanouts) != num_layers:
            raise ValueError(
                f"--fanouts {args.fanouts} names {len(fanouts)} hops but the model has "
                f"{num_layers} layers; give one fanout per layer"
            )
        settings = ServingSettings(
            fanouts=fanouts,
            relation_fanouts=_relation_fanouts(args.fanouts_file),
            sampling_seed=args.sampling_seed,
            max_ids_per_request=args.max_ids,
            max_subgraph_nodes=args.max_subgraph_nodes,
            max_subgraph_edges=args.max_subgraph_edges,
            torch_threads=args.torch_threads,
            metrics_interval_s=args.metrics_interval,
            updates_enabled=args.enable_updates,
            update_state_dir=args.update_state_dir,
            update_secret_file=args.update_secret_file,
            update_follow_interval_ms=args.update_follow_interval,
            min_version_wait_ms=args.min_version_wait,
            task=args.task,
            max_top_k=args.max_top_k,
            max_graph_nodes=args.max_graph_nodes,
            max_graph_edges=args.max_graph_edges,
            explain_steps=args.explain_steps,
            explain_time_budget_ms=args.explain_budget_ms,
            explain_top_k=args.explain_top_k,
            verify_checksum=not args.no_verify_checksum,
            graph_location=graph_location,
            graph_checksum=graph_checksum,
            remote_cache_mb=args.remote_cache_mb,
            remote_timeout_ms=args.remote_timeout_ms,
            sampling_device=args.sampling_device,
            gpu_feature_fraction=args.gpu_feature_fraction,
            cuda_graphs=not args.no_cuda_graphs,
        )
        settings = ServingSettings.from_yaml_section(settings.to_yaml_section())
        device = detect_device_type() if args.device == "auto" else args.device
        batching = BATCHING[device]
        args.batch_size = batching[0] if args.batch_size is None else args.batch_size
        args.max_batch_delay = batching[1] if args.max_batch_delay is None else args.max_batch_delay
        if device == "gpu" and args.min_workers is None and args.max_workers is None:
            args.min_workers = args.max_workers = gpu_workers(local_gpu_count())
        config = torchserve_section(
            args.batch_size,
            args.max_batch_delay,
            args.min_workers,
            args.max_workers,
            args.response_timeout,
            args.startup_timeout,
            device,
        )
        check_explain_budget(
            args.batch_size, args.response_timeout, settings.explain_time_budget_ms
        )
    except (ValueError, StoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config["gnn"] = settings.to_yaml_section()
    args.out.write_text(yaml.safe_dump(config, sort_keys=False))
    return 0


def _add_task_options(parser: argparse.ArgumentParser, defaults: ServingSettings) -> None:
    """The task and its settings: link top-k, inline graph limits, explanations."""
    parser.add_argument("--task", choices=TASKS, default=defaults.task, help="the archive's task")
    parser.add_argument(
        "--max-top-k", type=int, default=defaults.max_top_k, help="link: largest top_k"
    )
    parser.add_argument(
        "--max-graph-nodes",
        type=int,
        default=defaults.max_graph_nodes,
        help="graph: nodes of an inline graph; more is answered 413",
    )
    parser.add_argument(
        "--max-graph-edges",
        type=int,
        default=defaults.max_graph_edges,
        help="graph: edges of an inline graph; more is answered 413",
    )
    parser.add_argument(
        "--explain-steps",
        type=int,
        default=defaults.explain_steps,
        help="Integrated Gradients steps of an explanation",
    )
    parser.add_argument(
        "--explain-budget-ms",
        type=int,
        default=defaults.explain_time_budget_ms,
        help="time budget of one explanation; fewer steps when they would not fit",
    )
    parser.add_argument(
        "--explain-top-k",
        type=int,
        default=defaults.explain_top_k,
        help="nodes, edges and features an explanation lists",
    )


def _add_graph_options(parser: argparse.ArgumentParser) -> None:
    """Where workers find the graph, and what they check of it at start."""
    parser.add_argument(
        "--graph-location",
        help="serve the store in this directory in place instead of a copy in the archive "
        "(its checksum is read from its meta.json), or the graph loaded into Redis at "
        "redis[s]://host:port/NAME (with --graph-store)",
    )
    parser.add_argument(
        "--graph-store",
        type=Path,
        help="with a redis:// --graph-location: the local store the build read, whose "
        "checksum the graph in Redis must have",
    )
    parser.add_argument(
        "--sampling-device",
        choices=SAMPLING_DEVICES,
        default=ServingSettings.sampling_device,
        help="GPU workers: where they sample ego-graphs",
    )
    parser.add_argument(
        "--gpu-feature-fraction",
        type=float,
        default=ServingSettings.gpu_feature_fraction,
        help="GPU workers: share of free GPU memory the stored features may take (0 = host)",
    )
    parser.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="GPU workers: run the forward eagerly instead of as captured CUDA graphs",
    )
    parser.add_argument(
        "--remote-cache-mb",
        type=float,
        default=ServingSettings.remote_cache_mb,
        help="a graph in Redis: MB each worker's caches take in all (IDs and fetched blocks)",
    )
    parser.add_argument(
        "--remote-timeout-ms",
        type=int,
        default=ServingSettings.remote_timeout_ms,
        help="a graph in Redis: how long one read may wait for Redis",
    )
    parser.add_argument(
        "--no-verify-checksum",
        action="store_true",
        help="workers check the graph's sizes, meta.json and structure at start but do not "
        "re-hash its files",
    )


def _graph_reference(args: argparse.Namespace) -> tuple[str, str]:
    """(location, checksum) of a store served by reference, or two empty strings."""
    if args.graph_location is None:
        return "", ""
    if args.task == "graph":
        raise ValueError(
            "--graph-location applies to node and link archives; a graph archive "
            "serves no stored graph"
        )
    if is_remote(args.graph_location):
        return _remote_reference(args)
    location = Path(os.path.abspath(args.graph_location))
    return str(location), read_meta(location)["checksum"]


def _remote_reference(args: argparse.Namespace) -> tuple[str, str]:
    """The graph in Redis, after checking it is the build's store, completely loaded: what a
    worker checks at start, refused here first (ValueError, one line)."""
    if args.graph_store is None:
        raise ValueError("a redis:// --graph-location needs --graph-store (the store loaded there)")
    where = parse_location(args.graph_location)
    checksum = read_meta(args.graph_store)["checksum"]
    graph = open_remote_store(
        where.url, where.prefix, checksum, cache_mb=0, timeout_ms=args.remote_timeout_ms
    )
    graph.close()
    return args.graph_location, checksum


def _check_task_options(args: argparse.Namespace) -> None:
    if args.task == "graph" and args.fanouts:
        raise ValueError(
            "--fanouts applies to node and link archives; a graph archive samples none"
        )
    if args.task == "graph" and args.enable_updates:
        raise ValueError(
            "--enable-updates applies to node and link archives; a graph archive's graphs "
            "come with each request"
        )


if __name__ == "__main__":
    sys.exit(main())
