"""The update log of one lineage on a Redis stream, shared by every server that serves it.

The file log (graph_assets.live.update_log) serves one machine; this one serves many replicas. One
stream per lineage, key ``gnnserve:updates:<lineage base checksum>``; one entry per record, its
ID ``<seq>-0``, its field ``operations`` (JSON, graph_assets.live.operations' canonical form) and
``format`` (that form's version; an entry without it is format 1). Redis refuses an entry whose
ID is not above the stream's last one, so two writers can never both write a seq: the loser gets
:class:`UpdateLogConflict`, catches up and validates its update again. No lock, no home-made
replication: durability is what the operator configures on Redis (AOF with ``appendfsync always``
makes an entry durable before Redis answers; ``WAIT`` with ``wait_replicas`` waits until that
many replicas hold it), docs/dynamic-graphs.md.

A log started for a compacted store begins with a start marker at the store's last folded seq
(no operations), as the file log does, so a store never continues a stream that lost records.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from graph_assets.errors import (
    UpdateLogConflict,
    UpdateLogCorrupt,
    UpdateLogMismatch,
    UpdateLogUnavailable,
    UpdateLogWriteFailed,
    UpdateNotReplicated,
)
from graph_assets.live.log_lineage import Lineage
from graph_assets.live.operations import LOG_FORMAT
from graph_assets.live.update_log import MAX_RECORD_BYTES, LogRecord, TornTail, checked_content

logger = logging.getLogger(__name__)

KEY_PREFIX = "gnnserve:updates:"
_FIELD = b"operations"
_FORMAT_FIELD = b"format"  # graph_assets.live.operations.LOG_FORMAT; absent: format 1
_FIELDS = {_FIELD, _FORMAT_FIELD}
_PAGE = 10_000  # entries per XRANGE call while replaying
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


@dataclass(frozen=True)
class RedisLogConfig:
    """Where the log is and what an acknowledgement waits for.

    Attributes:
        url: ``redis://[user:password@]host:port/db`` or ``rediss://`` (TLS).
        password_file: a file holding the password (kept out of the URL and the environment).
        wait_replicas: acknowledge only after ``WAIT`` confirms this many replicas (0: do not).
        wait_timeout_ms: how long ``WAIT`` may take before the update is refused (503).
        timeout_s: socket timeout of every command, so a lost server costs a batch this much at
            most once (the follower then backs off).
    """

    url: str
    password_file: str = ""
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    timeout_s: float = 1.0

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> RedisLogConfig | None:
        """``GNNSERVE_UPDATE_LOG_URL`` and its companions; None when the URL is unset."""
        env = os.environ if environ is None else environ
        url = env.get("GNNSERVE_UPDATE_LOG_URL", "").strip()
        if not url:
            return None
        if urlsplit(url).scheme not in ("redis", "rediss"):
            raise ValueError(
                f"GNNSERVE_UPDATE_LOG_URL must be redis://host:port/db or rediss://...; got "
                f"{shown_url(url)!r}"
            )
        return cls(
            url=url,
            password_file=env.get("GNNSERVE_REDIS_PASSWORD_FILE", "").strip(),
            wait_replicas=_non_negative(env, "GNNSERVE_REDIS_WAIT_REPLICAS", 0),
            wait_timeout_ms=_non_negative(env, "GNNSERVE_REDIS_WAIT_TIMEOUT_MS", 1000),
        )

    def client(self) -> redis.Redis:
        password = read_password_file(self.password_file) if self.password_file else None
        return redis.Redis.from_url(
            self.url,
            password=password,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry_on_timeout=False,
        )


def _non_negative(env: Any, name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{name} must be a non-negative integer; got {raw!r}")
    return int(raw)


def read_password_file(path: str) -> str:
    """The Redis password; the file must not be writable by group or others nor readable by
    others (group-readable is how Kubernetes mounts a Secret for a pod's ``fsGroup``)."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IWGRP | stat.S_IRWXO):
        raise ValueError(
            f"Redis password file {path} has mode {stat.filemode(mode)}: whoever can read or "
            f"change it can change the graph; chmod 600 {path} (or 640)"
        )
    return open(path, encoding="utf-8").read().strip()


def shown_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, parts.query, ""))


