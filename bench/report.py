"""Turns a suite result file into docs/benchmarks.md's tables and the PNG plots under docs/img/.

    python -m bench.report docs/bench-results/results-quick.json

The tables replace what stands between ``<!-- results:PROFILE:begin -->`` and
``<!-- results:PROFILE:end -->`` in docs/benchmarks.md (PROFILE is ``quick`` or ``full``); the
prose around them is written by hand and left alone. Plots are ``docs/img/bench-PROFILE-*.png``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from statistics import median
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.artifacts import GRAPHS, ROOT

Row = dict[str, Any]


def _find(rows: Iterable[Row], **match: Any) -> list[Row]:
    """Rows whose fields equal ``match``; a missing ``compiled`` field means not compiled."""
    return [
        r
        for r in rows
        if all((r.get(k, False) if k == "compiled" else r.get(k)) == v for k, v in match.items())
    ]


def _one(rows: Iterable[Row], **match: Any) -> Row | None:
    found = _find(rows, **match)
    return found[0] if found else None


def _label(row: Row) -> str:
    if row["system"] == "gnnserve":
        fanouts = ",".join(str(f) for f in row["fanouts"])
        threads = row.get("threads", 1)
        suffix = "" if threads == 1 else f", {threads or 'default'} threads"
        suffix += ", compiled" if row.get("compiled") else ""
        suffix += _run_suffix(row)
        return f"gnnserve [{fanouts}] batch {row['batch']}/{row['delay']} ms{suffix}"
    if row["system"] == "echo":
        return f"echo (floor) batch {row['batch']}/{row['delay']} ms{_run_suffix(row)}"
    threads = row.get("threads", 0)
    return row["system"] + (f", {threads} thread" if threads else "")


def _cpu_per_request(row: Row) -> str:
    if "worker_cpu_ms_per_request" not in row:
        return ""
    return f"{row['worker_cpu_ms_per_request']:.3f} / {row['frontend_cpu_ms_per_request']:.3f}"


def _steal(row: Row) -> str:
    """The hypervisor's steal during the row's measurement (not recorded before 2026-12-03)."""
    return f"{row['steal_pct']:.1f}" if "steal_pct" in row else ""


def _run_suffix(row: Row) -> str:
    """Where the row's level differs from the sweep: more workers, or one of the floor pairs."""
    workers = row.get("workers", 1)
    suffix = "" if workers == 1 else f", {workers} workers"
    return suffix + (f", pair {row['pair'] + 1}" if "pair" in row else "")


