"""The ways building or opening a graph store fails, each with a message a user can act on."""

from __future__ import annotations


class GraphInputError(ValueError):
    """An input file (nodes/edges CSV or Parquet) is missing or holds a bad value.

    ``row`` is the 1-based data row as a user counts it (the header is not a row, so data row 17
    of a CSV is its line 18), or ``None`` when the problem is not in one row (a missing file or
    column). The message reads ``nodes.csv row 17: <problem>``.
    """

    def __init__(self, file: str, row: int | None, problem: str) -> None:
        self.file = file
        self.row = row
        self.problem = problem
        where = file if row is None else f"{file} row {row}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type[GraphInputError], tuple[str, int | None, str]]:
        # The default reduce would call __init__ with the message alone; keep the fields instead.
        return (type(self), (self.file, self.row, self.problem))


class StoreError(RuntimeError):
    """A graph store is missing, corrupt, of another format version, or cannot be written."""


class UpdateLogMismatch(StoreError):
    """A compacted store's update log does not continue where the store says its updates stop
    (the log is shorter, or holds another record there): serving it would lose or misapply
    updates."""


class UpdateLogCorrupt(StoreError):
    """A record in the middle of an update log is unreadable while intact records follow it, or
    the records' seqs do not run 1, 2, 3, ...: the log was damaged or written by two writers at
    once. Replaying past it would lose or misapply acknowledged updates, so nothing does."""


class UpdateLogWriteFailed(OSError):
    """Appending a record failed (a full disk or quota, an I/O error); the record was rolled back
    (``rolled_back``), so no reader ever sees it. ``errno`` is the cause's."""

    def __init__(self, errno: int | None, message: str, rolled_back: bool) -> None:
        super().__init__(errno, message)
        self.rolled_back = rolled_back

    def __str__(self) -> str:
        return str(self.strerror)


class UnsafeDirectory(StoreError):
    """A directory that must be private to this user (the update state, the graph cache) is
    not: another user could have planted what it holds (an update record, a graph) or could
    read it, so nothing in it is used."""


class UpdateLogConflict(StoreError):
    """Another writer appended the seq this one was about to write (a shared log that several
    servers write): nothing was written; catch up and validate the update again."""


class UpdateLogUnavailable(StoreError):
    """The update log cannot be reached (Redis down, a network partition): nothing was read or
    written. Serving goes on from the last version applied; updates wait for it."""


class UpdateNotReplicated(StoreError):
    """The record was written, but fewer replicas than required confirmed it in time: it is in
    the log (every server applies it) but not as durable as configured, so it is not
    acknowledged."""


class SubgraphTooLarge(Exception):
    """A sampled ego-graph would exceed the configured node or edge limit; raised before it is
    built (the serving layer answers it 413)."""

    def __init__(self, nodes: int, edges: int, max_nodes: int, max_edges: int) -> None:
        super().__init__(
            f"the sampled ego-graph would have at least {nodes} nodes and {edges} edges; "
            f"the limits are {max_nodes} nodes and {max_edges} edges"
        )
        self.nodes = nodes
        self.edges = edges
