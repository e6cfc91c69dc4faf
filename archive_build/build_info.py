"""Writes ``build_info.json``: what an archive holds, so operators can tell versions apart.

It records the model name and version, the graph's checksum and size, the architecture, the
training metrics and the build time; it travels in the ``.mar`` (unzip it to read it).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from graph_assets.stored.store import schema_of


def build_info(
    name: str,
    version: str,
    graph_meta: dict[str, Any],
    metrics: dict[str, Any],
    model_config: dict[str, Any],
    verification: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The archive's identity card (all JSON-serializable); ``graph_meta`` is a store's or a
    graph dataset's meta.json."""
    return {
        "name": name,
        "version": version,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "graph": {
            "checksum": graph_meta["checksum"],
            "nodes": graph_meta["num_nodes"],
            "edges": graph_meta["num_edges"],
            **_types(graph_meta),
        },
        "model": model_config,
        "metrics": metrics,
        "verification": verification,
    }


def _types(graph_meta: dict[str, Any]) -> dict[str, Any]:
    """The served type's feature width; a graph of several types names them all."""
    if "feature_dim" in graph_meta:  # a graph dataset, or a one-type store of version 1 or 2
        return {"feature_dim": graph_meta["feature_dim"]}
    schema = schema_of(graph_meta)
    described: dict[str, Any] = {"feature_dim": schema.target_type.feature_dim}
    if not schema.is_homogeneous:
        described.update(
            target_node_type=schema.target,
            node_types=schema.node_type_names,
            edge_types=schema.edge_type_names,
        )
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True, help="model name")
    parser.add_argument("--version", required=True, help="model version")
    parser.add_argument("--graph", type=Path, required=True, help="serialized graph directory")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics.json of training")
    parser.add_argument("--model-config", type=Path, required=True, help="model_config.json")
    parser.add_argument(
        "--verification",
        help="the build-time verification's JSON, or 'none' when it was skipped (--no-verify)",
    )
    parser.add_argument("--out", type=Path, required=True, help="file to write")
    args = parser.parse_args(argv)
    verification = None
    if args.verification == "none":
        verification = {"skipped": True}
    elif args.verification:
        verification = json.loads(Path(args.verification).read_text())
    info = build_info(
        args.name,
        args.version,
        json.loads((args.graph / "meta.json").read_text()),
        json.loads(args.metrics.read_text()),
        json.loads(args.model_config.read_text()),
        verification,
    )
    args.out.write_text(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
