"""One-type stores as earlier versions of the format wrote them, to check they still open."""

from __future__ import annotations

import json
from pathlib import Path

from graph_assets.stored.store import META_FILE, combined_checksum

# Version 3's per-type and per-relation names of what versions 1 and 2 named once.
_V2_NAMES = {
    "ids.0.npy": "ids.npy",
    "features.0.npy": "features.npy",
    "edge_features.0.npy": "edge_features.npy",
    "removed_ids.0.npy": "removed_ids.npy",
}


def as_version_2(path: Path) -> Path:
    """Rewrite the one-type version 3 store at ``path`` as version 2 wrote it: one ids,
    features and edge_features file, the type described by top-level meta keys."""
    meta = json.loads((path / META_FILE).read_text())
    [node_type], [relation] = meta.pop("node_types"), meta.pop("edge_types")
    del meta["target_node_type"]
    meta.update(
        format_version=2,
        feature_dim=node_type["feature_dim"],
        id_kind=node_type["id_kind"],
        edge_feature_dim=len(relation["edge_feature_names"]),
        edge_feature_names=relation["edge_feature_names"],
    )
    for new, old in _V2_NAMES.items():
        if new in meta["files"]:
            (path / new).rename(path / old)
            meta["files"][old] = meta["files"].pop(new)
    _write(path, meta)
    return path


def as_version_1(path: Path) -> Path:
    """Rewrite a one-type version 3 store without edge features as version 1 wrote it: no
    edge_features.npy, no edge feature keys, no kept counts."""
    as_version_2(path)
    meta = json.loads((path / META_FILE).read_text())
    (path / "edge_features.npy").unlink()
    del meta["files"]["edge_features.npy"], meta["edge_feature_dim"], meta["edge_feature_names"]
    del meta["stats"]["self_loops_kept"], meta["stats"]["duplicate_edges_kept"]
    meta["format_version"] = 1
    _write(path, meta)
    return path


def _write(path: Path, meta: dict) -> None:
    meta["checksum"] = combined_checksum(
        {k: v["sha256"] for k, v in meta["files"].items()}, meta.get("update_log")
    )
    (path / META_FILE).write_text(json.dumps(meta, indent=2))
