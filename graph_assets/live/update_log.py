"""The append-only, checksummed, fsync'd log of graph updates that every worker replays.

One log per base graph (``<state_dir>/<graph checksum>/updates.log``), shared by every worker of
every archive version that serves that graph or a store compacted from it.

Writing: a writer holds an exclusive ``flock`` from its catch-up read to the end of its append
(:meth:`UpdateLog.exclusive`), writes the whole record and fsyncs it; a record is acknowledged
only after that. A write or fsync that fails (a full disk or quota, an I/O error) is rolled back
(``ftruncate`` to the old end) before the lock is released, so no reader ever sees it.
``flock`` belongs to the open file description, which every thread of a process shares, so each
flock section is also serialised by a per-log thread lock: another thread's shared lock would
otherwise downgrade, then drop, a writer's exclusive one.

Reading: ``[0, size)`` as seen under a shared lock holds only acknowledged records, plus at most
one incomplete last record left by a writer that died mid-write (a torn tail). Records are never
rewritten, so readers parse without holding the lock; a torn tail is "not written yet" to them,
and the next writer replaces it. An unreadable record followed by intact ones is damage, not a
crash: :class:`UpdateLogCorrupt`, never a silent cut. So is a record whose checksum matches but
whose content is not a well-formed record of a known format (:func:`checked_content`), wherever
it lies: it was written whole, so it is kept, never written over.

Record layout: ``b"GNUP"`` | payload length (uint32, little endian) | CRC-32 of the payload
(uint32) | payload (UTF-8 JSON ``{"seq": N, "format": 2, "operations": [...]}``: the
operations in ``graph_assets.live.operations``' canonical form, whose version ``format`` is; a
record without it is format 1, written before).

A log started for a compacted store on a fresh state directory begins with a start marker: a
record with no operations whose ``seq`` is the last one folded into that store (graph_assets.
log_lineage). Update requests always carry operations, so no other record looks like it.
"""

from __future__ import annotations

import errno
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

from graph_assets.durable import fsync_path
from graph_assets.errors import UpdateLogCorrupt, UpdateLogWriteFailed
from graph_assets.live.operations import LOG_FORMAT
from graph_assets.private_dir import ensure_private_dir

logger = logging.getLogger(__name__)

MAGIC = b"GNUP"
_HEADER = struct.Struct("<4sII")
MAX_RECORD_BYTES = 256 << 20
_SCAN_CHUNK = 1 << 20
# What a record cut short by a crash looks like (anything else at a record boundary is damage).
_INCOMPLETE = ("truncated header", "truncated payload")
_FIELDS = {"seq", "format", "operations"}
_REFUSED = "refusing to replay past it (docs/dynamic-graphs.md, 'A damaged log')"


@dataclass(frozen=True)
class LogRecord:
    """One acknowledged update request: its sequence number (1, 2, ...), its operations, and
    where it lies in the log (``end``: where a reader resumes)."""

    seq: int
    operations: list[dict[str, Any]]
    offset: int
    end: int

    @property
    def is_start_marker(self) -> bool:
        """Whether this is the first record of a log started at ``seq + 1`` (no operations)."""
        return not self.operations


@dataclass(frozen=True)
class TornTail:
    """An incomplete last record (a writer died mid-write): where it starts, its size, why."""

    offset: int
    size: int
    reason: str


