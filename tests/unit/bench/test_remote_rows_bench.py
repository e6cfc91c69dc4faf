"""bench.experiments.remote_rows on a small graph: the rows are loaded, every read is one round
trip cold and none warm, and the table shows each batch size."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.experiments.remote_rows import BATCHES, measure, table
from tests.servers.redis_server import MISSING, redis_server_binary


def test_a_small_run_reads_each_batch_in_one_round_trip(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    figures = measure(3000, 20000, 3, tmp_path)
    assert figures["nodes"] == 3000 and figures["load_mib"] > 0
    assert figures["redis_bytes_per_row_byte"] > 0.5
    assert [r["batch"] for r in figures["reads"]] == list(BATCHES)
    for row in figures["reads"]:
        assert row["cold_trips_per_read"] == 1.0 and row["warm_trips_per_read"] == 0.0
    assert table(figures).count("\n| ") == len(BATCHES) + 1
