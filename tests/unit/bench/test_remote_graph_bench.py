"""``python -m bench.experiments.remote_graph``'s pure parts: the Redis figures read back from
the handler's own batch log lines, the request mixes, and the report's ratios and verdicts (the
TorchServe pairs are made up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.pipeline.metrics import GAUGES, BatchSummary

pytest.importorskip("aiohttp", reason="the bench extra is not installed")

from bench.experiments import remote_graph, typed_graph


def _line(model: str, batches: int, round_trips: float, hits: int, misses: int) -> str:
    """A batch summary as a worker logs it, through TorchServe's log prefix."""
    totals = dict.fromkeys(GAUGES, 0.0) | {
        "batch_size": 16.0 * batches,
        "remote_round_trips": round_trips * batches,
        "remote_bytes": 2048.0 * batches,
        "remote_cache_hits": float(hits),
        "remote_cache_misses": float(misses),
        "remote_read": 0.002 * batches,  # seconds; logged in ms
    }
    summary = BatchSummary(batches=batches, largest_batch=16, seconds=1.0, totals=totals)
    return (
        f"2026-12-05T00:07:32,591 [INFO ] W-9001-{model}_1.0-stdout MODEL_LOG - "
        f"{summary.describe()}\n"
    )


def test_batch_reads_weighs_each_interval_by_its_batches_for_one_model(tmp_path: Path) -> None:
    log = tmp_path / "model_log.log"
    log.write_text(_line("remote", 5, 9.0, 0, 10))  # before the measured part
    since = remote_graph.log_offset(log)
    with log.open("a") as out:
        out.write(_line("remote", 1, 4.0, 0, 10))  # a first interval of one batch: left out
        out.write(_line("remote", 30, 1.0, 90, 10))
        out.write(_line("remote_10M", 50, 4.0, 10, 90))  # another model
        out.write(_line("remote", 10, 3.0, 50, 50))
        out.write("2026-12-05T00:07:33,000 [INFO ] W-9002-local_1.0-stdout MODEL_LOG - x\n")

    reads = remote_graph.batch_reads(log, "remote", since)

    assert reads["batches"] == 40 and reads["intervals"] == 2
    assert reads["round_trips"] == pytest.approx((30 * 1.0 + 10 * 3.0) / 40)
    assert reads["round_trips_max_interval"] == 3.0
    assert reads["hit_ratio"] == pytest.approx((30 * 0.9 + 10 * 0.5) / 40)
    assert reads["kib"] == pytest.approx(2.0) and reads["read_ms"] == pytest.approx(2.0)
    assert remote_graph.batch_reads(log, "remote_10M", since)["round_trips"] == 4.0
    with pytest.raises(RuntimeError, match="no batch log line of local"):
        remote_graph.batch_reads(log, "local", since)


def _ids(bodies: list[bytes]) -> list[list[int]]:
    return [json.loads(body)["node_ids"] for body in bodies]


def test_requests_ask_for_10_to_14_ids_and_zipf_favours_a_few_nodes() -> None:
    uniform = _ids(remote_graph.uniform_bodies(1000, 2000))
    zipf = _ids(remote_graph.zipf_bodies(1000, 2000))
    for requests in (uniform, zipf):
        assert {len(ids) for ids in requests} == set(range(10, 15))
        assert all(0 <= i < 1000 for ids in requests for i in ids)
    assert np.mean([len(ids) for ids in uniform]) == pytest.approx(12, abs=0.2)
    counts = np.sort(np.bincount(np.concatenate(zipf), minlength=1000))[::-1]
    assert counts[0] > 0.2 * counts.sum()  # Zipf(1.1): the top node is ~1/zeta(1.1) of draws
    assert np.bincount(np.concatenate(uniform), minlength=1000).max() < 0.01 * counts.sum()
    assert remote_graph.zipf_bodies(1000, 50) == remote_graph.zipf_bodies(1000, 50)


def _level(throughput: float, p50: float) -> dict[str, float]:
    return {"throughput": throughput, "p50_ms": p50, "p99_ms": 2 * p50}


def test_the_table_takes_medians_of_pair_ratios_and_says_met_or_missed() -> None:
    served: list[dict[str, Any]] = [
        {"concurrency": 32, "pair": 0, "local": _level(1000, 20), "remote": _level(700, 30)},
        {"concurrency": 32, "pair": 1, "local": _level(1000, 20), "remote": _level(500, 30)},
        {"concurrency": 32, "pair": 2, "local": _level(800, 20), "remote": _level(400, 30)},
        {"concurrency": 1, "pair": 0, "local": _level(100, 8), "remote": _level(80, 10)},
        {"concurrency": 1, "pair": 1, "local": _level(100, 10), "remote": _level(80, 12)},
        {"concurrency": 1, "pair": 2, "local": _level(100, 8), "remote": _level(80, 16)},
    ]
    assert remote_graph.ratio({"served": served}, 32, "throughput") == (0.5, [0.7, 0.5, 0.5])
    assert remote_graph.ratio({"served": served}, 1, "p50_ms")[0] == pytest.approx(1.25)

    reads = {"round_trips": 4.0, "round_trips_max_interval": 4.0, "hit_ratio": 0.8}
    results = {
        "served": served,
        "reads": reads | {"batches": 100, "kib": 1.0, "read_ms": 2.0},
        "zipf": {
            name: {
                "pss_mib": pss,
                "pss_anon_mib": pss - 8,
                "pss_idle_mib": 140.0,
                "reads": reads | {"kib": 1024.0},
                "throughput": 50.0,
            }
            for name, pss in (
                ("remote", 200.0),
                ("remote_10M", 230.0),
                ("remote_sized", 150.0),
                ("remote_10M_sized", 240.0),
            )
        },
        "local_pss_mib": 210.0,
        "in_process": {
            name: dict.fromkeys((*typed_graph.STAGES, "total"), 1.0)
            for name in remote_graph.SYSTEMS
        },
        "load": {
            graph: {
                "rows": 10,
                "seconds": 1.0,
                "rows_per_s": 10,
                "bytes_per_edge": 5.0,
                "bytes_per_feature_byte": 1.25,
                "sampled_blocks": 8,
                "used_memory_bytes": 2**20,
            }
            for graph in remote_graph.PREFIXES
        },
    }
    rows = remote_graph.table(results).splitlines()
    assert "| 1.25 | met:" in rows[2] and "| 0.50 | missed:" in rows[3]
    assert "| 1.15 | met:" in rows[4] and "| 4.00 | met:" in rows[5]
    assert any("cache sized" in row and "| info | 1.60 |" in row for row in rows), rows
    assert "before the first request 140 vs 140" in rows[4]

    memory_only = {key: results[key] for key in ("zipf", "load")}
    rows = remote_graph.table(memory_only).splitlines()
    assert "| 1.15 | met:" in rows[2] and "cache hit ratio" in rows[3], rows
    assert len(rows) == 6  # memory, hit ratio, sized memory, load: no served figures