class RedisUpdateLog:
    """The stream of one lineage. Positions are seqs: ``read_from(p)`` returns the records
    after seq ``p``, ``size()`` the stream's last seq."""

    writable = True
    torn_tail: TornTail | None = None  # an XADD is whole or absent

    # A writer validated its update against seq - 1: write it only if the stream ends there, in
    # one round trip (the stream's last seq is returned; the record was written iff it is
    # seq - 1). Redis runs a script atomically, so no other entry can come in between.
    _APPEND_AFTER = """
    local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    local top = 0
    if last[1] then top = tonumber(string.match(last[1][1], '^(%d+)')) end
    if top == tonumber(ARGV[1]) - 1 then
        redis.call('XADD', KEYS[1], ARGV[1] .. '-0', 'operations', ARGV[2], 'format', ARGV[3])
    end
    return top
    """

    # Written before a record: the file log's writer holds a lock from its catch-up read to its
    # append; this one needs no read first (the append refuses a stale seq).
    catch_up_before_append = False

    def __init__(self, client: redis.Redis, key: str, config: RedisLogConfig) -> None:
        self.client = client
        self.key = key
        self.config = config
        self.path = f"{shown_url(config.url)} stream {key}"
        self._append_after = client.register_script(self._APPEND_AFTER)

    def read_from(self, position: int, locked: bool = False) -> tuple[list[LogRecord], int]:
        """Every record after seq ``position``, in seq order, and the last seq read."""
        records: list[LogRecord] = []
        start = f"{position + 1}-0"
        while True:
            entries = self._call(self.client.xrange, self.key, min=start, max="+", count=_PAGE)
            for entry_id, fields in entries:
                seq, operations = self._parsed(_seq_of(entry_id), fields)
                records.append(LogRecord(seq, operations, offset=seq - 1, end=seq))
            if len(entries) < _PAGE:
                break
            start = f"{records[-1].seq + 1}-0"
        return records, records[-1].end if records else position

    def size(self) -> int:
        """The last seq in the stream (0 for none): one round trip."""
        last = self._call(self.client.xrevrange, self.key, max="+", min="-", count=1)
        return _seq_of(last[0][0]) if last else 0

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No lock: Redis refuses a second entry for one seq (``append`` raises a conflict)."""
        yield

    def append(self, operations: list[dict[str, Any]], seq: int, at: int) -> int:
        """Adds the record of ``seq`` (``at`` is ``seq - 1``, the position it follows) and waits
        for the configured replicas. Returns ``seq``."""
        payload = json.dumps(operations, allow_nan=False)
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"an update record of {len(payload)} bytes is over the limit")
        try:
            last = int(
                self._call(self._append_after, keys=[self.key], args=[seq, payload, LOG_FORMAT])
            )
        except UpdateLogUnavailable as lost:
            # Redis may have run the script before it stopped answering: say so, never that
            # nothing was written (the client would send it again; an add_edge would double).
            raise UpdateLogUnavailable(
                f"{lost}; the update may have been written as seq {seq}: once the log is back, "
                f"read graph_version and send the update again only if it is below +{seq}"
            ) from None
        except redis.ResponseError as error:
            # Refused whole (out of memory under noeviction, a read-only replica, ...): like a
            # full disk for the file log, nothing of it is in the stream.
            full = errno.ENOSPC if isinstance(error, redis.OutOfMemoryError) else None
            raise UpdateLogWriteFailed(
                full, f"update log {self.path} refused the record: {error}", rolled_back=True
            ) from None
        if last >= seq:
            raise UpdateLogConflict(
                f"update log {self.path}: seq {seq} was written by another server first"
            )
        if last != seq - 1:
            raise UpdateLogMismatch(
                f"update log {self.path} ends at seq {last}, but this server holds seq {seq - 1}: "
                "the log lost acknowledged records (was Redis restarted without its append-only "
                "file?); nothing was written"
            )
        self._wait_for_replicas(seq)
        return seq

    def start_after(self, seq: int) -> bool:
        """Writes a start marker for ``seq`` into an empty stream; True if this call did."""
        try:
            self._call(self.client.xadd, self.key, {_FIELD: "[]"}, id=f"{seq}-0")
        except redis.ResponseError:
            return False  # someone else started it (or it is not empty): checked by the caller
        return True

    def holds(self, seq: int) -> bool:
        """Whether the stream holds the record (or start marker) of ``seq``."""
        entry = f"{seq}-0"
        return bool(self._call(self.client.xrange, self.key, min=entry, max=entry, count=1))

    def close(self) -> None:
        self.client.close()

    def _parsed(self, seq: int, fields: dict[bytes, bytes]) -> tuple[int, list[dict[str, Any]]]:
        """An entry's seq and operations, by the file log's rule (``checked_content``): an
        entry that is not a well-formed record of a known format stops replay there."""
        where = f"update log {self.path}: the record of seq {seq}"
        content: dict[str, Any] = {"seq": seq}
        unknown = sorted(name.decode(errors="replace") for name in set(fields) - _FIELDS)
        try:
            if unknown:
                raise ValueError(f"unknown field(s) {unknown}")
            content["operations"] = json.loads(fields[_FIELD])
            if _FORMAT_FIELD in fields:
                content["format"] = json.loads(fields[_FORMAT_FIELD])
        except (KeyError, ValueError) as error:
            raise UpdateLogCorrupt(
                f"{where} cannot be read ({type(error).__name__}: {error}); refusing to replay "
                "past it (docs/dynamic-graphs.md, 'A damaged log')"
            ) from None
        return checked_content(content, where)

    def _wait_for_replicas(self, seq: int) -> None:
        wanted = self.config.wait_replicas
        if wanted <= 0:
            return
        try:
            confirmed = int(self._call(self.client.wait, wanted, self.config.wait_timeout_ms))
        except UpdateLogUnavailable as lost:  # the record is written: not "unreachable" alone
            raise UpdateNotReplicated(
                f"update log {self.path}: seq {seq} was written but Redis did not answer WAIT "
                f"({lost}); it is in the log and will be applied, but it is not acknowledged"
            ) from None
        if confirmed < wanted:
            raise UpdateNotReplicated(
                f"update log {self.path}: seq {seq} was written but {confirmed} of the "
                f"{wanted} required replicas confirmed it within {self.config.wait_timeout_ms} "
                "ms; it is in the log and will be applied, but it is not acknowledged"
            )

    def _call(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except _UNREACHABLE as error:
            raise UpdateLogUnavailable(f"update log {self.path} is unreachable: {error}") from None


def _seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def open_redis_update_log(store: Lineage, config: RedisLogConfig) -> tuple[RedisUpdateLog, int]:
    """The lineage's stream and the seq after which this store's updates begin.

    Unreachable: :class:`UpdateLogUnavailable` naming the URL (a server that cannot bring its
    graph up to date does not start). A compacted store on an empty stream starts it with a
    marker at its seq; on a stream without that seq (another lineage, or records lost) it
    raises :class:`UpdateLogMismatch`.
    """
    log = RedisUpdateLog(config.client(), KEY_PREFIX + store.log_base, config)
    try:
        log._call(log.client.ping)
        seq = store.folded_seq
        if seq > 0 and not log.holds(seq):
            if log.size() == 0 and log.start_after(seq):
                logger.warning(
                    "update log %s was empty: started it at seq %d (store %s holds updates 1-%d)",
                    log.path,
                    seq + 1,
                    store.checksum[:12],
                    seq,
                )
            elif not log.holds(seq):
                raise UpdateLogMismatch(
                    f"update log {log.path} does not hold seq {seq}, where the store's updates "
                    "stop: it is not the stream the store was compacted from, or it lost records"
                )
        return log, seq
    except BaseException:
        log.close()
        raise
