"""The ways a graph in Redis fails a reader or a loader, each a one-line message."""

from __future__ import annotations

from graph_assets.errors import StoreError


class RemoteGraphError(StoreError):
    """The graph in Redis cannot be used as asked: a URL that is not Redis's, an unsafe
    password file, no graph under the prefix, another graph's checksum, a load not finished,
    another layout, or data lost or corrupt. Permanent until someone fixes the configuration or
    loads the graph again; a server refuses to start on it."""


class RemoteDataLost(RemoteGraphError):
    """A key a read needs is gone (evicted or deleted). Only the requests that read it fail
    (the serving layer answers them 503 and logs ``key``); loading the graph again restores
    it."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class RemoteDataCorrupt(RemoteGraphError):
    """A value read is not what the load wrote: it fails its checksum, has the wrong size or
    pointers, holds a non-finite feature, or an ID-map entry points at another node's row.
    Never answered from: the requests that read it fail (the serving layer answers them 503 and
    logs ``key``); loading the graph again rewrites it."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class RemoteUnavailable(StoreError):
    """Redis cannot be used right now: unreachable, refusing the password, failing over, or
    slower than the timeout. Nothing was read or written; a later try may succeed."""