def targets(results: Row) -> list[tuple[str, str, str, str]]:
    """(figure, target, measured, verdict) for the issue's targets table."""
    closed = [r for r in results["load"] if r["mode"] == "closed" and "experiment" not in r]
    load = [r for r in closed if r.get("workers", 1) == 1]
    per_core = [r for r in closed if r.get("workers", 1) > 1]
    sizes = [r for r in results["load"] if r.get("experiment") == "sizes"]
    out: list[tuple[str, str, str, str]] = []

    def add(figure: str, goal: str, value: float | None, ok: Callable[[float], bool]) -> None:
        if value is None:
            out.append((figure, goal, "not measured", "-"))
        else:
            out.append((figure, goal, f"{value:.2f}", "met" if ok(value) else "missed"))

    served = {"system": "gnnserve", "graph": "1M", "batch": 16, "threads": 1, "compiled": False}
    ours = _one(load, **served, delay=5, concurrency=32)
    echo = _one(load, system="echo", concurrency=32)
    swept = ours["throughput"] / echo["throughput"] if ours and echo else None
    pairs = floor_pair_ratios(results)
    figure = "throughput / echo floor, 1M, [10,10], 32 conns, 16/5 ms"
    if pairs:
        add(
            f"{figure}, median of {len(pairs)} back-to-back pairs",
            ">= 0.6",
            median(pairs),
            lambda v: v >= 0.6,
        )
        listed = ", ".join(f"{p:.2f}" for p in pairs)
        out.append(("(the pairs' ratios, in order)", "info", listed, ""))
        if swept is not None:
            out.append(
                ("(same from the sweep, all of echo's levels first)", "info", f"{swept:.2f}", "")
            )
    else:
        add(figure, ">= 0.6", swept, lambda v: v >= 0.6)
    ours = _one(per_core, **served, delay=5, concurrency=32)
    echo = _one(per_core, system="echo", concurrency=32)
    ratio = ours["throughput"] / echo["throughput"] if ours and echo else None
    workers = ours["workers"] if ours else "n"
    add(f"same, {workers} workers each (one per core)", ">= 0.6", ratio, lambda v: v >= 0.6)

    big = _one(sizes, graph="10M", fanouts=[10, 10], batch=16, concurrency=1)
    small = _one(sizes, graph="100K", fanouts=[10, 10], batch=16, concurrency=1)
    ratio = big["p50_ms"] / small["p50_ms"] if big and small else None
    add("p50 at 1 conn, 10M / 100K edges (batch 16/5 ms)", "<= 1.3", ratio, lambda v: v <= 1.3)
    big = _one(sizes, graph="10M", fanouts=[10, 10], batch=1, concurrency=1)
    small = _one(sizes, graph="100K", fanouts=[10, 10], batch=1, concurrency=1)
    ratio = big["p50_ms"] / small["p50_ms"] if big and small else None
    add("same, batch 1 (no batching delay)", "<= 1.3", ratio, lambda v: v <= 1.3)

    ours_peak = max((r["throughput"] for r in _find(load, **served)), default=None)
    seed_peak = max(
        (r["throughput"] for r in _find(load, system="fastapi-whole", graph="1M")), default=None
    )
    ratio = ours_peak / seed_peak if ours_peak and seed_peak else None
    add("peak throughput / seed design's peak, 1M edges", ">= 500", ratio, lambda v: v >= 500)

    memory = memory_by_mode(results)
    forked, plain = memory.get("prefork", {}), memory.get("plain", {})
    ratio = pss_ratio(forked)
    add(
        "total PSS 4 workers / 1 worker, 1.13 GB features (pre-forked workers, the default)",
        "<= 1.3",
        ratio,
        lambda v: v <= 1.3,
    )
    plain_ratio = pss_ratio(plain)
    if plain_ratio is not None:
        private = plain[4]["loaded"]["pss_anon"] / 4
        out.append(
            (
                "(same with plain workers: one fresh interpreter each)",
                "info",
                f"{plain_ratio:.2f}",
                f"anon {private:.0f} MiB per worker",
            )
        )

    micro = _one(
        results["micro"], graph="10M", fanouts=[10, 10], threads=1, batch_size=32, device="cpu"
    )
    add(
        "in-process 32 seeds [10,10], sample+gather+forward, 10M edges, ms (1 thread)",
        "<= 3",
        micro["sample_gather_forward"] if micro else None,
        lambda v: v <= 3,
    )
    return out


