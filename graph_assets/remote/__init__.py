"""A graph in Redis (a Redis Cluster or a single Redis): the layout of its keys, the loader
that copies a store there (``python -m graph_assets load-redis``), and `RemoteStore`, which
reads it in pipelined batches behind the same reads as the memory-mapped store."""

from graph_assets.remote.errors import (
    RemoteDataCorrupt,
    RemoteDataLost,
    RemoteGraphError,
    RemoteUnavailable,
)
from graph_assets.remote.loader import LoadReport, load_store
from graph_assets.remote.reader import InLists, RemoteCounters, RemoteStore, open_remote_store

__all__ = [
    "InLists",
    "LoadReport",
    "RemoteCounters",
    "RemoteDataCorrupt",
    "RemoteDataLost",
    "RemoteGraphError",
    "RemoteStore",
    "RemoteUnavailable",
    "load_store",
    "open_remote_store",
]
