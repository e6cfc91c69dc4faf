"""Where a worker's stored graph comes from: the archive's own copy, mapped through the cache
that every archive version with the same graph shares (graph_assets.stored.shared), or that
copy itself when the archive says not to share; or, for an archive built with
``--graph-location``, a store outside the archive, mapped where it is and never written (it may
be a read-only volume); or, for ``--graph-location redis://host:port/NAME``, the graph loaded
into Redis under NAME, read in batches (graph_assets.remote).

An archive of the last kind can be pointed at another Redis without a rebuild (the same archive
on a staging and a production cluster, the URL from a Kubernetes Secret): ``GNNSERVE_GRAPH_URL``
replaces the URL it records, and ``GNNSERVE_GRAPH_PASSWORD_FILE`` the password file that the
update log's ``GNNSERVE_REDIS_PASSWORD_FILE`` names, for a graph whose cluster is not the log's.
The checksum the archive records is checked all the same."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from graph_assets import GraphStore, StoreError, open_store, read_meta, share_store
from graph_assets.remote import RemoteGraphError, RemoteStore, open_remote_store
from graph_assets.remote.connect import PASSWORD_FILE_VARIABLE
from graph_assets.remote.location import RemoteLocation, is_remote, parse_location
from handler.settings import ServingSettings

GRAPH_CACHE = "gnnserve-graph-cache"
GRAPH_URL_VARIABLE = "GNNSERVE_GRAPH_URL"
GRAPH_PASSWORD_FILE_VARIABLE = "GNNSERVE_GRAPH_PASSWORD_FILE"
_T = TypeVar("_T")
# The graph a worker serves: mapped here, or read from Redis through the same view.
ServedGraph = GraphStore | RemoteStore


def open_graph(
    model_dir: Path, settings: ServingSettings, environ: Mapping[str, str] | None = None
) -> ServedGraph:
    """The archive's graph, opened and checked (``settings.verify_checksum``); ``environ``
    (default ``os.environ``) may point a graph in Redis elsewhere (`remote_location`)."""
    env = os.environ if environ is None else environ
    if is_remote(settings.graph_location):
        return open_remote_graph(settings, env)
    if env.get(GRAPH_URL_VARIABLE, "").strip():
        raise StoreError(
            f"{GRAPH_URL_VARIABLE} is set but this archive's graph is "
            f"{settings.graph_location or 'in the archive'}, not in Redis: unset it, or build "
            "the archive with ./build_mar.sh --graph-location redis://host:port/NAME"
        )
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


def open_remote_graph(settings: ServingSettings, environ: Mapping[str, str]) -> RemoteStore:
    """The graph in Redis at `remote_location`, refused (`StoreError`, one line) unless it is
    the graph the archive was built with, completely loaded in a layout this version reads, and
    Redis answers within ``remote_timeout_ms``."""
    where, source = remote_location(settings, environ)
    password_file = environ.get(GRAPH_PASSWORD_FILE_VARIABLE, "").strip()
    if password_file:
        environ = {**environ, PASSWORD_FILE_VARIABLE: password_file}
    try:
        return open_remote_store(
            where.url,
            where.prefix,
            settings.graph_checksum,
            cache_mb=settings.remote_cache_mb,
            timeout_ms=settings.remote_timeout_ms,
            environ=environ,
        )
    except StoreError as error:  # RemoteGraphError or RemoteUnavailable, each naming the URL
        raise type(error)(f"{source}: {error}") from None


def remote_location(
    settings: ServingSettings, environ: Mapping[str, str]
) -> tuple[RemoteLocation, str]:
    """Where the graph is and what said so: ``GNNSERVE_GRAPH_URL`` when set (same
    ``redis[s]://host:port/NAME`` rules, RemoteGraphError in one line for a malformed value),
    else the archive's ``graph_location``."""
    override = environ.get(GRAPH_URL_VARIABLE, "").strip()
    if not override:
        return parse_location(settings.graph_location), "graph_location"
    try:
        return parse_location(override), GRAPH_URL_VARIABLE
    except ValueError as error:  # its text quotes the value: never a password in it
        hidden = "a URL holding a password" if urlsplit(override).password else override
        raise RemoteGraphError(
            f"{GRAPH_URL_VARIABLE}: {str(error).replace(override, hidden)}"
        ) from None
