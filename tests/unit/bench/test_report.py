"""``make bench``'s ``python -m bench.report.benchmarks``, on the committed quick results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed")

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "bench-results" / "results-quick.json"
FULL = ROOT / "docs" / "bench-results" / "results-full.json"


def test_report_rewrites_the_tables_and_draws_the_plots(tmp_path):
    doc = tmp_path / "benchmarks.md"
    shutil.copy(ROOT / "docs" / "benchmarks.md", doc)
    before = doc.read_text()
    start = before.index("<!-- results:quick:begin -->")
    doc.write_text(
        before[:start]
        + "<!-- results:quick:begin -->\nstale\n"
        + before[before.index("<!-- results:quick:end -->") :]
    )
    img = tmp_path / "img"
    img.mkdir()
    report = [sys.executable, "-m", "bench.report.benchmarks", str(RESULTS)]
    done = subprocess.run(
        [*report, "--doc", str(doc), "--img", str(img)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "stale" not in text and "### Targets" in text
    assert before[:start] == text[:start]  # the hand-written part is kept
    assert "in-process 32 seeds" in done.stdout and "total PSS 4 workers" in done.stdout
    assert sorted(p.name for p in img.glob("*.png")) == [
        f"bench-quick-{name}.png"
        for name in sorted(
            (
                "latency-p50-p99",
                "latency-vs-graph-size",
                "memory-vs-workers",
                "stages",
                "throughput-vs-concurrency",
            )
        )
    ]


def test_the_floor_target_is_the_median_of_the_back_to_back_pairs():
    from bench.report.benchmarks import floor_pair_ratios, targets

    results = json.loads(RESULTS.read_text())
    results["load"] = [r for r in results["load"] if r.get("experiment") != "floor_pairs"]
    level = {"mode": "closed", "graph": "1M", "batch": 16, "delay": 5, "concurrency": 32}
    pairs = [(1000.0, 700.0), (2000.0, 1000.0), (1500.0, 1200.0)]  # ratios 0.7, 0.5, 0.8
    for pair, (echo, ours) in enumerate(pairs):
        common = {**level, "experiment": "floor_pairs", "pair": pair}
        results["load"].append({"system": "echo", **common, "throughput": echo})
        results["load"].append(
            {"system": "gnnserve", **common, "fanouts": [10, 10], "threads": 1, "throughput": ours}
        )
    assert floor_pair_ratios(results) == pytest.approx([0.7, 0.5, 0.8])
    rows = {figure: (measured, verdict) for figure, _, measured, verdict in targets(results)}
    figure = (
        "throughput / echo floor, 1M, [10,10], 32 conns, 16/5 ms, median of 3 back-to-back pairs"
    )
    assert rows[figure] == ("0.70", "met")
    assert rows["(the pairs' ratios, in order)"][0] == "0.70, 0.50, 0.80"


def test_the_full_block_compares_the_systems_at_the_main_configuration():
    from bench.report.benchmarks import _rate, main_rows, tables

    results = json.loads(FULL.read_text())
    body = tables(results)
    for section in ("Main configuration", "Open loop", "batching settings", "graph size", "memory"):
        assert section in body
    for system in ("gnnserve", "echo", "fastapi-khop", "fastapi-whole"):
        assert [r["concurrency"] for r in main_rows(results, system)] == [1, 8, 32, 128]
    ours = main_rows(results, "gnnserve")  # not the pairs, 2 workers, default threads or sizes
    assert all(
        (r["batch"], r["delay"], r["threads"], r.get("workers", 1)) == (16, 5, 1, 1)
        and "experiment" not in r
        for r in ours
    )
    assert f"| 32 | {_rate(ours[2]['throughput'])} |" in body
    assert "Main configuration" not in tables(json.loads(RESULTS.read_text()))  # quick: targets
