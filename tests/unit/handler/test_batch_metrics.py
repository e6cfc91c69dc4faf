"""Batch figures summed per interval: what is reported, and when."""

from __future__ import annotations

import pytest

from handler.pipeline.batch import StageTimes
from handler.pipeline.metrics import GAUGES, BatchMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batch(size: int, parse: float = 0.001) -> StageTimes:
    return StageTimes(
        batch_size=size,
        seed_nodes=size,
        sampled_nodes=10 * size,
        sampled_edges=20 * size,
        parse=parse,
        sample=0.002,
        gather=0.0,
        forward=0.003,
        format=0.0,
    )


def test_the_first_batch_is_reported_at_once_then_one_summary_per_interval():
    clock = Clock()
    metrics = BatchMetrics(1.0, clock=clock)
    first = metrics.add(batch(4), errors=1)
    assert first is not None and first.batches == 1 and first.errors == 1
    assert first.mean_per_batch()["batch_size"] == 4
    clock.now += 0.3
    assert metrics.add(batch(2), errors=0) is None
    clock.now += 0.3
    assert metrics.add(batch(6, parse=0.003), errors=2) is None
    clock.now += 0.5  # 1.1 s after the first report
    summary = metrics.add(batch(8), errors=0)
    assert summary is not None
    assert summary.batches == 3 and summary.largest_batch == 8 and summary.errors == 2
    assert summary.seconds == pytest.approx(1.1)
    mean = summary.mean_per_batch()
    assert mean["batch_size"] == pytest.approx((2 + 6 + 8) / 3)
    assert mean["sampled_edges"] == pytest.approx(20 * 16 / 3)
    assert mean["parse"] == pytest.approx((1 + 3 + 1) / 3)  # milliseconds
    assert mean["forward"] == pytest.approx(3.0)
    assert set(mean) == set(GAUGES)
    clock.now += 0.2
    assert metrics.add(batch(1), errors=0) is None  # a new interval has begun


def test_an_interval_of_zero_reports_every_batch():
    metrics = BatchMetrics(0.0, clock=Clock())
    summaries = [metrics.add(batch(size), errors=0) for size in (3, 5, 7)]
    assert [s.largest_batch for s in summaries if s is not None] == [3, 5, 7]


def test_the_log_line_names_count_sizes_and_errors():
    summary = BatchMetrics(0.0, clock=Clock()).add(batch(16), errors=3)
    assert summary is not None
    line = summary.describe()
    assert line.startswith("gnn batches: 1 in 0.00 s, requests per batch mean 16.0 max 16;")
    assert "160 sampled nodes" in line and "3 error answers" in line
