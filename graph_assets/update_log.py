"""The append-only, checksummed, fsync'd log of graph updates that every worker replays.

One log per base graph (``<state_dir>/<graph checksum>/updates.log``), shared by every worker of
every archive version that serves that graph or a store compacted from it. A record is
acknowledged only after it is on disk. Writers hold an exclusive ``flock`` while they append;
readers hold a shared one while they read, so a reader never sees a record that is being written.
A record cut short by a crash (a torn tail) is found at open time, reported and cut off, never
half-applied.

Record layout: ``b"GNUP"`` | payload length (uint32, little endian) | CRC-32 of the payload
(uint32) | payload (UTF-8 JSON).

A log started for a compacted store on a fresh state directory begins with a start marker: a
record with no operations whose ``seq`` is the last one folded into that store (graph_assets.
log_lineage). Update requests always carry operations, so no other record looks like it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAGIC = b"GNUP"
_HEADER = struct.Struct("<4sII")
MAX_RECORD_BYTES = 256 << 20


@dataclass(frozen=True)
class LogRecord:
    """One acknowledged update request: its sequence number (1, 2, ...) and its operations."""

    seq: int
    operations: list[dict[str, Any]]

    @property
    def is_start_marker(self) -> bool:
        """Whether this is the first record of a log started at ``seq + 1`` (no operations)."""
        return not self.operations


@dataclass(frozen=True)
class TornTail:
    """What ``UpdateLog.open`` cut off: the byte offset where valid records end, and why."""

    offset: int
    dropped_bytes: int
    reason: str


class UpdateLog:
    """Appends and replays the update records of one base graph."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.torn_tail: TornTail | None = None

    @classmethod
    def open(cls, path: Path) -> UpdateLog:
        """Opens the log, cutting off (and logging) a torn last record left by a crash."""
        log = cls(path)
        with log._locked(fcntl.LOCK_EX):
            end, reason = log._valid_end()
            size = os.fstat(log._fd).st_size
            if end < size:
                os.ftruncate(log._fd, end)
                os.fsync(log._fd)
                log.torn_tail = TornTail(offset=end, dropped_bytes=size - end, reason=reason)
                logger.warning(
                    "update log %s: ignored a torn last record at byte %d (%d bytes: %s); "
                    "every record before it is applied",
                    path,
                    end,
                    size - end,
                    reason,
                )
        return log

    @classmethod
    def create_starting_after(cls, path: Path, seq: int) -> bool:
        """Creates the log at ``path`` holding only a start marker for ``seq``, unless a log is
        there already; True if this call created it.

        The marker is written and fsync'd in a private file that is then linked into place, so
        a log that exists is never seen without it, even by workers starting at once.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        staging.unlink(missing_ok=True)  # left by a crashed process that had this pid
        try:
            fresh = cls(staging)
            try:
                fresh.append([], seq)
            finally:
                fresh.close()
            try:
                os.link(staging, path)
            except FileExistsError:
                return False
            _fsync_dir(path.parent)
            return True
        finally:
            staging.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self._fd)

    def read_from(self, offset: int, locked: bool = False) -> tuple[list[LogRecord], int]:
        """Complete records from ``offset`` on, and the offset after the last one.

        Takes a shared lock unless the caller already holds :meth:`exclusive` (``locked``):
        flock on the same file would otherwise downgrade and then drop that lock.
        """
        if locked:
            records = list(self._records(offset))
        else:
            with self._locked(fcntl.LOCK_SH):
                records = list(self._records(offset))
        end = records[-1][1] if records else offset
        return [record for record, _ in records], end

    def record_at(self, offset: int) -> tuple[LogRecord, int] | None:
        """The record that starts at byte ``offset`` and the offset after it; None at the end.

        Raises ValueError when no intact record starts there.
        """
        with self._locked(fcntl.LOCK_SH):
            size = os.fstat(self._fd).st_size
            if offset >= size:
                return None
            parsed = self._parse_at(offset, size)
        if isinstance(parsed, str):
            raise ValueError(f"no intact update record starts at byte {offset} ({parsed})")
        return parsed

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held by a writer from its catch-up read to its append, so no update interleaves."""
        with self._locked(fcntl.LOCK_EX):
            yield

    def append(self, operations: list[dict[str, Any]], seq: int) -> int:
        """Writes and fsyncs one record; call inside :meth:`exclusive`. Returns the new end."""
        payload = json.dumps({"seq": seq, "operations": operations}, allow_nan=False).encode()
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"an update record of {len(payload)} bytes is over the limit")
        record = _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        end = os.lseek(self._fd, 0, os.SEEK_END)
        os.pwrite(self._fd, record, end)
        os.fsync(self._fd)
        return end + len(record)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    @contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        fcntl.flock(self._fd, mode)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _records(self, offset: int) -> Iterator[tuple[LogRecord, int]]:
        size = os.fstat(self._fd).st_size
        while offset < size:
            parsed = self._parse_at(offset, size)
            if isinstance(parsed, str):
                raise ValueError(f"{self.path}: record at byte {offset} is unreadable ({parsed})")
            record, offset = parsed
            yield record, offset

    def _valid_end(self) -> tuple[int, str]:
        """Offset just after the last intact record, and why parsing stopped there."""
        size = os.fstat(self._fd).st_size
        offset = 0
        while offset < size:
            parsed = self._parse_at(offset, size)
            if isinstance(parsed, str):
                return offset, parsed
            offset = parsed[1]
        return offset, ""

    def _parse_at(self, offset: int, size: int) -> tuple[LogRecord, int] | str:
        header = os.pread(self._fd, _HEADER.size, offset)
        if len(header) < _HEADER.size:
            return "truncated header"
        magic, length, crc = _HEADER.unpack(header)
        if magic != MAGIC:
            return "bad magic"
        if length > MAX_RECORD_BYTES or offset + _HEADER.size + length > size:
            return "truncated payload"
        payload = os.pread(self._fd, length, offset + _HEADER.size)
        if zlib.crc32(payload) != crc:
            return "checksum mismatch"
        try:
            data = json.loads(payload)
            record = LogRecord(seq=int(data["seq"]), operations=list(data["operations"]))
        except (ValueError, KeyError, TypeError):
            return "unparsable payload"
        return record, offset + _HEADER.size + length


def _fsync_dir(path: Path) -> None:
    """Makes a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
