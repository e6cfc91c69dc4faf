"""Where a worker's stored graph comes from: the archive's own copy, mapped through the cache
that every archive version with the same graph shares (graph_assets.stored.shared), or that
copy itself when the archive says not to share; or, for an archive built with
``--graph-location``, a store outside the archive, mapped where it is and never written (it may
be a read-only volume); or, for ``--graph-location redis://host:port/NAME``, the graph loaded
into Redis under NAME, read in batches (graph_assets.remote)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from graph_assets import GraphStore, StoreError, open_store, read_meta, share_store
from graph_assets.remote import RemoteStore, open_remote_store
from graph_assets.remote.location import is_remote, parse_location
from handler.settings import ServingSettings

GRAPH_CACHE = "gnnserve-graph-cache"
_T = TypeVar("_T")
# The graph a worker serves: mapped here, or read from Redis through the same view.
ServedGraph = GraphStore | RemoteStore


def open_graph(model_dir: Path, settings: ServingSettings) -> ServedGraph:
    """The archive's graph, opened and checked (``settings.verify_checksum``)."""
    if is_remote(settings.graph_location):
        return open_remote_graph(settings)
    if settings.graph_location:
        return open_referenced_graph(
            Path(settings.graph_location), settings.graph_checksum, settings.verify_checksum
        )
    graph_dir = model_dir / settings.graph_dir
    if settings.share_graph:
        cache = Path(settings.graph_cache_dir or Path(tempfile.gettempdir()) / GRAPH_CACHE)
        graph_dir = share_store(graph_dir, cache)
    return open_store(graph_dir, verify_checksum=settings.verify_checksum)


def open_referenced_graph(location: Path, checksum: str, verify_checksum: bool) -> GraphStore:
    """The store at ``location``, refused (`StoreError`, one line) unless it is the graph the
    archive was built with. meta.json's checksum is compared first, so a store that is plainly
    another graph is refused before any array is read; ``verify_checksum`` then re-hashes every
    file, which is what catches a file changed behind an unchanged meta.json."""
    where = f"graph store {location} (graph_location)"
    fix = (
        f"mount the store this archive was built with (checksum {checksum}) at {location}, or "
        "rebuild the archive with ./build_mar.sh --graph-location DIR for the store you have"
    )
    if not location.is_dir():
        raise StoreError(f"{where} is missing: {fix}")

    def checked(read: Callable[[], _T]) -> _T:
        try:
            return read()
        except StoreError as error:
            raise StoreError(f"{where} is refused: {error}") from error

    def same_graph(found: str) -> None:
        if found != checksum:
            raise StoreError(f"{where} has checksum {found} in its meta.json: {fix}")

    same_graph(checked(lambda: read_meta(location))["checksum"])
    store = checked(lambda: open_store(location, verify_checksum=verify_checksum))
    same_graph(store.checksum)  # meta.json as open_store read it: replaced in between?
    return store


def open_remote_graph(settings: ServingSettings) -> RemoteStore:
    """The graph in Redis at ``graph_location``, refused (`StoreError`, one line) unless it is
    the graph the archive was built with, completely loaded in a layout this version reads, and
    Redis answers within ``remote_timeout_ms``."""
    where = parse_location(settings.graph_location)
    try:
        return open_remote_store(
            where.url,
            where.prefix,
            settings.graph_checksum,
            cache_mb=settings.remote_cache_mb,
            timeout_ms=settings.remote_timeout_ms,
        )
    except StoreError as error:  # RemoteGraphError or RemoteUnavailable, each naming the URL
        raise type(error)(f"graph_location: {error}") from None


def mapped_graph(graph: ServedGraph, what: str) -> GraphStore:
    """``graph`` when it is mapped here; StoreError (one line) naming ``what`` needs it when it
    is read from Redis (``what`` reads whole-graph arrays: the CSC, every node's rows)."""
    if isinstance(graph, GraphStore):
        return graph
    raise StoreError(
        f"{what} needs the graph mapped on this machine; this archive reads it from Redis "
        f"({graph.shown} prefix {graph.keys.prefix}): rebuild it with --graph-location DIR, or "
        "without that feature"
    )
