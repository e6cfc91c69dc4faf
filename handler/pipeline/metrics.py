"""Per-batch figures summed up and reported once per interval instead of once per batch.

Each metric TorchServe's Python side records is a log line that the worker formats and the Java
frontend parses; ten of them per batch cost ~10% of a busy worker's time (py-spy, batch 16).
Summing batches over a short interval keeps every figure (as a mean per batch) at a cost that
no longer grows with the request rate. An interval of 0 reports every batch on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from handler.pipeline.batch import StageTimes

# Gauge name and unit of each StageTimes field; stage times are reported in milliseconds.
GAUGES: dict[str, tuple[str, str]] = {
    "batch_size": ("GnnBatchSize", "Count"),
    "seed_nodes": ("GnnSeedNodes", "Count"),
    "sampled_nodes": ("GnnSampledNodes", "Count"),
    "sampled_edges": ("GnnSampledEdges", "Count"),
    "parse": ("GnnParseTime", "ms"),
    "sample": ("GnnSampleTime", "ms"),
    "gather": ("GnnGatherTime", "ms"),
    "forward": ("GnnForwardTime", "ms"),
    "format": ("GnnFormatTime", "ms"),
    "remote_round_trips": ("GnnRemoteRoundTrips", "Count"),
    "remote_bytes": ("GnnRemoteBytes", "Count"),
    "remote_cache_hits": ("GnnRemoteCacheHits", "Count"),
    "remote_cache_misses": ("GnnRemoteCacheMisses", "Count"),
    "remote_read": ("GnnRemoteReadTime", "ms"),
}
_FIELDS = tuple(entry.name for entry in fields(StageTimes))
_SECONDS = tuple(name for name, (_, unit) in GAUGES.items() if unit == "ms")  # timed in s
_STAGES = tuple(name for name in _SECONDS if not name.startswith("remote_"))  # the read is in them


@dataclass
class BatchSummary:
    """The batches of one interval: their count, sums, largest batch and error answers."""

    batches: int = 0
    largest_batch: int = 0
    errors: int = 0
    seconds: float = 0.0
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GAUGES, 0.0))

    def mean_per_batch(self) -> dict[str, float]:
        """Each StageTimes field averaged over the interval's batches (stage times in ms)."""
        scale = {name: 1000.0 if name in _SECONDS else 1.0 for name in GAUGES}
        return {name: self.totals[name] * scale[name] / self.batches for name in GAUGES}

    def describe(self) -> str:
        """One log line: how many batches and how large, what they sampled, how long it took."""
        mean = self.mean_per_batch()
        return (
            f"gnn batches: {self.batches} in {self.seconds:.2f} s, requests per batch mean "
            f"{mean['batch_size']:.1f} max {self.largest_batch}; per batch {mean['seed_nodes']:.0f}"
            f" seeds, {mean['sampled_nodes']:.0f} sampled nodes, {mean['sampled_edges']:.0f} "
            f"sampled edges, {sum(mean[name] for name in _STAGES):.2f} ms in the engine; "
            f"{self.errors} error answers{self._remote(mean)}"
        )

    def _remote(self, mean: dict[str, float]) -> str:
        """The Redis part of the line, on a graph read from Redis."""
        hits, misses = self.totals["remote_cache_hits"], self.totals["remote_cache_misses"]
        if not self.totals["remote_round_trips"] and not hits + misses:
            return ""
        ratio = hits / (hits + misses) if hits + misses else 1.0
        return (
            f"; Redis per batch {mean['remote_round_trips']:.1f} round trips, "
            f"{mean['remote_bytes'] / 1024:.1f} KiB, {mean['remote_read']:.2f} ms, cache hit "
            f"ratio {ratio:.2f}"
        )


class BatchMetrics:
    """Accumulates batches and hands back a summary when ``interval_s`` has passed.

    The first batch is summarised at once, so a fresh worker shows up in the metrics and log
    straight away; after that, at most one summary per interval, on the batch that ends it.
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._started: float | None = None
        self._pending = BatchSummary()

    def add(self, times: StageTimes, errors: int) -> BatchSummary | None:
        """Counts one batch; returns the summary to report when the interval is over."""
        now = self._clock()
        pending = self._pending
        pending.batches += 1
        pending.largest_batch = max(pending.largest_batch, times.batch_size)
        pending.errors += errors
        for name in _FIELDS:
            pending.totals[name] += getattr(times, name)
        if self._started is not None and now - self._started < self.interval_s:
            return None
        pending.seconds = 0.0 if self._started is None else now - self._started
        self._started, self._pending = now, BatchSummary()
        return pending
