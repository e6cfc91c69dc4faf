"""``bench.experiments.suite.finish_run``: how every experiment ends a run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")

from bench.experiments import suite


def test_finish_run_records_steal_and_time_prints_the_table_and_writes_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(suite, "steal_percent", lambda before: 2.5 if before == (3, 7) else -1)
    results: dict[str, Any] = {"served": 1}
    out = tmp_path / "run.json"
    suite.finish_run(results, time.perf_counter(), (3, 7), lambda r: f"table of {sorted(r)}", out)
    assert results["steal_percent"] == 2.5
    assert 0 <= results["run_s"] < 60
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "table of ['run_s', 'served', 'steal_percent']",
        f"(run took {results['run_s']} s; steal 2.5%)",
    ]
    assert json.loads(out.read_text()) == results
    assert out.read_text().endswith("}\n")