class UpdateLog:
    """Appends and replays the update records of one base graph.

    ``writable=False`` opens an existing log read-only (compaction, inspection): it never
    creates, truncates or appends.
    """

    # A writer reads what others appended before it validates and appends (under its lock).
    catch_up_before_append = True

    def __init__(self, path: Path, writable: bool = True) -> None:
        self.path = Path(path)
        self.writable = writable
        self._fd = _open_log(self.path) if writable else os.open(self.path, os.O_RDONLY)
        self._thread_lock = threading.Lock()
        self.torn_tail: TornTail | None = None

    @classmethod
    def open(cls, path: Path, writable: bool = True) -> UpdateLog:
        """Opens the log without reading it; the first read checks what it reads."""
        return cls(path, writable)

    @classmethod
    def create_starting_after(cls, path: Path, seq: int) -> bool:
        """Creates the log at ``path`` holding only a start marker for ``seq``, unless a log is
        there already; True if this call created it.

        The marker is written and fsync'd in a private file that is then linked into place, so
        a log that exists is never seen without it, even by workers starting at once.
        """
        path = Path(path)
        staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        ensure_private_dir(path.parent)
        staging.unlink(missing_ok=True)  # left by a crashed process that had this pid
        try:
            fresh = cls(staging)
            try:
                with fresh.exclusive():
                    fresh.append([], seq, at=0)
            finally:
                fresh.close()
            try:
                os.link(staging, path)
            except FileExistsError:
                return False
            fsync_path(path.parent)
            return True
        finally:
            staging.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self._fd)

    def read_from(self, offset: int, locked: bool = False) -> tuple[list[LogRecord], int]:
        """Complete records from ``offset`` on, and the offset after the last one (a torn tail
        is left for later: :attr:`torn_tail` says where it is).

        Raises :class:`UpdateLogCorrupt` when an unreadable record has intact ones after it.
        Inside :meth:`exclusive` pass ``locked=True``: taking the shared lock there would
        downgrade the writer's exclusive one.
        """
        if locked:
            return self._read(offset, self.size(), locked=True)
        with self._locked(fcntl.LOCK_SH):
            size = self.size()
        return self._read(offset, size, locked=False)

    def record_at(self, offset: int) -> LogRecord | None:
        """The record that starts at byte ``offset``; None at the end or where a torn tail starts.

        Raises ValueError when what starts there is not an intact record although more follows.
        """
        with self._locked(fcntl.LOCK_SH):
            size = self.size()
            if offset >= size:
                return None
            parsed = self._parse_at(offset, size)
            if isinstance(parsed, str):
                if parsed in _INCOMPLETE and self._next_intact(offset + 1, size) is None:
                    return None  # a torn tail: the record there is not written yet
                raise ValueError(f"no intact update record starts at byte {offset} ({parsed})")
        return parsed

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held by a writer from its catch-up read to its append, so no update interleaves."""
        if not self.writable:
            raise PermissionError(f"update log {self.path} was opened read-only")
        with self._locked(fcntl.LOCK_EX):
            yield

    def append(self, operations: list[dict[str, Any]], seq: int, at: int) -> int:
        """Writes and fsyncs one record at byte ``at``; call inside :meth:`exclusive`, with
        ``at`` the end that :meth:`read_from` returned there. Returns the new end.

        A torn tail at ``at`` (a writer that died mid-write) is replaced. If the write or the
        fsync fails the record is cut off again and :class:`UpdateLogWriteFailed` raised:
        nothing of it stays in the log.
        """
        content = {"seq": seq, "format": LOG_FORMAT, "operations": operations}
        payload = json.dumps(content, allow_nan=False).encode()
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"an update record of {len(payload)} bytes is over the limit")
        record = _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        size = self.size()
        if size < at:
            raise UpdateLogCorrupt(
                f"update log {self.path} is {size} bytes, shorter than the {at} bytes of "
                "records already read from it: it was truncated or replaced while in use"
            )
        if size > at:
            logger.warning(
                "update log %s: replaced an incomplete record at byte %d (%d bytes) left by a "
                "writer that stopped mid-write; it was never acknowledged",
                self.path,
                at,
                size - at,
            )
        try:
            if size > at:
                os.ftruncate(self._fd, at)
            _write_all(self._fd, record, at)
            os.fsync(self._fd)
        except OSError as error:
            raise self._roll_back(at, error) from error
        self.torn_tail = None
        return at + len(record)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def _roll_back(self, at: int, error: OSError) -> UpdateLogWriteFailed:
        """Cuts a failed record off and makes the cut durable; says whether that worked."""
        try:
            os.ftruncate(self._fd, at)
            os.fsync(self._fd)
            rolled_back = True
        except OSError as second:
            rolled_back = False
            logger.error(
                "update log %s: could not cut off a failed record at byte %d (%s): readers may "
                "see an update that was never acknowledged",
                self.path,
                at,
                second,
            )
        cause = os.strerror(error.errno) if error.errno else str(error)
        return UpdateLogWriteFailed(
            error.errno,
            f"the update could not be written to {self.path} ({cause}); nothing was applied",
            rolled_back,
        )

    @contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        with self._thread_lock:
            fcntl.flock(self._fd, mode)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self, offset: int, size: int, locked: bool) -> tuple[list[LogRecord], int]:
        records: list[LogRecord] = []
        while offset < size:
            parsed = self._parse_at(offset, size)
            if isinstance(parsed, LogRecord):
                records.append(parsed)
                offset = parsed.end
                continue
            if not locked:
                # A writer may have replaced a torn tail since the size was taken: look again
                # under the lock, where the file holds only whole records and that tail.
                with self._locked(fcntl.LOCK_SH):
                    rest, end = self._read(offset, self.size(), locked=True)
                return records + rest, end
            self._classify_unreadable(offset, size, parsed)
            break
        return records, offset

    def _classify_unreadable(self, offset: int, size: int, reason: str) -> None:
        """A torn tail if nothing intact follows ``offset``; damage otherwise (raises)."""
        following = self._next_intact(offset + 1, size)
        if following is not None:
            raise UpdateLogCorrupt(
                f"update log {self.path}: the record at byte {offset} is unreadable ({reason}) "
                f"but an intact record follows at byte {following}; refusing to replay past "
                "it (docs/dynamic-graphs.md, 'A damaged log')"
            )
        if self.torn_tail is None or self.torn_tail.offset != offset:
            self.torn_tail = TornTail(offset=offset, size=size - offset, reason=reason)

    def _next_intact(self, start: int, size: int) -> int | None:
        """Offset of the first intact record at or after ``start``, if any."""
        position = start
        while position < size:
            chunk = os.pread(self._fd, min(_SCAN_CHUNK, size - position) + len(MAGIC) - 1, position)
            found = chunk.find(MAGIC)
            while found >= 0:
                if isinstance(self._parse_at(position + found, size), LogRecord):
                    return position + found
                found = chunk.find(MAGIC, found + 1)
            position += _SCAN_CHUNK
        return None

    def _parse_at(self, offset: int, size: int) -> LogRecord | str:
        header = os.pread(self._fd, _HEADER.size, offset)
        if len(header) < _HEADER.size:
            return "truncated header"
        magic, length, crc = _HEADER.unpack(header)
        if magic != MAGIC:
            return "bad magic"
        end = offset + _HEADER.size + length
        if length > MAX_RECORD_BYTES or end > size:
            return "truncated payload"
        payload = os.pread(self._fd, length, offset + _HEADER.size)
        if len(payload) < length:
            return "truncated payload"
        if zlib.crc32(payload) != crc:
            return "checksum mismatch"
        # The checksum matches: the record was written whole and may have been acknowledged,
        # so whatever it holds is refused and kept, never taken for a torn tail to write over.
        where = f"update log {self.path}: the record at byte {offset}"
        try:
            content = json.loads(payload)
        except ValueError as error:
            raise UpdateLogCorrupt(
                f"{where} is intact but not JSON ({error}); {_REFUSED}"
            ) from None
        seq, operations = checked_content(content, where)
        return LogRecord(seq=seq, operations=operations, offset=offset, end=end)


def checked_content(content: Any, where: str) -> tuple[int, list[dict[str, Any]]]:
    """The seq and operations of an intact record's content ``{"seq", "format",
    "operations"}`` (``format`` absent: 1), the one rule of both logs. Anything else raises
    :class:`UpdateLogCorrupt` (``where`` names the record): a float or negative seq, a format
    that is not an integer from 1 to ``LOG_FORMAT`` (a newer one asks for an upgrade),
    operations that are not a list of objects, a missing or unknown field."""
    if not isinstance(content, dict) or not {"seq", "operations"} <= set(content) <= _FIELDS:
        shown = sorted(content) if isinstance(content, dict) else type(content).__name__
        raise UpdateLogCorrupt(
            f"{where} holds {shown}, not the fields {sorted(_FIELDS)}; {_REFUSED}"
        )
    seq, written, operations = content["seq"], content.get("format", 1), content["operations"]
    if type(written) is int and written > LOG_FORMAT:
        raise UpdateLogCorrupt(
            f"{where} is format {written}, newer than this gnnserve reads ({LOG_FORMAT}); "
            "upgrade this server"
        )
    if type(written) is not int or written < 1:
        raise UpdateLogCorrupt(
            f"{where} has format {written!r}; formats 1 to {LOG_FORMAT} exist; {_REFUSED}"
        )
    if type(seq) is not int or seq < 0:
        raise UpdateLogCorrupt(f"{where} has seq {seq!r}, not a non-negative integer; {_REFUSED}")
    if not isinstance(operations, list) or not all(isinstance(o, dict) for o in operations):
        raise UpdateLogCorrupt(f"{where} has operations that are not a list of objects; {_REFUSED}")
    return seq, operations


def check_next(record: LogRecord, previous_seq: int, path: str | Path) -> None:
    """Replay's order rule: every record's seq is the previous one's + 1. A duplicate or a gap
    means two writers appended at once or the log was edited; replaying on would diverge."""
    if record.seq != previous_seq + 1:
        raise UpdateLogCorrupt(
            f"update log {path}: the record at byte {record.offset} has seq {record.seq} where "
            f"seq {previous_seq + 1} was expected (a duplicate or a missing record); refusing "
            "to replay past it (docs/dynamic-graphs.md, 'A damaged log')"
        )


def _open_log(path: Path) -> int:
    """Opens (creating if needed) a log read-write; a new file's directory entry is fsync'd so
    the log itself survives a crash, not only its records."""
    ensure_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return os.open(path, os.O_RDWR)
    fsync_path(path.parent)
    return fd


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` until every byte is written: a full disk or a file-size limit may write only
    part of a record and report it as success."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[written:], offset + written
