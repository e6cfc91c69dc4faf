"""Where a worker's stored graph comes from: the archive's own copy, mapped through the cache
that every archive version with the same graph shares (graph_assets.shared), or that copy itself
when the archive says not to share."""

from __future__ import annotations

import tempfile
from pathlib import Path

from graph_assets import GraphStore, open_store, share_store
from handler.core.settings import ServingSettings

GRAPH_CACHE = "gnnserve-graph-cache"


def open_graph(model_dir: Path, settings: ServingSettings) -> GraphStore:
    """The archive's graph store, opened and checked (``settings.verify_checksum``)."""
    graph_dir = model_dir / settings.graph_dir
    if settings.share_graph:
        cache = Path(settings.graph_cache_dir or Path(tempfile.gettempdir()) / GRAPH_CACHE)
        graph_dir = share_store(graph_dir, cache)
    return open_store(graph_dir, verify_checksum=settings.verify_checksum)