def floor_pair_ratios(results: Row) -> list[float]:
    """Ours / echo throughput of each back-to-back pair (``Suite._floor_pairs``), in order;
    empty for result files written before the suite measured pairs."""
    rows = [r for r in results["load"] if r.get("experiment") == "floor_pairs"]
    ratios = []
    for pair in sorted({r["pair"] for r in rows}):
        echo = _one(rows, system="echo", pair=pair)
        ours = _one(rows, system="gnnserve", pair=pair)
        if echo and ours and echo["throughput"]:
            ratios.append(ours["throughput"] / echo["throughput"])
    return ratios


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def tables(results: Row) -> str:
    m = results["machine"]
    load_average = tuple(round(x, 2) for x in m["load_average_at_start"])
    parts = [
        f"Profile `{results['profile']}`, measured {m['date']} on {m['cores']} cores "
        f"({m['cpu']}), {m['memory_gib']} GiB, kernel {m['kernel']}, Python {m['python']}, "
        f"torch {m['torch']}; load average at start {load_average}; "
        f"the run took {results.get('seconds', '?')} s"
        + (
            f", {results['steal_pct']}% of its CPU time stolen by the hypervisor."
            if "steal_pct" in results
            else "."
        ),
        "### Targets",
        _table(["figure", "target", "measured", ""], [list(t) for t in targets(results)]),
        "### Throughput and latency per concurrency (closed loop; open loop where a rate is given)",
        _table(
            [
                "system",
                "graph",
                "conns",
                "rate",
                "req/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "errors",
                "client CPU s",
                "worker / frontend CPU ms per request",
                "host steal %",
            ],
            [
                [
                    _label(r),
                    r["graph"],
                    r["concurrency"],
                    f"{r['offered_rate']:.0f}/s open" if r["offered_rate"] else "closed",
                    f"{r['throughput']:.1f}",
                    _ms(r["p50_ms"]),
                    _ms(r["p95_ms"]),
                    _ms(r["p99_ms"]),
                    r["errors"],
                    f"{r['client_cpu_s']:.1f}",
                    _cpu_per_request(r),
                    _steal(r),
                ]
                for r in results["load"]
                if r.get("experiment") != "sizes"
            ],
        ),
        "### Latency per graph size and fanouts (gnnserve)",
        _table(
            ["graph", "nodes", "fanouts", "batch", "conns", "req/s", "p50 ms", "p99 ms", "errors"],
            [
                [
                    r["graph"],
                    f"{GRAPHS[r['graph']].nodes:,}",
                    r["fanouts"],
                    f"{r['batch']}/{r['delay']} ms",
                    r["concurrency"],
                    f"{r['throughput']:.1f}",
                    _ms(r["p50_ms"]),
                    _ms(r["p99_ms"]),
                    r["errors"],
                ]
                for r in results["load"]
                if r.get("experiment") == "sizes"
            ],
        ),
        "### Worker memory (total PSS of all worker processes, MiB; graph with 1.13 GB of "
        "features; pre-forked: launchers + zygote + forked workers)",
        _table(
            [
                "workers",
                "mode",
                "processes",
                "PSS idle",
                "PSS after load",
                "of which anon",
                "of which file",
                "RSS sum",
                "warm requests",
            ],
            [
                [
                    r["workers"],
                    r.get("mode", "plain"),
                    r["loaded"]["processes"],
                    f"{r['idle']['pss']:.0f}",
                    f"{r['loaded']['pss']:.0f}",
                    f"{r['loaded']['pss_anon']:.0f}",
                    f"{r['loaded']['pss_file']:.0f}",
                    f"{r['loaded']['rss']:.0f}",
                    f"{r['warm_requests']} ({r['warm_errors']} errors)",
                ]
                for r in results["memory"]
            ],
        ),
        "### Handler stages in process (median ms per batch of single-node requests)",
        _table(
            [
                "graph",
                "fanouts",
                "threads",
                "batch",
                "parse",
                "sample",
                "gather",
                "forward",
                "format",
                "s+g+f",
                "s+g+f p90",
                "sampled nodes",
                "host steal %",
            ],
            [
                [
                    r["graph"],
                    r["fanouts"],
                    r["threads"],
                    r["batch_size"],
                    *(f"{r[k]:.3f}" for k in ("parse", "sample", "gather", "forward", "format")),
                    f"{r['sample_gather_forward']:.3f}",
                    f"{r['sample_gather_forward_p90']:.3f}",
                    f"{r['sampled_nodes']:.0f}",
                    _steal(r),
                ]
                for r in results["micro"]
            ],
        ),
    ]
    return "\n\n".join(parts)


