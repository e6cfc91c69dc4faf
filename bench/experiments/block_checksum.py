"""What verifying a block's checksum costs a remote read: each hash a graph in Redis could be
sealed with (``graph_assets.remote.layout.sealed``), timed on one value of each size.

    python -m bench.experiments.block_checksum

A cold read verifies every value it receives: at 16 KiB a value (128 float32 features, the
default block size), the 102 MiB a cold Zipf batch of the 10M-edge graph reads are 6,528
values. A markdown table of microseconds per value goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import timeit
import zlib
from collections.abc import Callable

import blake3

from graph_assets.remote.layout import sealed, unsealed

SIZES = (512, 16 << 10, 64 << 10)  # a small in-list, a block of features, a wide one


def verifiers(value: bytes) -> dict[str, Callable[[], object]]:
    """Each candidate's check of ``value`` as the reader makes it: hash the body, compare."""
    raw = sealed(value)
    crc = zlib.crc32(value).to_bytes(4, "little")
    digest = blake3.blake3(value).digest(8)
    view = memoryview(value)
    return {
        "xxh3-64 (`unsealed`, in use)": lambda: unsealed(raw),
        "zlib.crc32": lambda: zlib.crc32(view).to_bytes(4, "little") == crc,
        "blake3, 8 bytes": lambda: blake3.blake3(view).digest(8) == digest,
    }


def measure(repeats: int, number: int) -> dict[str, list[float]]:
    """Microseconds per verified value, per candidate, at each of `SIZES` (best of
    ``repeats`` runs of ``number`` checks)."""
    figures: dict[str, list[float]] = {}
    for size in SIZES:
        for name, check in verifiers(os.urandom(size)).items():
            best = min(timeit.repeat(check, number=number, repeat=repeats)) / number
            figures.setdefault(name, []).append(best * 1e6)
    return figures


def table(figures: dict[str, list[float]]) -> str:
    header = " | ".join(f"{size >> 10} KiB" if size >= 1024 else f"{size} B" for size in SIZES)
    lines = [f"| check | {header} |", "|---" * (len(SIZES) + 1) + "|"]
    for name, micros in figures.items():
        lines.append(f"| {name} | " + " | ".join(f"{m:.2f} us" for m in micros) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs, the best kept (5)")
    parser.add_argument("--number", type=int, default=20_000, help="checks per run (20,000)")
    args = parser.parse_args()
    print(table(measure(args.repeats, args.number)))


if __name__ == "__main__":
    main()
