"""The served GPU bench: its requests, the level it reports, and its answer check."""

from __future__ import annotations

import json

from bench.experiments.gpu_served import (
    IDS_PER_REQUEST,
    best_within,
    request_bodies,
    table,
    worst_differences,
)


def levels(*rows: tuple[int, float, int]) -> list[dict]:
    return [
        {
            "connections": c,
            "predictions_per_s": p,
            "requests_per_s": p / 32,
            "p50_ms": 1.0,
            "p99_ms": p99,
            "errors": 0,
        }
        for p, p99, c in rows
    ]


def test_requests_ask_for_32_distinct_ids_the_graph_has_and_repeat_with_the_seed():
    bodies = request_bodies(1000, count=50)
    for body in bodies:
        ids = json.loads(body)["node_ids"]
        assert len(ids) == len(set(ids)) == IDS_PER_REQUEST and 0 <= min(ids) <= max(ids) < 1000
    assert bodies == request_bodies(1000, count=50) != request_bodies(1000, count=50, seed=1)


def test_the_figure_is_the_fastest_level_within_the_latency_bound_without_errors():
    measured = levels((100_000, 4.0, 16), (300_000, 9.9, 64), (400_000, 12.0, 128))
    assert best_within(measured, 10.0)["connections"] == 64
    measured[1]["errors"] = 1
    assert best_within(measured, 10.0)["connections"] == 16
    assert best_within(measured, 1.0) is None


def test_the_table_gives_ratios_to_the_cpu_archive_and_marks_a_missed_bound():
    results = {
        "archives": {
            "cpu": {"levels": levels((50_000, 8.0, 16)), "diff": 0.0},
            "gpu_w1": {"levels": levels((250_000, 9.0, 64)), "diff": 2e-7},
            "gpu_w2": {"levels": levels((300_000, 30.0, 256)), "diff": 0.0},
        }
    }
    for entry in results["archives"].values():
        entry["best"] = best_within(entry["levels"], 10.0)
    text = table(results, 10.0)
    assert "| gpu_w1 | 250,000 |" in text and "| 5.00 |" in text
    assert "none within the bound (fastest level: 300,000 at p99 30.0 ms" in text


def test_answers_are_compared_with_the_cpu_archives():
    worst = worst_differences({"cpu": [[0.5, 0.5]], "gpu_w1": [[0.5, 0.5 + 3e-6]]})
    assert worst["cpu"] == 0.0 and abs(worst["gpu_w1"] - 3e-6) < 1e-9
