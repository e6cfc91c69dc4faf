"""Where a store's updates begin in the update log it shares with its lineage.

A store built from input files starts its log at byte 0, seq 0. A compacted store continues the
log of the store it was compacted from (``meta.json`` ``update_log``): the log in the lineage's
first state directory, after the last record folded into it. Opening checks that the log really
continues there, so a worker never serves a store with updates lost or applied twice.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from graph_assets.errors import UpdateLogMismatch
from graph_assets.live.update_log import UpdateLog
from graph_assets.stored.store import UpdateLogMeta

logger = logging.getLogger(__name__)

LOG_FILE = "updates.log"


class Lineage(Protocol):
    """Where a base graph's updates continue: ``GraphStore``, or ``RemoteStore`` for the same
    store loaded into Redis (its meta.json travels with it, so both say the same)."""

    @property
    def checksum(self) -> str: ...

    @property
    def update_log(self) -> UpdateLogMeta | None:
        """A compacted store's place in its lineage's log; None otherwise."""
        ...

    @property
    def log_base(self) -> str:
        """The checksum naming the state directory (and Redis stream) of the lineage's log."""
        ...

    @property
    def folded_seq(self) -> int: ...


def update_log_path(store: Lineage, state_dir: Path) -> Path:
    """``<state_dir>/<lineage base checksum>/updates.log``: one log per lineage of stores."""
    return Path(state_dir) / store.log_base / LOG_FILE


def open_update_log(store: Lineage, path: Path, writable: bool = True) -> tuple[UpdateLog, int]:
    """The store's log, and the byte offset of the first record not in the store.

    A compacted store's log that does not exist yet (a fresh state directory) is started
    there at the store's seq + 1, with a warning (``writable=False``, for compaction, opens only
    a log that exists and never changes it); one that is shorter than the store's offset, or
    holds another record there, raises `UpdateLogMismatch` naming the file. Any other store
    starts at byte 0, seq 0, so the same check refuses it a log started for a compacted store.
    """
    lineage = store.update_log
    if lineage is None:
        seq, offset = 0, 0
    else:
        seq, offset = lineage["seq"], lineage["offset"]
        missing = writable and not Path(path).exists()
        if missing and UpdateLog.create_starting_after(path, seq):
            logger.warning(
                "update log %s did not exist: started it as a new log at seq %d (store %s "
                "holds updates 1-%d); workers on the updates' original state directory do not "
                "see it",
                path,
                seq + 1,
                store.checksum[:12],
                seq,
            )
    log = UpdateLog.open(path, writable=writable)
    try:
        return log, _start_offset(log, seq, offset)
    except BaseException:
        log.close()
        raise


def _start_offset(log: UpdateLog, seq: int, offset: int) -> int:
    """``offset``, once the log is known to hold nothing or the record of ``seq + 1`` there."""
    first = log.record_at(0)
    if first is not None and first.is_start_marker and first.seq == seq:
        return first.end  # a log started for this store: it continues right after the marker
    size = log.size()
    where = f"the store's updates continue after seq {seq}, at byte {offset}"
    if size < offset:
        raise UpdateLogMismatch(
            f"update log {log.path} is {size} bytes, but {where}: it is not the log the store "
            "was compacted from, or it lost records; point the state directory at that log"
        )
    try:
        record = log.record_at(offset)
    except ValueError as error:
        raise UpdateLogMismatch(f"update log {log.path}: {error}, but {where}") from None
    if record is not None and record.seq != seq + 1:
        raise UpdateLogMismatch(
            f"update log {log.path} holds seq {record.seq} at byte {offset}, expected seq "
            f"{seq + 1} ({where}): it is not this store's log"
        )
    return offset
