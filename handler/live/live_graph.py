"""The served graph as of now: the memory-mapped base plus the replayed update log.

Every worker of every archive version that serves the same base graph shares one update log: a
file (``<state_dir>/<base checksum>/updates.log``) on one machine, or a Redis stream
(graph_assets.live.redis_log) that every replica shares; a store compacted from it continues
that log after the records folded into it (graph_assets.live.log_lineage). A follower thread
applies the records other workers append between batches, and each batch still reads whatever
is left (one ``fstat``, or one Redis round trip, when there is nothing) before it looks anything
up, so an update acknowledged by any worker is seen by every later request on every worker
(read-your-writes) without the request usually paying for the replay. A batch holds the graph
still from lookup to formatting (:meth:`LiveGraph.reading`).

A Redis log that cannot be reached stops nothing but the updates: batches serve the last version
applied (their ``graph_version`` says which), updates are answered 503, and the follower tries
again with a growing delay until it gets through.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from graph_assets.errors import (
    UpdateLogConflict,
    UpdateLogCorrupt,
    UpdateLogMismatch,
    UpdateLogUnavailable,
)
from graph_assets.live.log_lineage import Lineage, open_update_log, update_log_path
from graph_assets.live.operations import (
    DecodingGraph,
    Operation,
    decode_operations,
    encode_operations,
)
from graph_assets.live.overlay import GraphOverlay, ListenerFailed, OverlayBase
from graph_assets.live.redis_log import RedisLogConfig, RedisUpdateLog, open_redis_update_log
from graph_assets.live.update_log import LogRecord, UpdateLog, check_next
from graph_assets.private_dir import ensure_private_dir
from handler.live.errors import (
    MalformedUpdate,
    TooManyOperations,
    UpdateKeyRejected,
    UpdateRaceLost,
    UpdatesDisabled,
    UpdatesHalted,
)
from handler.settings import ServingSettings

logger = logging.getLogger(__name__)

UPDATE_KEY_HEADER = "x-gnnserve-update-key"
# The state directory when the archive names none: in TorchServe's (private) temp directory.
STATE_DIR = "gnnserve-state"
# After a failed replay the follower waits this long before it tries the same record again, so a
# record that cannot be applied logs one traceback a second, not one per poll.
FOLLOWER_RETRY_S = 1.0
# An unreachable log is tried again after these delays (doubling from the first to the last).
RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.05, 2.0
# A writer that lost the race for a seq to another server catches up and tries again this often.
MAX_CONFLICT_RETRIES = 50
LogBackend = UpdateLog | RedisUpdateLog


class LiveBase(OverlayBase, Lineage, DecodingGraph, Protocol):
    """The base graph of the live state: the memory-mapped store, or the same store loaded
    into Redis (the overlay reads either through the graph view; neither changes)."""


@dataclass(frozen=True)
class UpdateRequest:
    """``{"op": "update", "operations": [...]}``, parsed and authorised; the operations as
    sent (:meth:`LiveGraph.update` decodes them against the graph)."""

    operations: list[Any]


@dataclass(frozen=True)
class Applied:
    """An update that is durable (in the update log) and applied: its seq, and whether this
    worker's rows derived from the graph (a precomputed archive's) failed to take it in and
    are being brought up to date (reads answer 503 until they are, never from older rows)."""

    seq: int
    rows_rebuilding: bool = False


@dataclass(frozen=True)
class UpdatePolicy:
    """Whether this archive takes updates, with which secret, and how many operations at once."""

    secret: str | None
    max_operations: int

    @property
    def enabled(self) -> bool:
        return self.secret is not None


def read_secret(env_name: str, secret_file: str) -> str:
    """The update secret from a file (preferred) or an environment variable; never the YAML.

    The file must not be writable by group or others, nor readable by others (group-readable
    is allowed: that is how Kubernetes mounts a Secret for a pod's ``fsGroup``).
    """
    if secret_file:
        mode = os.stat(secret_file).st_mode
        if mode & (stat.S_IWGRP | stat.S_IRWXO):
            raise ValueError(
                f"update secret file {secret_file} has mode {stat.filemode(mode)}: anyone who "
                f"can read or change it can change the graph; chmod 600 {secret_file} (or 640)"
            )
        secret = Path(secret_file).read_text().strip()
    else:
        secret = os.environ.get(env_name, "").strip()
    if len(secret) < 16:
        raise ValueError(
            "updates are enabled but no update secret of at least 16 characters was found "
            f"(file {secret_file!r} or environment variable {env_name}); set one or disable updates"
        )
    return secret


def parse_update(body: dict[str, Any], key: str | None, policy: UpdatePolicy) -> UpdateRequest:
    """Checks the update key before anything else, then the shape of the operation list."""
    if not policy.enabled:
        raise UpdatesDisabled()
    if key is None or not hmac.compare_digest(key.encode(), (policy.secret or "").encode()):
        raise UpdateKeyRejected(f"updates need the update key in the {UPDATE_KEY_HEADER} header")
    operations = body.get("operations")
    if not isinstance(operations, list) or not operations:
        raise MalformedUpdate('an update carries a non-empty "operations" list')
    if len(operations) > policy.max_operations:
        raise TooManyOperations(
            f"{len(operations)} operations in one update; the limit is {policy.max_operations}"
        )
    extra = sorted(set(body) - {"op", "operations"})
    if extra:
        raise MalformedUpdate(f"unknown field(s) {extra} in an update")
    return UpdateRequest(operations=operations)


@dataclass(frozen=True)
class ReplayFailure:
    """A log record this worker could not read or apply: it serves the version before it."""

    seq: int | None  # None when the record could not be read at all
    offset: int
    reason: str

    def describe(self) -> dict[str, Any]:
        return {"seq": self.seq, "offset": self.offset, "reason": self.reason}


class LiveGraph:
    """Base store + overlay, kept in step with the shared update log.

    With ``follow_interval_s`` > 0 a daemon thread checks the log that often (one ``fstat``) and
    applies new records while no batch holds the graph; :meth:`close` stops it. A compacted
    store starts at the seq and byte offset it folded its lineage's log up to.

    A record that cannot be applied (or read) sets :attr:`failure`: the worker keeps serving the
    last version it applied, refuses updates (503) and the follower retries the record; it is
    never skipped. A log damaged before the worker starts refuses the start instead.
    """

    def __init__(
        self,
        store: LiveBase,
        log_path: Path | None,
        follow_interval_s: float = 0.0,
        redis_log: RedisLogConfig | None = None,
    ) -> None:
        self.store = store
        self.overlay = GraphOverlay(store)
        self.log: LogBackend | None = None
        self.failure: ReplayFailure | None = None
        self.unreachable: str | None = None  # why the log cannot be reached now
        self.log_errors = 0  # failed attempts to reach the log, since the start
        self.log_end = 0  # the end of the log when it was last looked at
        # Work the follower does between batches, under the graph's lock, after each step
        # (precomputed rows recompute what updates marked: handler.graph.precomputed).
        self.background: list[Callable[[], object]] = []
        self._reconnect_delay = RECONNECT_FIRST_S
        self._retry_at = 0.0
        self._offset = 0
        if redis_log is not None:
            self.log, self._offset = open_redis_update_log(store, redis_log)
        elif log_path is not None:
            self.log, self._offset = open_update_log(store, log_path)
        self.log_end = self._offset
        # Re-entrant: a batch holds it from lookup to formatting, and the updates inside that
        # batch (``update``) take it again.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        if self.log is not None:
            try:
                # Damage found before serving anything refuses the start (one line, the file
                # and the byte offset); a record that fails to apply does not (``failure``).
                self._apply(*self.log.read_from(self._offset), refuse_damage=True)
            except UpdateLogCorrupt:
                self.log.close()
                raise
            self._warn_about_torn_tail()
        if follow_interval_s > 0 and self.log is not None:
            self._follower = threading.Thread(
                target=_follow,
                args=(weakref.ref(self), self._stop, follow_interval_s),
                name=f"gnnserve-update-follower-{self.store.checksum[:12]}",
                daemon=True,
            )
            self._follower.start()

    @property
    def version(self) -> str:
        """The graph version answers are computed on: base checksum + updates applied."""
        return f"{self.store.checksum[:12]}+{self.overlay.seq}"

    @property
    def following(self) -> bool:
        """Whether the follower thread is running."""
        return self._follower is not None and self._follower.is_alive()

    @property
    def seq(self) -> int:
        """How many updates the served graph holds (the number after ``+`` in the version)."""
        return self.overlay.seq

    @property
    def lag(self) -> int:
        """How far the graph is behind the log as last seen: records for a Redis log; for the
        file log 1 while unread bytes wait, else 0."""
        if isinstance(self.log, RedisUpdateLog):
            return max(0, self.log_end - self._offset)
        return int(self.log_end > self._offset)

    def describe(self) -> dict[str, Any]:
        """The update state for ``describe``: the version served, the log, any failure."""
        return {
            "graph_version": self.version,
            "log": self.log.path if isinstance(self.log, RedisUpdateLog) else "file",
            "replay_failure": self.failure.describe() if self.failure is not None else None,
            "log_unreachable": self.unreachable,
        }

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Catches up with the log, then holds the graph still until the block ends, so one
        batch looks up, samples, gathers and reports ``graph_version`` on one graph. The
        batch's own updates still apply inside it (the lock is re-entrant)."""
        with self._lock:
            self.sync()
            yield

    def sync(self) -> None:
        """Applies records other workers appended since the last call. After a replay failure,
        or while the log cannot be reached, it does nothing: serving stays at the last version
        applied while the follower retries."""
        if self.failure is not None or self._waiting_to_reconnect() or not self._behind():
            return
        with self._lock:
            self._read_and_apply(locked=False)

    def catch_up(self, seq: int, timeout_s: float) -> bool:
        """Waits (at most ``timeout_s``) until the graph holds update ``seq``: a client's
        read-your-writes across replicas (``min_graph_version``). Call it outside a batch's
        :meth:`reading`, whose lock the follower needs."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.sync()
            if self.overlay.seq >= seq:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.002, left))

    def follow_once(self) -> None:
        """One step of the follower: reads new records without the graph's lock (a writer's
        ``fsync`` is waited for here, not in a batch), then applies them under it."""
        log = self.log
        if log is None or not self._behind():
            return
        start = self._offset
        try:
            records, end = log.read_from(start)
        except UpdateLogUnavailable as error:
            self._lost(error)
            return
        except Exception as error:
            with self._lock:
                self._fail(error, start, None)
            return
        with self._lock:
            if self._offset == start:  # else a batch applied them meanwhile: read again later
                self._apply(records, end)

    def run_background(self) -> None:
        """One step of each background task, holding the graph still meanwhile."""
        if self.background:
            with self._lock:
                for task in self.background:
                    task()

    def update(self, request: UpdateRequest) -> Applied:
        """Validates, logs durably (fsync), then applies; returns the new graph version number
        (``Applied.seq``).

        Refused (``UpdatesHalted``) while a replay failure stands, and with
        ``UpdateLogWriteFailed`` (nothing applied, nothing left in the log) when the record
        cannot be written. Once the record is written the update is applied, whatever a
        listener of the overlay does (``Applied.rows_rebuilding``).
        """
        if self.log is None:
            raise UpdatesDisabled()
        # Decoded once, here: the overlay and the log see typed operations only.
        operations = decode_operations(request.operations, self.store)
        catch_up = self.log.catch_up_before_append
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                return self._update_once(self.log, operations, catch_up)
            except UpdateLogConflict:
                catch_up = True  # another server wrote that seq first: catch up, validate again
        raise UpdateRaceLost(
            f"{MAX_CONFLICT_RETRIES} other updates were written first while this one was being "
            "validated; nothing was applied, send it again"
        )

    def _update_once(self, log: LogBackend, operations: list[Operation], catch_up: bool) -> Applied:
        with self._lock, log.exclusive():
            if self.failure is None and catch_up:
                self._read_and_apply(locked=True, raise_unreachable=True)
            if self.failure is not None:
                raise UpdatesHalted(self._refusal())
            seq, at = self.overlay.seq + 1, self._offset

            def persist() -> None:
                self._offset = log.append(encode_operations(operations), seq, at=at)
                self.log_end = max(self.log_end, self._offset)
                self._reached()

            try:
                self.overlay.apply(operations, seq, commit=persist)
            except ListenerFailed as failed:
                self._listener_failed(failed)
                return Applied(seq, rows_rebuilding=True)
            except UpdateLogMismatch as lost:
                self._fail(lost, self._offset, None)
                raise UpdatesHalted(self._refusal()) from None
            except UpdateLogUnavailable as unreachable:
                self._lost(unreachable)
                raise
        return Applied(seq)

    def close(self) -> None:
        """Stops the follower (waits for it) and closes the log; the graph is not used after."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join()
            self._follower = None
        with self._lock:
            if self.log is not None:
                self.log.close()
                self.log = None

    def _behind(self) -> bool:
        """Whether the log holds more than the graph (one fstat, or one Redis round trip). A
        log shorter than what was applied from it lost acknowledged records: a failure."""
        if self.log is None:
            return False
        start = self._offset  # before the size: this thread or another may append meanwhile
        try:
            end = self.log.size()
        except UpdateLogUnavailable as error:
            self._lost(error)
            return False
        self._reached()
        self.log_end = end
        if isinstance(self.log, RedisUpdateLog) and end < start:
            lost = UpdateLogMismatch(
                f"update log {self.log.path} ends at seq {end}, but this worker applied "
                f"{start}: the log lost acknowledged records (was Redis restarted without its "
                "append-only file?)"
            )
            with self._lock:
                self._fail(lost, start, None)
            return False
        return end != start

    def _waiting_to_reconnect(self) -> bool:
        return self.unreachable is not None and time.monotonic() < self._retry_at

    def _lost(self, error: UpdateLogUnavailable) -> None:
        """The log cannot be reached: serve on, try again after a growing delay."""
        self.log_errors += 1
        if self.unreachable is None:
            logger.error(
                "%s; serving graph version %s and refusing updates until it is back",
                error,
                self.version,
            )
            self._reconnect_delay = RECONNECT_FIRST_S
        else:
            self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_MAX_S)
        self.unreachable = str(error)
        self._retry_at = time.monotonic() + self._reconnect_delay

    def _reached(self) -> None:
        if self.unreachable is not None:
            logger.warning("the update log is reachable again; following it from %s", self.version)
            self.unreachable = None

    def retry_delay(self) -> float:
        """How long the follower waits before its next look at the log."""
        return max(0.0, self._retry_at - time.monotonic()) if self.unreachable else 0.0

    def _read_and_apply(self, locked: bool, raise_unreachable: bool = False) -> None:
        """Reads and applies what follows the offset; call with the graph lock held. A failure
        is recorded (:meth:`_fail`), never raised into the batch; an unreachable log is raised
        into an update (``raise_unreachable``), which must not be validated on a stale graph."""
        if self.log is None:
            return
        start = self._offset
        try:
            records, end = self.log.read_from(start, locked=locked)
        except UpdateLogUnavailable as error:
            self._lost(error)
            if raise_unreachable:
                raise
            return
        except Exception as error:
            self._fail(error, start, None)
            return
        self._reached()
        self._apply(records, end)

    def _apply(self, records: list[LogRecord], end: int, refuse_damage: bool = False) -> None:
        """Applies ``records`` (read from the offset up to ``end``) in seq order; call with the
        lock held. The offset moves past each record applied, so a record that fails stops
        replay there, is retried later, never skipped, and none is applied twice. A seq out of
        order raises with ``refuse_damage`` (at start), else it is a failure like any other."""
        path = self.log.path if self.log is not None else ""
        for record in records:
            try:
                check_next(record, self.overlay.seq, str(path))
                operations = decode_operations(record.operations, self.store)
                self.overlay.apply(operations, record.seq)
            except ListenerFailed as failed:  # applied: seq and offset move on together
                self._listener_failed(failed)
            except Exception as error:
                if refuse_damage and isinstance(error, UpdateLogCorrupt):
                    raise
                self._fail(error, record.offset, record.seq)
                return
            self._offset = record.end
        self._offset = end
        if self.failure is not None:
            logger.warning("update log %s: replay resumed at %s", path, self.version)
            self.failure = None

    def _fail(self, error: Exception, offset: int, seq: int | None) -> None:
        """Records a replay failure; logs it (one ERROR line with its traceback) when new."""
        failure = ReplayFailure(seq=seq, offset=offset, reason=f"{type(error).__name__}: {error}")
        if failure != self.failure:
            logger.error(
                "update log %s: cannot apply the record %s at byte %d (%s); this worker keeps "
                "serving graph version %s and refuses updates until it can "
                "(docs/dynamic-graphs.md, 'When a record cannot be applied')",
                self.log.path if self.log is not None else "(closed)",
                f"seq {seq}" if seq is not None else "(unreadable)",
                offset,
                failure.reason,
                self.version,
                exc_info=error,
            )
        self.failure = failure

    def _listener_failed(self, failed: ListenerFailed) -> None:
        """An update applied (and in the log) whose change a listener failed to take in: one
        ERROR line; the listener catches up before it is read (precomputed rows: reads answer
        503 until then), the update is never applied or answered again."""
        logger.error(
            "update log %s: %s; serving graph version %s, the rows derived from it are brought "
            "up to date before they are read",
            self.log.path if self.log is not None else "(closed)",
            failed,
            self.version,
            exc_info=failed.__cause__,
        )

    def _refusal(self) -> str:
        failure = self.failure
        where = f"seq {failure.seq}" if failure and failure.seq is not None else "a record"
        return (
            f"this worker could not apply {where} of the update log and serves graph version "
            f"{self.version}; updates are refused until it can (see the worker's log)"
        )

    def _warn_about_torn_tail(self) -> None:
        tail = self.log.torn_tail if self.log is not None else None
        if tail is not None and self.log is not None:
            logger.warning(
                "skipped a torn update record at byte %d of %s (%s, %d bytes): a writer "
                "stopped mid-write, so it was never acknowledged; %d updates replayed",
                tail.offset,
                self.log.path,
                tail.reason,
                tail.size,
                self.overlay.seq,
            )


