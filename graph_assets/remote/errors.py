"""The two ways a graph in Redis fails a reader or a loader, each a one-line message."""

from __future__ import annotations

from graph_assets.errors import StoreError


class RemoteGraphError(StoreError):
    """The graph in Redis cannot be used as asked: a URL that is not Redis's, an unsafe
    password file, no graph under the prefix, another graph's checksum, a load not finished,
    another layout, or data lost (evicted or deleted keys). Permanent until someone fixes the
    configuration or loads the graph again; a server refuses to start on it."""


class RemoteUnavailable(StoreError):
    """Redis cannot be used right now: unreachable, refusing the password, failing over, or
    slower than the timeout. Nothing was read or written; a later try may succeed."""
