"""The served graph as of now: the memory-mapped base plus the replayed update log.

Every worker of every archive version that serves the same base graph shares one update log
(``<state_dir>/<base checksum>/updates.log``); a store compacted from it continues that log after
the records folded into it (graph_assets.log_lineage). A follower thread applies the records other
workers append between batches, and each batch still reads whatever is left (one ``fstat`` when
there is nothing) before it looks anything up, so an update acknowledged by any worker is seen by
every later request on every worker (read-your-writes) without the request usually paying for
the replay. A batch holds the graph still from lookup to formatting (:meth:`LiveGraph.reading`).
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graph_assets import GraphStore
from graph_assets.log_lineage import open_update_log
from graph_assets.overlay import GraphOverlay, UpdateRejected
from graph_assets.update_log import LogRecord, UpdateLog
from handler.errors import ApiError, BadRequest, Conflict, Forbidden, NotFound, TooLarge
from handler.requests import body_of, decode_body

logger = logging.getLogger(__name__)

UPDATE_KEY_HEADER = "x-gnnserve-update-key"
# After a failed replay the follower waits this long before it tries the same record again, so a
# record that cannot be applied logs one traceback a second, not one per poll.
FOLLOWER_RETRY_S = 1.0


_REJECTION = {400: BadRequest, 404: NotFound, 409: Conflict, 413: TooLarge}


@dataclass(frozen=True)
class UpdateRequest:
    """``{"op": "update", "operations": [...]}``, parsed and authorised."""

    operations: list[Any]


@dataclass(frozen=True)
class UpdatePolicy:
    """Whether this archive takes updates, with which secret, and how many operations at once."""

    secret: str | None
    max_operations: int

    @property
    def enabled(self) -> bool:
        return self.secret is not None


def read_secret(env_name: str, secret_file: str) -> str:
    """The update secret from a file (preferred) or an environment variable; never the YAML."""
    if secret_file:
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
        raise Forbidden("updates are disabled for this archive (gnn.updates_enabled is false)")
    if key is None or not hmac.compare_digest(key.encode(), (policy.secret or "").encode()):
        raise Forbidden(f"updates need the update key in the {UPDATE_KEY_HEADER} header")
    operations = body.get("operations")
    if not isinstance(operations, list) or not operations:
        raise BadRequest('an update carries a non-empty "operations" list')
    if len(operations) > policy.max_operations:
        raise TooLarge(
            f"{len(operations)} operations in one update; the limit is {policy.max_operations}"
        )
    extra = sorted(set(body) - {"op", "operations"})
    if extra:
        raise BadRequest(f"unknown field(s) {extra} in an update")
    return UpdateRequest(operations=operations)


class LiveGraph:
    """Base store + overlay, kept in step with the shared update log.

    With ``follow_interval_s`` > 0 a daemon thread checks the log that often (one ``fstat``) and
    applies new records while no batch holds the graph; :meth:`close` stops it. A compacted
    store starts at the seq and byte offset it folded its lineage's log up to.
    """

    def __init__(
        self, store: GraphStore, log_path: Path | None, follow_interval_s: float = 0.0
    ) -> None:
        self.store = store
        self.overlay = GraphOverlay(store)
        self.log: UpdateLog | None = None
        self._offset = 0
        if log_path is not None:
            self.log, self._offset = open_update_log(store, log_path)
        # Re-entrant: a batch holds it from lookup to formatting, and the updates inside that
        # batch (``update``) take it again.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self.sync()
        if self.log is not None and self.log.torn_tail is not None:
            tail = self.log.torn_tail
            logger.warning(
                "skipped a torn update record at byte %d of %s (%s); %d updates replayed",
                tail.offset,
                self.log.path,
                tail.reason,
                self.overlay.seq,
            )
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

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Catches up with the log, then holds the graph still until the block ends, so one
        batch looks up, samples, gathers and reports ``graph_version`` on one graph. The
        batch's own updates still apply inside it (the lock is re-entrant)."""
        with self._lock:
            self.sync()
            yield

    def sync(self) -> None:
        """Applies records other workers appended since the last call."""
        if self.log is None or self.log.size() == self._offset:
            return
        with self._lock:
            self._apply(*self.log.read_from(self._offset))

    def follow_once(self) -> None:
        """One step of the follower: reads new records without the graph's lock (a writer's
        ``fsync`` is waited for here, not in a batch), then applies them under it."""
        if self.log is None or self.log.size() == self._offset:
            return
        records, end = self.log.read_from(self._offset)
        with self._lock:
            self._apply(records, end)

    def update(self, request: UpdateRequest) -> int:
        """Validates, logs durably (fsync), then applies; returns the new graph version number."""
        if self.log is None:
            raise Forbidden("updates are disabled for this archive")
        log = self.log
        with self._lock, log.exclusive():
            self._apply(*log.read_from(self._offset, locked=True))
            seq = self.overlay.seq + 1

            def persist() -> None:
                self._offset = log.append(request.operations, seq)

            try:
                self.overlay.apply(request.operations, seq, commit=persist)
            except UpdateRejected as rejected:
                raise _REJECTION.get(rejected.status, BadRequest)(str(rejected)) from None
        return seq

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

    def _apply(self, records: list[LogRecord], end: int) -> None:
        """Applies ``records`` (read from the log up to ``end``); call with the lock held.

        Records were read before the lock was taken, so another caller may have applied some
        already: those (seq not above the overlay's) are skipped. The offset moves only once
        every record applied, so a record that fails is retried by the next call, never
        skipped, and none is applied twice.
        """
        for record in records:
            if record.seq > self.overlay.seq:
                self.overlay.apply(record.operations, record.seq)
        self._offset = max(self._offset, end)


def _follow(graph: weakref.ref[LiveGraph], stop: threading.Event, interval_s: float) -> None:
    """The follower thread's loop. It holds the graph weakly, so a graph dropped without
    ``close`` ends its thread too; a failure is logged and retried, never raised."""
    while not stop.wait(interval_s):
        live = graph()
        if live is None:
            return
        try:
            live.follow_once()
        except Exception:
            logger.exception(
                "the update follower could not apply the log of %s; retrying in %g s "
                "(batches still replay it themselves)",
                live.log.path if live.log is not None else "a closed graph",
                FOLLOWER_RETRY_S,
            )
            stop.wait(FOLLOWER_RETRY_S)
        del live


def update_body(item: Any) -> dict[str, Any] | None:
    """The body of a request if it is an update (``"op": "update"``), else None."""
    try:
        body = decode_body(body_of(item))
    except ApiError:
        return None
    return body if isinstance(body, dict) and body.get("op") == "update" else None


def answer_update(
    body: dict[str, Any], key: str | None, live: LiveGraph | None, policy: UpdatePolicy
) -> tuple[int, dict[str, Any]]:
    """Status and JSON body for one update request; a failure never raises."""
    try:
        request = parse_update(body, key, policy)
        if live is None:
            raise Forbidden("updates are disabled for this archive")
        seq = live.update(request)
    except ApiError as error:
        logger.info("update refused: %s %s", error.status, error.type_name)
        return error.status, error.body()
    return 200, {
        "status": "applied",
        "operations": len(request.operations),
        "graph_version": live.version,
        "seq": seq,
    }