def _follow(graph: weakref.ref[LiveGraph], stop: threading.Event, interval_s: float) -> None:
    """The follower thread's loop. It holds the graph weakly, so a graph dropped without
    ``close`` ends its thread too; a failure is logged and retried, never raised."""
    while not stop.wait(interval_s):
        live = graph()
        if live is None:
            return
        delay = live.retry_delay()
        if delay > 0:
            del live
            stop.wait(delay)
            continue
        try:
            live.follow_once()
            live.run_background()
        except Exception:  # the log damaged under a running worker: keep serving, say so
            logger.exception("the update follower of %s failed", live.store.checksum[:12])
        failed = live.failure is not None
        del live
        if failed:
            stop.wait(FOLLOWER_RETRY_S)


def open_live_graph(
    store: LiveBase, settings: ServingSettings
) -> tuple[LiveGraph | None, UpdatePolicy]:
    """The update log and policy when the archive takes updates; (None, disabled) otherwise.
    The log is the Redis stream ``GNNSERVE_UPDATE_LOG_URL`` names when it is set (every replica
    shares it), else the file in the state directory (one machine).

    The state directory and the log's own directory in it must be private to this user: every
    worker replays the log without asking for the update key, so whoever can write there
    controls the graph (graph_assets.private_dir)."""
    if not settings.updates_enabled:
        return None, UpdatePolicy(secret=None, max_operations=settings.max_update_operations)
    secret = read_secret(settings.update_secret_env, settings.update_secret_file)
    follow_s = settings.update_follow_interval_ms / 1000
    redis_log = RedisLogConfig.from_environment()
    if redis_log is not None:
        live = LiveGraph(store, None, follow_interval_s=follow_s, redis_log=redis_log)
    else:
        default = Path(tempfile.gettempdir()) / STATE_DIR
        state = ensure_private_dir(settings.update_state_dir or default)
        log_path = update_log_path(store, state)
        ensure_private_dir(log_path.parent)
        live = LiveGraph(store, log_path, follow_interval_s=follow_s)
    return live, UpdatePolicy(secret=secret, max_operations=settings.max_update_operations)
