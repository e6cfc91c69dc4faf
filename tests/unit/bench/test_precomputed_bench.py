"""``python -m bench.experiments.precomputed`` on a tiny graph: every in-process measurement runs
and lands in the table (the TorchServe pairs are checked on made-up levels)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.harness.artifacts import Artifacts
from graph_assets import generate_synthetic

pytest.importorskip("aiohttp", reason="the bench extra is not installed")

from bench.experiments import precomputed


@pytest.fixture()
def threads() -> Iterator[None]:
    """The measurements set one intra-op thread, as a worker runs: put torch's back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_in_process_figures_on_a_tiny_graph(tmp_path: Path, threads: None) -> None:
    store_dir = tmp_path / "store"
    generate_synthetic(2000, 20_000, store_dir)
    model_dir = Artifacts(tmp_path).model_dir()
    rows_dir = tmp_path / "precomputed"
    full = precomputed.precompute_run(store_dir, model_dir, rows_dir)
    forward = precomputed.forward_run(store_dir, model_dir)
    assert full.seconds > 0 and forward.seconds > 0
    streams = {
        name: precomputed.update_stream(store_dir, model_dir, rows, tmp_path / f"{name}.log", 40, 5)
        for name, rows in (("refreshed", rows_dir), ("plain", None))
    }
    refreshed, plain = streams["refreshed"], streams["plain"]
    assert refreshed.requests == plain.requests > 35  # one stream, the same duplicates refused
    assert refreshed.refreshed_rows >= refreshed.requests  # each update refreshes its node
    assert refreshed.rows_held[0] > 0 and refreshed.row_bytes == [4 * 64, 4 * 8]
    assert plain.refresh_seconds == 0
    reads = precomputed.reads_after_updates(
        store_dir, model_dir, rows_dir, tmp_path / "reads.log", 4, 3, target_rows=300
    )
    rows = reads["refreshed_rows"]
    assert rows["mean"] == rows["predicted_mean"]  # the reach rule is the refresh's
    assert 285 <= rows["min"] <= rows["max"] <= 315
    assert reads["quiet_ms"]["n"] == 12 and reads["after_update_ms"]["n"] == 4
    assert reads["after_own_update_ms"]["n"] == 4
    build = {
        "nodes": 2000,
        "edges": 20_000,
        "features": 128,
        "forward": [vars(forward) | {"seconds": 1.0}, vars(forward) | {"seconds": 2.0}],
        "precompute": [vars(full) | {"seconds": 1.5}, vars(full) | {"seconds": 3.5}],
    }
    refresh = {
        "edges": 20_000,
        "full_precompute": {"seconds": full.seconds},
        "files": precomputed.file_bytes(rows_dir),
        "streams": {name: vars(s) | {"rate": s.rate} for name, s in streams.items()},
        "reads": reads,
    }
    lines = precomputed.build_rows(build) + precomputed.refresh_rows(refresh)
    assert "| <= 2 | 1.67 | met: 2.5 s vs 1.5 s, medians of 2 (ratios 1.50, 1.75);" in lines[0]
    assert len(lines) == 7 and all(line.startswith("| ") and line.endswith(" |") for line in lines)


def test_the_serving_rows_are_medians_of_the_pairs() -> None:
    def level(throughput: float, p50: float) -> dict[str, float]:
        return {
            "throughput": throughput,
            "p50_ms": p50,
            "errors": 0,
            "worker_cpu_ms_per_request": 0.1,
        }

    levels = [
        {"archive": archive, "concurrency": c, "pair": pair, "echo": level(100, 10), archive: ours}
        for c in (32, 1)
        for archive, per_pair in (
            ("precomputed", [level(95, 10.5), level(80, 12), level(92, 10.8)]),
            ("sampled", [level(60, 15), level(65, 14), level(70, 13)]),
        )
        for pair, ours in enumerate(per_pair)
    ]
    lines = precomputed.serving_rows({"levels": levels})
    assert lines[0].endswith(
        "| >= 0.9 | 0.92 | met: 92 vs 100 req/s (medians); pairs 0.95, 0.80, 0.92; "
        "worker CPU 0.10 vs 0.10 ms a request |"
    )
    assert lines[1].startswith("| (sampled [10,10]: req/s") and "| info | 0.65 |" in lines[1]
    assert "| <= 1.1 | 1.08 | met: 10.80 vs 10.00 ms (medians); pairs 1.05, 1.20, 1.08;" in lines[2]


def test_the_served_read_row_compares_p99s() -> None:
    served = {
        "rounds": 3,
        "quiet_ms": {"p50": 7.0, "p99": 9.0, "n": 30},
        "after_update_ms": {"p50": 8.0, "p99": 13.5, "n": 3},
        "rows_reached_mean": 1001.3,
        "describe": {"refreshed_rows": 2500, "refresh_seconds": 0.25, "pending_rows": 0},
    }
    (line,) = precomputed.served_read_rows(served)
    assert "| <= 2 | 1.50 | met: 13.50 vs 9.00 ms (p50 8.00 vs 7.00 ms), 3 updates" in line
    assert "reaching 1,001 rows on average, 30 quiet reads; one worker's describe: 2,500" in line
