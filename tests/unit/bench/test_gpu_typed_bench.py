"""The typed GPU bench runs end to end with its CPU stand-ins: every mode answers the same
batches as the CPU worker, and its table says how each forward ran."""

from __future__ import annotations

import argparse

import pytest

from bench.experiments.gpu_typed import MODES, run, table


def test_the_cpu_dry_run_answers_as_the_cpu_worker_in_every_mode():
    args = argparse.Namespace(
        device="cpu",
        users=300,
        archs="sage",
        fanouts="3,2",
        batch_sizes="1,8",
        batches=2,
        warmup=1,
    )
    rows = run(args)
    assert [(r["mode"], r["batch"]) for r in rows] == [(m, b) for b in (1, 8) for m in MODES]
    for row in rows:
        assert row["max_abs_diff"] <= 1e-5 and row["classes_agree"], row
        assert row["forward_runs"] == "eager"  # no CUDA graphs on a CPU
        assert row["total"] >= row["forward"] > 0
    text = table(rows)
    assert text.count("\n") == len(rows) + 1 and "| sage | cpu | served | 8 |" in text


@pytest.mark.parametrize("bad", [{"max_abs_diff": 1e-3}, {"classes_agree": False}])
def test_the_table_marks_a_row_that_disagrees(bad):
    row = {
        "arch": "sage",
        "device": "cuda",
        "mode": "served",
        "batch": 16,
        "sample": 0.1,
        "forward": 0.2,
        "total": 0.4,
        "forward_runs": "captured (3 graphs)",
        "max_abs_diff": 0.0,
        "classes_agree": True,
        **bad,
    }
    line = table([row]).splitlines()[-1]
    assert ("NO" in line) is ("classes_agree" in bad)
    assert ("1.0e-03" in line) is ("max_abs_diff" in bad)
