"""The checksum micro-benchmark times every candidate at every size and tables them."""

from __future__ import annotations

from bench.experiments.block_checksum import SIZES, measure, table


def test_every_candidate_is_timed_at_every_size() -> None:
    figures = measure(repeats=1, number=5)
    assert set(figures) == {"xxh3-64 (`unsealed`, in use)", "zlib.crc32", "blake3, 8 bytes"}
    assert all(len(micros) == len(SIZES) and min(micros) > 0 for micros in figures.values())
    lines = table(figures).splitlines()
    assert lines[0] == "| check | 512 B | 16 KiB | 64 KiB |"
    assert len(lines) == 2 + len(figures) and all(line.endswith(" us |") for line in lines[2:])
