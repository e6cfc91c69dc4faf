"""One rule for reaching the Redis that holds a graph: a single Redis or a Redis Cluster at a
``redis://`` or ``rediss://`` (TLS) URL, whichever answers there, with the password read from
``GNNSERVE_REDIS_PASSWORD_FILE`` as the update log reads it (graph_assets.live.redis_log), never
from the environment itself, and never shown."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from graph_assets.live.redis_log import read_password_file, shown_url
from graph_assets.remote.errors import RemoteGraphError, RemoteUnavailable

PASSWORD_FILE_VARIABLE = "GNNSERVE_REDIS_PASSWORD_FILE"
# Every failure of the client library: a Redis error, or the cluster client's own (no node
# reachable, slots not covered), which is not one.
REDIS_FAILURES = (redis.RedisError, RedisClusterException)
# Every command and every round is tried once: a read that fails is answered 503 with
# Retry-After and the caller tries again, rather than the worker waiting out the timeout once
# more per retry while its batch waits.
_NO_RETRY = Retry(NoBackoff(), 0)

Client = redis.Redis | RedisCluster
T = TypeVar("T")


def connect(url: str, timeout_ms: int, environ: Mapping[str, str] | None = None) -> Client:
    """A client of the Redis at ``url``: a `RedisCluster` when the server there runs in cluster
    mode (a cluster has only database 0), else a `redis.Redis`. Every command times out after
    ``timeout_ms``. RemoteUnavailable when nothing usable answers; RemoteGraphError for a URL
    that is not ``redis://`` or ``rediss://``, or a password file that is unsafe or unreadable."""
    shown = shown_url(url)
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise RemoteGraphError(
            f"a graph's Redis URL is redis://host:port or rediss://host:port (TLS), got {shown!r}"
        )
    env = os.environ if environ is None else environ
    password_file = env.get(PASSWORD_FILE_VARIABLE, "").strip()
    options: dict[str, Any] = {
        "socket_timeout": timeout_ms / 1000,
        "socket_connect_timeout": timeout_ms / 1000,
    }
    if password_file:
        try:
            options["password"] = read_password_file(password_file)
        except (OSError, ValueError) as error:
            raise RemoteGraphError(f"{PASSWORD_FILE_VARIABLE}: {one_line(error)}") from None
    single = redis.Redis.from_url(url, retry=_NO_RETRY, **options)
    try:
        info = guarded(shown, lambda: single.info("cluster"))
    except RemoteUnavailable:
        single.close()
        raise
    if not info.get("cluster_enabled"):
        return single
    single.close()
    return guarded(shown, lambda: RedisCluster.from_url(url, retry=_NO_RETRY, **options))


def execute(client: Client, pipe: Any, shown: str) -> list[Any]:
    """A pipeline's replies in one round, which fails as a whole (RemoteUnavailable) once a
    node it needs does not answer within the timeout, is down, or has handed its slots on.

    redis-py's cluster pipeline would send each failed command again alone, waiting out the
    timeout once more for each (a stopped primary held a read of 17 blocks for 4 s at a 200 ms
    timeout) and following MOVED replies one by one. Here a failed round refreshes the slot
    map instead, so that the next read goes to the replica promoted in a failed primary's
    place; until the cluster has promoted it, reads fail fast and are never answered from
    another node's data."""
    if not isinstance(client, RedisCluster):
        return guarded(shown, pipe.execute)
    stack = pipe._execution_strategy.command_queue  # the queued commands (redis==8.1.0, pinned)
    try:
        return guarded(shown, lambda: pipe.send_cluster_commands(stack, allow_redirections=False))
    except RemoteUnavailable:
        with contextlib.suppress(*REDIS_FAILURES):  # the read failed already; the next retries
            client.nodes_manager.initialize()
        raise
    finally:
        pipe.reset()


def guarded(shown: str, call: Callable[[], T]) -> T:
    """``call()``, with any failure of Redis or the client raised as RemoteUnavailable naming
    the URL (``shown``: without its password)."""
    try:
        return call()
    except REDIS_FAILURES as error:
        raise RemoteUnavailable(f"Redis at {shown} cannot be used: {one_line(error)}") from None


def one_line(error: BaseException) -> str:
    """An exception's text on one line (some of redis-py's span several)."""
    return " ".join(str(error).split()) or type(error).__name__
