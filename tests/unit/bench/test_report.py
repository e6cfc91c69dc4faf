"""``python -m bench.report``, run as ``make bench`` runs it, on the committed quick results."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed")

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "bench-results" / "results-quick.json"


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
    done = subprocess.run(
        [sys.executable, "-m", "bench.report", str(RESULTS), "--doc", str(doc), "--img", str(img)],
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
                "latency-cdf",
                "latency-vs-graph-size",
                "memory-vs-workers",
                "stages",
                "throughput-vs-concurrency",
            )
        )
    ]
