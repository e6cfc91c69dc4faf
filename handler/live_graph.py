"""The served graph as of now: the memory-mapped base plus the replayed update log.

Every worker of every archive version that serves the same base graph shares one update log
(``<state_dir>/<base checksum>/updates.log``). Before each batch a worker reads the records other
workers appended since it last looked (one ``fstat`` when there are none), so an update
acknowledged by any worker is seen by every later request on every worker (read-your-writes).
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graph_assets import GraphStore
from graph_assets.overlay import GraphOverlay, UpdateRejected
from graph_assets.update_log import UpdateLog
from handler.errors import ApiError, BadRequest, Conflict, Forbidden, NotFound, TooLarge
from handler.requests import body_of, decode_body

logger = logging.getLogger(__name__)

UPDATE_KEY_HEADER = "x-gnnserve-update-key"


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
    """Base store + overlay, kept in step with the shared update log."""

    def __init__(self, store: GraphStore, log_path: Path | None) -> None:
        self.store = store
        self.overlay = GraphOverlay(store)
        self.log = UpdateLog.open(log_path) if log_path is not None else None
        self._offset = 0
        self._lock = threading.Lock()
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

    @property
    def version(self) -> str:
        """The graph version answers are computed on: base checksum + updates applied."""
        return f"{self.store.checksum[:12]}+{self.overlay.seq}"

    def sync(self) -> None:
        """Applies records other workers appended since the last call."""
        if self.log is None or self.log.size() == self._offset:
            return
        with self._lock:
            records, self._offset = self.log.read_from(self._offset)
            for record in records:
                self.overlay.apply(record.operations, record.seq)

    def update(self, request: UpdateRequest) -> int:
        """Validates, logs durably (fsync), then applies; returns the new graph version number."""
        if self.log is None:
            raise Forbidden("updates are disabled for this archive")
        log = self.log
        with self._lock, log.exclusive():
            records, self._offset = log.read_from(self._offset, locked=True)
            for record in records:
                self.overlay.apply(record.operations, record.seq)
            seq = self.overlay.seq + 1

            def persist() -> None:
                self._offset = log.append(request.operations, seq)

            try:
                self.overlay.apply(request.operations, seq, commit=persist)
            except UpdateRejected as rejected:
                raise _REJECTION.get(rejected.status, BadRequest)(str(rejected)) from None
        return seq


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
