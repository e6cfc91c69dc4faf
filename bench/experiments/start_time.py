"""Server start to the first answer, and disk used per start: the graph inside the archive or
by reference (``build_mar.sh --graph-location``).

``python -m bench.experiments.start_time`` generates a synthetic graph with about 1 GB of
float32 features (2,000,000 nodes x 128) and builds three archives of it with the same weights:
the graph inside the ``.mar``; by reference, its files re-hashed at every worker start (the
default); by reference with ``--no-verify-checksum`` (sizes, meta.json checksum and structure
only). It then starts a fresh TorchServe on each in turn, ``--repeats`` rounds, and times
``torchserve --start`` to the first 200 answer (polled every 50 ms), and measures the disk the
start used: the server's temp dir, where TorchServe unpacks the archive and the handler keeps its
graph cache (hard links counted once). From TorchServe's log it splits out the two phases the
graph can cost: the frontend unpacking the archive, and the worker's load (imports, weights,
graph checks). Everything lives in one temporary directory, removed at the end. The page cache
is warm in every case (the store and the archives were just written); dirty pages are flushed
(``sync``) before each start so that one start's writes do not slow the next.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import requests

from tests.servers.torchserve import BIN, ROOT, TorchServe

MIB = 1 << 20
POLL_S = 0.05
# TorchServe 0.12's log lines: the archive unpacked between the first two, the worker's load
# answered in the third (milliseconds).
_STAMP = r"^(\S+) \[\w+ *\] \S+ org\.pytorch\.serve\."
UNPACK_BEGINS = re.compile(_STAMP + r"ModelServer - Loading initial models", re.M)
UNPACK_ENDS = re.compile(_STAMP + r"wlm\.ModelManager - Model \S+ loaded\.", re.M)
WORKER_LOAD = re.compile(r"WorkerThread - Backend response time: (\d+)")


@dataclass(frozen=True)
class Variant:
    """One archive to start: its model name (= file stem) and what it is."""

    name: str
    label: str


VARIANTS = (
    Variant("inside", "graph inside the archive"),
    Variant("byref", "by reference, files hashed at start (default)"),
    Variant("byref_nohash", "by reference, --no-verify-checksum"),
)


def build(export: Path, name: str, *options: str) -> None:
    command = [str(ROOT / "build_mar.sh"), "--name", name, "--export-path", str(export)]
    command += ["--fanouts", "10,10", "--device", "cpu", *options]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def build_archives(work: Path, nodes: int, edges: int) -> tuple[Path, Path]:
    """The store (on its "volume") and the model store holding the three archives."""
    store, export, weights = work / "volume" / "graph", work / "model_store", work / "weights"
    started = time.monotonic()
    generate = [sys.executable, "-m", "graph_assets", "synthetic", str(nodes), str(edges)]
    subprocess.run([*generate, "--out", str(store)], check=True, stdout=subprocess.DEVNULL)
    build(export, "byref", "--graph-location", str(store), "--epochs", "1")
    weights.mkdir()
    with zipfile.ZipFile(export / "byref.mar") as archive:
        archive.extract("model.pt", weights)
        archive.extract("model_config.json", weights)
    same = ("--weights", str(weights / "model.pt"))
    build(export, "byref_nohash", "--graph-location", str(store), "--no-verify-checksum", *same)
    build(export, "inside", "--store", str(store), *same)
    print(f"built the graph and 3 archives in {time.monotonic() - started:.0f} s")
    return store, export


def start_to_first_answer(server: TorchServe, name: str, timeout: float = 600.0) -> float:
    """Seconds from ``torchserve --start`` to the first 200 answer of ``name``."""
    for sub in ("tmp", "logs"):
        (server.home / sub).mkdir(parents=True, exist_ok=True)
    config = server.write_config()
    command = [str(BIN / "torchserve"), "--start", "--ts-config", str(config)]
    command += ["--model-store", str(server.model_store), "--models", f"{name}={name}.mar"]
    started = time.monotonic()
    with open(server.home / "logs" / "start.out", "ab") as out:
        subprocess.run(
            command, cwd=server.home, env=server.env(), check=True, stdout=out, stderr=out
        )
    url = f"{server.inference_url}/predictions/{name}"
    session = requests.Session()
    while time.monotonic() - started < timeout:
        try:
            headers = server.auth("inference")
            if session.post(url, json={"node_id": 0}, headers=headers, timeout=5).ok:
                return time.monotonic() - started
        except (OSError, ValueError, KeyError, requests.RequestException):
            pass  # no key file or no listener yet
        time.sleep(POLL_S)
    raise TimeoutError(f"{name}: no answer {timeout} s after start; see {server.home / 'logs'}")


@dataclass
class Starts:
    """What the starts of one archive measured."""

    seconds: list[float] = field(default_factory=list)
    unpack_s: list[float] = field(default_factory=list)
    worker_load_s: list[float] = field(default_factory=list)
    disk_bytes: int = 0


def phases(ts_log: str) -> tuple[float, float]:
    """(archive unpack, worker load) in seconds, read from TorchServe's ts_log.log."""
    begins, ends = UNPACK_BEGINS.search(ts_log), UNPACK_ENDS.search(ts_log)
    load = WORKER_LOAD.search(ts_log)
    if begins is None or ends is None or load is None:
        raise ValueError("TorchServe's log does not have the lines this benchmark reads")
    stamps = [datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S,%f") for m in (begins, ends)]
    return (stamps[1] - stamps[0]).total_seconds(), int(load.group(1)) / 1000


def disk_used(directory: Path) -> int:
    """Bytes allocated under ``directory``, each hard-linked file counted once."""
    seen: set[tuple[int, int]] = set()
    used = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            info = os.lstat(os.path.join(parent, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                used += info.st_blocks * 512
    return used


def measure(work: Path, export: Path, repeats: int, prefork: bool) -> dict[str, Starts]:
    """Every archive started once per round, the rounds one after another; workers forked from
    a zygote (``prefork``) as ``make serve`` and the shipped image run them, or plain."""
    results = {variant.name: Starts() for variant in VARIANTS}
    for round_ in range(repeats):
        for variant in VARIANTS:
            home = work / "servers" / f"{variant.name}-{round_}"
            server = TorchServe(home=home, model_store=export, prefork=prefork)
            os.sync()
            try:
                seconds = start_to_first_answer(server, variant.name)
                used = disk_used(home / "tmp")
            finally:
                server.stop()
            unpack, load = phases((home / "logs" / "ts_log.log").read_text(errors="replace"))
            shutil.rmtree(home, ignore_errors=True)
            starts = results[variant.name]
            starts.seconds.append(seconds)
            starts.unpack_s.append(unpack)
            starts.worker_load_s.append(load)
            starts.disk_bytes = used
            print(
                f"round {round_ + 1}: {variant.name} {seconds:.2f} s (unpack {unpack:.2f} s, "
                f"worker load {load:.2f} s), {used / MIB:.0f} MiB"
            )
    return results


def report(results: dict[str, Starts], export: Path, store: Path) -> None:
    reference = statistics.median(results["inside"].seconds)
    print(
        f"\n{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"store {disk_used(store) / MIB:.0f} MiB on disk, medians of "
        f"{len(results['inside'].seconds)} starts\n"
    )
    print(
        "| archive | start to first answer (min-max) | ratio to inside | archive unpack | "
        "worker load | disk per start | .mar size |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        starts = results[variant.name]
        median = statistics.median(starts.seconds)
        mar = (export / f"{variant.name}.mar").stat().st_size
        print(
            f"| {variant.label} | {median:.2f} s ({min(starts.seconds):.2f}-"
            f"{max(starts.seconds):.2f}) | {median / reference:.2f} | "
            f"{statistics.median(starts.unpack_s):.2f} s | "
            f"{statistics.median(starts.worker_load_s):.2f} s | "
            f"{starts.disk_bytes / MIB:.0f} MiB | {mar / MIB:.1f} MiB |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2_000_000)
    parser.add_argument("--edges", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--plain-workers",
        action="store_true",
        help="start workers plainly instead of forking them from the zygote (prefork/)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gnnserve-start-time-") as tmp:
        work = Path(tmp)
        store, export = build_archives(work, args.nodes, args.edges)
        results = measure(work, export, args.repeats, prefork=not args.plain_workers)
        report(results, export, store)


if __name__ == "__main__":
    main()