def plots(results: Row, directory: Path) -> list[Path]:
    """Throughput vs concurrency, latency CDF, latency vs graph size, memory vs workers."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = f"bench-{results['profile']}-"
    load = results["load"]
    closed = [r for r in load if r["mode"] == "closed" and "experiment" not in r]
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(_label(r) + f" ({r['graph']})" for r in closed):
        rows = [r for r in closed if _label(r) + f" ({r['graph']})" == label]
        ax.plot(
            [r["concurrency"] for r in rows], [r["throughput"] for r in rows], "o-", label=label
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="connections (closed loop)",
        ylabel="requests/s",
        title="Throughput vs concurrency",
    )
    ax.set_xticks(list({r["concurrency"] for r in closed}), labels=None)
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    written.append(_save(fig, directory / f"{prefix}throughput-vs-concurrency.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    chosen = [r for r in load if r["mode"] == "open"]
    chosen += [
        r
        for r in closed
        if r["concurrency"] == 1
        and r.get("batch") in (None, 16, 1)
        and r.get("threads", 1) == 1
        and not r.get("compiled")
    ]
    for r in chosen:
        kind = f"open {r['offered_rate']:.0f}/s" if r["mode"] == "open" else "1 conn"
        percent = [p / 2 for p in range(len(r["cdf_ms"]))]
        ax.plot(r["cdf_ms"], percent, label=f"{_label(r)} ({r['graph']}), {kind}")
    ax.set(
        xscale="log",
        xlabel="latency, ms",
        ylabel="percent of requests at or below",
        title="Latency CDF",
    )
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    written.append(_save(fig, directory / f"{prefix}latency-cdf.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[Row]] = {}
    for r in load:
        if (
            r["concurrency"] == 1
            and r["mode"] == "closed"
            and (r.get("experiment") == "sizes" or r["system"].startswith("fastapi"))
        ):
            series.setdefault(_label(r), []).append(r)
    for label, rows in series.items():
        rows.sort(key=lambda r: GRAPHS[r["graph"]].edges)
        edges = [GRAPHS[r["graph"]].edges for r in rows]
        line = ax.plot(edges, [r["p50_ms"] for r in rows], "o-", label=f"{label} p50")[0]
        ax.plot(edges, [r["p99_ms"] for r in rows], "x--", color=line.get_color(), alpha=0.6)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="graph edges (nodes = edges / 10)",
        ylabel="latency at 1 connection, ms (solid p50, dashed p99)",
        title="Latency vs graph size",
    )
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    written.append(_save(fig, directory / f"{prefix}latency-vs-graph-size.png"))

    memory = memory_by_mode(results)
    if memory.get("prefork"):
        fig, ax = plt.subplots(figsize=(6, 4))
        mem = sorted(memory["prefork"].values(), key=lambda r: r["workers"])
        workers = [r["workers"] for r in mem]
        anon = [r["loaded"]["pss_anon"] for r in mem]
        file = [r["loaded"]["pss_file"] for r in mem]
        ax.bar(workers, anon, label="pre-forked: PSS anon (interpreters, model, overlay)")
        ax.bar(
            workers, file, bottom=anon, label="pre-forked: PSS file-backed (graph map, libraries)"
        )
        if memory.get("plain"):
            plain = sorted(memory["plain"].values(), key=lambda r: r["workers"])
            ax.plot(
                [r["workers"] for r in plain],
                [r["loaded"]["pss"] for r in plain],
                "r-s",
                label="plain workers (one fresh interpreter each): total PSS",
            )
        features = mem[0]["feature_bytes"] / 2**20
        copied = [
            r["loaded"]["pss_anon"] + r["loaded"]["pss_file"] + features * (r["workers"] - 1)
            for r in mem
        ]
        ax.plot(workers, copied, "k--o", label="pre-forked, if every worker copied the features")
        ax.set(
            xlabel="workers",
            ylabel="total PSS of all workers, MiB",
            xticks=workers,
            title="Worker memory vs workers",
        )
        ax.legend(fontsize=7)
        written.append(_save(fig, directory / f"{prefix}memory-vs-workers.png"))

    micro = [r for r in results["micro"] if r["threads"] == 1 and r["fanouts"] == [10, 10]]
    if micro:
        graph = max({r["graph"] for r in micro}, key=lambda g: GRAPHS[g].edges)
        rows = [r for r in micro if r["graph"] == graph]
        fig, ax = plt.subplots(figsize=(6, 4))
        bottom = [0.0] * len(rows)
        for stage in ("parse", "sample", "gather", "forward", "format"):
            values = [r[stage] for r in rows]
            ax.bar([str(r["batch_size"]) for r in rows], values, bottom=bottom, label=stage)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set(
            xlabel="requests (seeds) per batch",
            ylabel="median ms per batch",
            title=f"Handler stages, {graph} edges, [10,10], 1 thread",
        )
        ax.legend(fontsize=8)
        written.append(_save(fig, directory / f"{prefix}stages.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def update_doc(doc: Path, profile: str, body: str) -> None:
    begin, end = f"<!-- results:{profile}:begin -->", f"<!-- results:{profile}:end -->"
    text = doc.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{doc} has no {begin} ... {end} block to fill")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def memory_by_mode(results: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """Memory rows by worker mode and worker count (rows from before pre-forking are plain)."""
    by_mode: dict[str, dict[int, dict[str, Any]]] = {}
    for row in results["memory"]:
        by_mode.setdefault(row.get("mode", "plain"), {})[row["workers"]] = row
    return by_mode


def pss_ratio(rows: dict[int, dict[str, Any]]) -> float | None:
    """Total PSS with 4 workers over that with 1, after load."""
    if 1 not in rows or 4 not in rows:
        return None
    return float(rows[4]["loaded"]["pss"] / rows[1]["loaded"]["pss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, help="results-<profile>.json from bench.suite")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    for path in plots(results, args.img):
        print(f"wrote {path}")
    update_doc(args.doc, results["profile"], tables(results))
    print(f"updated {args.doc}")
    for figure, goal, value, verdict in targets(results):
        print(f"{figure}: {value} (target {goal}) {verdict}")


if __name__ == "__main__":
    main()
