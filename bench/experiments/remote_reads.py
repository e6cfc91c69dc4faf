"""What reading a graph from Redis costs in process: `RemoteStore` reads against the
memory-mapped store, on a 3-primary cluster (3 replicas) and on a single Redis, both on
loopback, in one run.

``python -m bench.experiments.remote_reads`` (``--quick`` for a short run) builds a synthetic
graph (default 100,000 nodes, 1M edges, 128 float32 features), loads it into both, and measures:

1. batched reads: the p50 of ``in_lists`` and ``feature_rows`` of ``B`` random nodes (B = 10,
   100, 1,000) with the cache off (every block from Redis: ``cold``) and with every block
   cached (``warm``), the commands and bytes a cold read sends and receives, and, for contrast,
   the same blocks' in-lists read with one GET per block (the layout-1 way);
2. requests: a sampling request as the sampler makes it (12 seed IDs, in-lists of the seeds,
   10 random in-neighbours each, in-lists of those, then feature rows of every node reached;
   three rounds), its read time p50 cold and against the local store;
3. the cache under Zipf(1.1) node popularity (seeds drawn by rank from a random permutation of
   the nodes) at ``--cache-mb`` (default 256, the default of ``gnn.remote_cache_mb``) and at a
   cache of 1/16 of that: the hit ratio of block fields over the requests after a warm-up, the
   round trips per request, and the p50 read time of a request.

A markdown table goes to stdout, the figures to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from graph_assets import GraphStore, generate_synthetic, open_store
from graph_assets.graph_view import GraphView
from graph_assets.remote import RemoteStore, load_store, open_remote_store
from graph_assets.remote.connect import connect
from graph_assets.remote.layout import ADJ, DEFAULT_BLOCK_SIZE
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import RedisServer

_SINGLE_CONFIG = 'appendonly no\nsave ""\nmaxmemory-policy noeviction\n'
BATCHES = (10, 100, 1000)
SEEDS, FANOUT = 12, 10


def p50_ms(read: Callable[[np.ndarray], object], batches: list[np.ndarray]) -> float:
    """The median time of ``read`` over ``batches``, in ms."""
    times = []
    for batch in batches:
        started = time.perf_counter()
        read(batch)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def request_reads(view: GraphView, seeds: np.ndarray, rng: np.random.Generator) -> None:
    """The reads of one [10, 10] sampling request: two hops of in-lists, then features."""
    frontier, reached = seeds, [seeds]
    for _ in range(2):
        lists = view.in_lists(frontier)
        counts = np.diff(lists.indptr)
        picks = [
            lists.indices[lists.indptr[i] + rng.choice(c, min(c, FANOUT), replace=False)]
            for i, c in enumerate(counts.tolist())
            if c
        ]
        frontier = np.unique(np.concatenate(picks)) if picks else frontier[:0]
        reached.append(frontier)
    view.feature_rows(np.unique(np.concatenate(reached)))


def batched(url: str, prefix: str, store: GraphStore, repeats: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    cold = open_remote_store(url, prefix, store.checksum, cache_mb=0, timeout_ms=5000)
    warm = open_remote_store(url, prefix, store.checksum, cache_mb=4096, timeout_ms=5000)
    rows = []
    for size in BATCHES:
        batches = [rng.choice(store.num_nodes, size, replace=False) for _ in range(repeats)]
        for read in ("in_lists", "feature_rows"):
            before = cold.counters
            cold_ms = p50_ms(getattr(cold, read), batches)
            after = cold.counters
            for nodes in batches:
                getattr(warm, read)(nodes)
            warm_ms = p50_ms(getattr(warm, read), batches)
            local_ms = p50_ms(getattr(store, read), batches)
            rows.append(
                {
                    "batch": size,
                    "read": read,
                    "cold_ms": cold_ms,
                    "warm_ms": warm_ms,
                    "local_ms": local_ms,
                    "commands": (after.commands - before.commands) / repeats,
                    "kib": (after.bytes_read - before.bytes_read) / repeats / 1024,
                }
            )
        for name, fetch in (("MGET per group", mget_per_group), ("GET per block", get_per_block)):
            values_ms = p50_ms(partial(fetch, cold), batches)
            rows.append({"batch": size, "read": f"in-list values, {name}", "cold_ms": values_ms})
    cold.close()
    warm.close()
    return rows


def get_per_block(view: RemoteStore, nodes: np.ndarray) -> list[Any]:
    """The in-list values of ``nodes``' blocks, one GET each in one pipelined round (layout 1)."""
    pipe = view.client.pipeline(transaction=False)
    for block in np.unique(nodes // view.layout.block_size).tolist():
        pipe.get(view.keys.block(block, ADJ))
    return pipe.execute()


def mget_per_group(view: RemoteStore, nodes: np.ndarray) -> list[Any]:
    """The same values as the reader fetches them (no decoding, checks nor cache)."""
    blocks = np.unique(nodes // view.layout.block_size).tolist()
    return view.block_values([(block, ADJ) for block in blocks])


def requests(
    url: str, prefix: str, store: GraphStore, count: int, cache_mb: float
) -> dict[str, Any]:
    """Zipf(1.1) requests through a cache of ``cache_mb``, empty at first: the second half
    measured (and the hit ratio of them all)."""
    rng = np.random.default_rng(2)
    ranked = rng.permutation(store.num_nodes)
    draws = np.minimum(rng.zipf(1.1, size=(count, SEEDS)), store.num_nodes) - 1
    view = open_remote_store(url, prefix, store.checksum, cache_mb=cache_mb, timeout_ms=5000)
    times = []
    for i, ranks in enumerate(draws):
        if i == count // 2:
            before = view.counters
        started = time.perf_counter()
        request_reads(view, ranked[ranks], rng)
        times.append(time.perf_counter() - started)
    after = view.counters
    hits, misses = after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses
    measured = count - count // 2
    view.close()
    return {
        "cache_mb": cache_mb,
        "hit_ratio": hits / max(1, hits + misses),
        "hit_ratio_from_cold": after.cache_hits / max(1, after.cache_hits + after.cache_misses),
        "round_trips_per_request": (after.round_trips - before.round_trips) / measured,
        "p50_ms": 1000 * statistics.median(times[count // 2 :]),
    }


def request_cold(url: str, prefix: str, store: GraphStore, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    seeds = [rng.choice(store.num_nodes, SEEDS, replace=False) for _ in range(repeats)]
    view = open_remote_store(url, prefix, store.checksum, cache_mb=0, timeout_ms=5000)
    before = view.counters
    remote_ms = p50_ms(partial(request_reads, view, rng=rng), seeds)
    after = view.counters
    local_ms = p50_ms(partial(request_reads, store, rng=rng), seeds)
    view.close()
    return {
        "remote_cold_ms": remote_ms,
        "local_ms": local_ms,
        "round_trips": (after.round_trips - before.round_trips) / repeats,
        "commands": (after.commands - before.commands) / repeats,
        "kib": (after.bytes_read - before.bytes_read) / repeats / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000, help="graph nodes (100,000)")
    parser.add_argument("--edges", type=int, default=1_000_000, help="graph edges (1M)")
    parser.add_argument("--features", type=int, default=128, help="float32 features (128)")
    parser.add_argument(
        "--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="load-redis --block-size"
    )
    parser.add_argument("--cache-mb", type=float, default=256, help="cache of part 3 (256)")
    parser.add_argument("--repeats", type=int, default=50, help="reads per p50 (50)")
    parser.add_argument("--requests", type=int, default=4000, help="Zipf requests (4000)")
    parser.add_argument("--quick", action="store_true", help="a small, short run")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.edges, args.repeats, args.requests = 20_000, 200_000, 10, 400
    results: dict[str, Any] = {"machine": f"{platform.processor()} {platform.platform()}"}
    with tempfile.TemporaryDirectory(prefix="remote-reads-") as tmp:
        home = Path(tmp)
        generate_synthetic(args.nodes, args.edges, home / "store", args.features, seed=0)
        store = open_store(home / "store")
        config = home / "single.conf"
        config.write_text(_SINGLE_CONFIG)
        cluster = LocalCluster(home / "cluster")
        single = RedisServer(home / "single", config=config)
        try:
            cluster.start()
            single.start()
            for name, url in (("cluster", cluster.url), ("single", single.url)):
                client = connect(url, 60_000)
                started = time.perf_counter()
                report = load_store(store, client, "g", shown_url=url, block_size=args.block_size)
                client.close()
                load = {"rows_per_s": report.rows / (time.perf_counter() - started)}
                results[name] = {
                    "load": load,
                    "batched": batched(url, "g", store, args.repeats),
                    "request_cold": request_cold(url, "g", store, args.repeats),
                    "zipf": [
                        requests(url, "g", store, args.requests, mb)
                        for mb in (args.cache_mb, args.cache_mb / 16)
                    ],
                }
        finally:
            single.stop()
            cluster.stop()
    print_tables(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def print_tables(results: dict[str, Any]) -> None:
    for name in ("cluster", "single"):
        figures = results[name]
        print(f"\n{name}: load {figures['load']['rows_per_s']:,.0f} rows/s\n")
        print("| batch | read | cold p50 ms | warm p50 ms | local p50 ms | commands | KiB |")
        print("|---|---|---|---|---|---|---|")
        for row in figures["batched"]:
            cells = [f"{row[k]:.2f}" if k in row else "" for k in ("cold_ms", "warm_ms")]
            cells += [f"{row[k]:.2f}" if k in row else "" for k in ("local_ms",)]
            cells += [f"{row[k]:.0f}" if k in row else "" for k in ("commands", "kib")]
            print(f"| {row['batch']} | {row['read']} | " + " | ".join(cells) + " |")
        cold = figures["request_cold"]
        print(
            f"\nrequest ({SEEDS} seeds, [{FANOUT},{FANOUT}]) cold: {cold['remote_cold_ms']:.2f} "
            f"ms p50 (local {cold['local_ms']:.2f} ms), {cold['round_trips']:.0f} round trips, "
            f"{cold['commands']:.0f} commands, {cold['kib']:.0f} KiB"
        )
        for zipf in figures["zipf"]:
            print(
                f"Zipf(1.1) cache {zipf['cache_mb']:g} MB: hit ratio {zipf['hit_ratio']:.3f} "
                f"(from an empty cache {zipf['hit_ratio_from_cold']:.3f}), "
                f"{zipf['round_trips_per_request']:.2f} round trips/request, p50 "
                f"{zipf['p50_ms']:.2f} ms"
            )


if __name__ == "__main__":
    main()
