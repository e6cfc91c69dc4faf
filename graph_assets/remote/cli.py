"""``python -m graph_assets load-redis``: copy a store into a Redis Cluster or a single Redis."""

from __future__ import annotations

import argparse
from pathlib import Path

from redis.cluster import RedisCluster

from graph_assets.live.redis_log import shown_url
from graph_assets.remote.connect import PASSWORD_FILE_VARIABLE, connect
from graph_assets.remote.layout import DEFAULT_BLOCK_SIZE, check_prefix
from graph_assets.remote.loader import LoadReport, load_store
from graph_assets.stored.store import open_store

DEFAULT_PREFIX = "graph"
DEFAULT_TIMEOUT_MS = 10_000  # per command while loading: a chunk is a few MB


def add_load_redis(commands: argparse._SubParsersAction) -> None:
    """Adds the ``load-redis`` subcommand to the CLI's ``commands``."""
    load = commands.add_parser(
        "load-redis",
        help="copy a store into a Redis Cluster or a single Redis (docs/redis-cluster.md)",
    )
    load.add_argument("--store", type=Path, required=True, metavar="DIR", help="store to copy")
    load.add_argument(
        "--url",
        required=True,
        metavar="URL",
        help="redis://host:port or rediss://host:port (TLS) of any node of the cluster, or of "
        f"the single Redis; the password is read from the file {PASSWORD_FILE_VARIABLE} names",
    )
    load.add_argument(
        "--prefix",
        type=prefix_argument,
        default=DEFAULT_PREFIX,
        metavar="NAME",
        help=f"the graph's name in Redis: its keys start with it (default {DEFAULT_PREFIX})",
    )
    load.add_argument(
        "--block-size",
        type=_positive,
        default=DEFAULT_BLOCK_SIZE,
        metavar="N",
        help="nodes per block, the unit a read fetches and the cache keeps: smaller blocks read "
        "fewer unwanted rows of wide features, larger ones cost less memory per node "
        f"(default {DEFAULT_BLOCK_SIZE}; a resumed load must use the first load's)",
    )
    load.add_argument(
        "--timeout-ms",
        type=_positive,
        default=DEFAULT_TIMEOUT_MS,
        metavar="MS",
        help=f"how long one Redis command may take (default {DEFAULT_TIMEOUT_MS})",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def prefix_argument(text: str) -> str:
    """An argparse type: a prefix ``check_prefix`` accepts."""
    try:
        return check_prefix(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def load_redis(args: argparse.Namespace) -> str:
    """Runs ``load-redis``; returns the report to print."""
    return load_into_redis(args.store, args.url, args.prefix, args.block_size, args.timeout_ms)


def load_into_redis(
    store_dir: Path,
    url: str,
    prefix: str,
    block_size: int = DEFAULT_BLOCK_SIZE,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> str:
    """Loads the store at ``store_dir`` under ``prefix`` at ``url`` (continuing or verifying
    an earlier load, as ``load-redis`` does: ``python -m graph_assets.compact --redis-url``
    runs it on the store it writes); returns the report to print."""
    store = open_store(store_dir)
    shown = shown_url(url)
    client = connect(url, timeout_ms)
    try:
        report = load_store(store, client, prefix, shown_url=shown, block_size=block_size)
        where = (
            f"a cluster of {len(client.get_primaries())} primaries"
            if isinstance(client, RedisCluster)
            else "a single Redis"
        )
    finally:
        client.close()
    head = f"store {store_dir} -> {shown} ({where}), prefix {prefix}"
    return f"{head}\n{_described(report)}\n  checksum {store.checksum}"


def _described(report: LoadReport) -> str:
    if report.verified:
        repaired = (
            f"{len(report.repaired)} differed ({', '.join(report.repaired[:5])}) and were "
            "written again"
            if report.repaired
            else "all match"
        )
        return (
            f"  already loaded: verified {report.verified} chunks against their recorded "
            f"sha256: {repaired}"
        )
    rate = report.rows / report.seconds if report.seconds else 0.0
    lines = [
        f"  wrote {report.written} of {report.chunks} chunks ({report.already} were already "
        f"there): {report.rows} rows, {report.bytes / 2**20:.1f} MiB, {rate:,.0f} rows/s"
    ]
    if not report.complete:
        left = report.chunks - report.already - report.written
        lines.append(f"  {left} chunks remain: run the same command again to continue")
    return "\n".join(lines)
