"""Turns a suite result file into docs/benchmarks.md's tables and the PNG plots under docs/img/.

    python -m bench.report.benchmarks docs/bench-results/results-quick.json

The tables replace what stands between ``<!-- results:PROFILE:begin -->`` and
``<!-- results:PROFILE:end -->`` in docs/benchmarks.md (PROFILE is ``quick`` or ``full``); the
prose around them is written by hand and left alone. The tables are a summary (the targets; for
the full profile also the main configuration, the open loop, our batching settings, graph sizes
and memory); every level the suite measured stays in the result file. Plots, one message each:
``docs/img/bench-PROFILE-{throughput-vs-concurrency,latency-p50-p99,latency-vs-graph-size,
memory-vs-workers,stages}.png``.
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
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from bench.harness.artifacts import GRAPHS, ROOT

Row = dict[str, Any]

#: How each profile is run (the Makefile's targets).
COMMANDS = {
    "quick": "make bench",
    "full": "make bench-full",
}

#: The main configuration: every system answers one-node requests on the 1M-edge graph with one
#: worker; ours and the echo floor batch 16 requests or 5 ms.
MAIN_GRAPH = "1M"
MAIN_BATCH = (16, 5)

#: The systems of the main comparison, in table and legend order: (key, label, colour, style).
#: Colours are the Okabe-Ito palette (distinct for colour-blind readers and in grey scale).
SYSTEMS = (
    ("gnnserve", "gnnserve (ours)", "#0072B2", "o-"),
    ("echo", "echo floor (TorchServe, no model)", "#555555", "s--"),
    ("fastapi-khop", "FastAPI + k_hop_subgraph", "#E69F00", "^-"),
    ("fastapi-whole", "FastAPI, whole-graph forward", "#D55E00", "v-"),
)
_STYLE = {key: (label, colour, style) for key, label, colour, style in SYSTEMS}
_STAGES = (
    ("parse", "#56B4E9"),
    ("sample", "#0072B2"),
    ("gather", "#009E73"),
    ("forward", "#E69F00"),
    ("format", "#CC79A7"),
)


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


def _sweep(results: Row) -> list[Row]:
    """The closed-loop levels of the main sweep: one worker, no pairs, no size experiment."""
    return [
        r
        for r in results["load"]
        if r["mode"] == "closed" and "experiment" not in r and r.get("workers", 1) == 1
    ]


def main_rows(results: Row, system: str) -> list[Row]:
    """A system's closed-loop levels at the main configuration, by concurrency.

    Ours: batch 16 / 5 ms, one intra-op thread, not compiled. The FastAPI baselines: torch's
    default threads, as the seed articles run them."""
    rows = _find(_sweep(results), system=system, graph=MAIN_GRAPH)
    if system == "gnnserve":
        batch, delay = MAIN_BATCH
        rows = _find(rows, batch=batch, delay=delay, threads=1, compiled=False)
    elif system == "echo":
        rows = _find(rows, batch=MAIN_BATCH[0], delay=MAIN_BATCH[1])
    else:
        rows = [r for r in rows if not r.get("threads")]
    return sorted(rows, key=lambda r: r["concurrency"])


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
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _p50_p99(row: Row | None) -> str:
    return f"{_ms(row['p50_ms'])} / {_ms(row['p99_ms'])}" if row else "-"


def _mib(value: float) -> str:
    return f"{value:,.0f}"


def machine_line(results: Row) -> str:
    """When, with which command, on what: the block's first paragraph."""
    m = results["machine"]
    profile = results["profile"]
    command = COMMANDS.get(profile, f"python -m bench.experiments.suite --profile {profile}")
    load = ", ".join(f"{x:.2f}" for x in m["load_average_at_start"])
    steal = (
        f"; the hypervisor stole {results['steal_pct']}% of the run's CPU time"
        if "steal_pct" in results
        else ""
    )
    return (
        f"Profile `{profile}`: `{command}`, measured {m['date']} "
        f"(the run took {results.get('seconds', '?')} s). Machine: {m['cores']} cores "
        f"({m['cpu']}), {m['memory_gib']} GiB, kernel {m['kernel']}, Python {m['python']}, "
        f"torch {m['torch']}; load average at start {load}{steal}. "
        f"Every level: `docs/bench-results/results-{profile}.json`."
    )


def _main_table(results: Row) -> str:
    """Per concurrency: req/s and p50 / p99 of each system at the main configuration."""
    by_system = {key: {r["concurrency"]: r for r in main_rows(results, key)} for key, *_ in SYSTEMS}
    levels = sorted({c for rows in by_system.values() for c in rows})
    header = ["conns"]
    for key, *_ in SYSTEMS:
        header += [f"{key} req/s", "p50 / p99 ms"]
    body = []
    for level in levels:
        cells: list[Any] = [level]
        for key, *_ in SYSTEMS:
            row = by_system[key].get(level)
            cells += [_rate(row["throughput"]) if row else "-", _p50_p99(row)]
        body.append(cells)
    return _table(header, body)


def _open_loop_table(results: Row) -> str:
    rows = [r for r in results["load"] if r["mode"] == "open"]
    return _table(
        ["system", "offered", "p50 ms", "p99 ms", "errors"],
        [
            [
                r["system"],
                f"{r['offered_rate']:,.0f}/s",
                _ms(r["p50_ms"]),
                _ms(r["p99_ms"]),
                r["errors"],
            ]
            for r in rows
        ],
    )


def _settings_table(results: Row) -> str:
    """Ours at every batching and thread setting the profile measured: the latency a lone
    request pays, and throughput and tail at 32 and 128 connections."""
    rows = _find(_sweep(results), system="gnnserve", graph=MAIN_GRAPH)
    settings: dict[tuple[int, int, int, bool], dict[int, Row]] = {}
    for r in rows:
        key = (r["batch"], r["delay"], r.get("threads", 1), bool(r.get("compiled")))
        settings.setdefault(key, {})[r["concurrency"]] = r
    body = []
    for (batch, delay, threads, compiled), by_level in settings.items():
        name = f"{batch} / {delay} ms"
        name += "" if threads == 1 else f", {threads or 'default'} threads"
        name += ", compiled" if compiled else ""
        one, mid, high = (by_level.get(c) for c in (1, 32, 128))
        body.append(
            [
                name,
                _ms(one["p50_ms"]) if one else "-",
                _rate(mid["throughput"]) if mid else "-",
                _ms(mid["p99_ms"]) if mid else "-",
                _rate(high["throughput"]) if high else "-",
            ]
        )
    return _table(
        ["batch / delay", "p50 ms, 1 conn", "req/s, 32 conns", "p99 ms, 32", "req/s, 128"],
        body,
    )


def _sizes_table(results: Row) -> str:
    """p50 / p99 at one connection per graph size: ours (two fanouts, two batch settings) and
    the baselines."""
    sizes = [
        r
        for r in results["load"]
        if r.get("experiment") == "sizes" and r["concurrency"] == 1 and r["mode"] == "closed"
    ]
    baselines = [r for r in _sweep(results) if r["concurrency"] == 1 and not r.get("threads")]
    graphs = sorted(
        {r["graph"] for r in sizes} | {r["graph"] for r in baselines if r["system"] != "echo"},
        key=lambda g: GRAPHS[g].edges,
    )
    columns: list[tuple[str, Callable[[str], Row | None]]] = [
        ("ours, 16 / 5 ms", lambda g: _one(sizes, graph=g, fanouts=[10, 10], batch=16)),
        ("ours, batch 1", lambda g: _one(sizes, graph=g, fanouts=[10, 10], batch=1)),
        ("fastapi-khop", lambda g: _one(baselines, graph=g, system="fastapi-khop")),
        ("fastapi-whole", lambda g: _one(baselines, graph=g, system="fastapi-whole")),
    ]
    return _table(
        ["edges (nodes)", *(name for name, _ in columns)],
        [
            [
                f"{GRAPHS[g].edges:,} ({GRAPHS[g].nodes:,})",
                *(_p50_p99(pick(g)) for _, pick in columns),
            ]
            for g in graphs
        ],
    )


def _memory_table(results: Row) -> str:
    memory = memory_by_mode(results)
    counts = sorted({w for rows in memory.values() for w in rows})
    modes = [m for m in ("prefork", "plain") if m in memory]

    def cell(mode: str, workers: int) -> str:
        row = memory[mode].get(workers)
        if not row:
            return "-"
        loaded = row["loaded"]
        return f"{_mib(loaded['pss'])} ({_mib(loaded['pss_anon'])} + {_mib(loaded['pss_file'])})"

    names = {"prefork": "pre-forked (default)", "plain": "plain workers"}
    return _table(
        ["workers", *(names[m] for m in modes)],
        [[w, *(cell(m, w) for m in modes)] for w in counts],
    )


def _stage_rows(results: Row) -> tuple[str, list[Row]]:
    """The in-process runs of the largest graph, [10,10], one thread, by batch size."""
    micro = [r for r in results["micro"] if r["threads"] == 1 and r["fanouts"] == [10, 10]]
    if not micro:
        return "", []
    graph = max({r["graph"] for r in micro}, key=lambda g: GRAPHS[g].edges)
    return graph, sorted((r for r in micro if r["graph"] == graph), key=lambda r: r["batch_size"])


#: Profiles whose block holds only the machine and the targets: the quick profile is the check
#: after a change; the full profile's block holds the page's results tables.
BRIEF = {"quick"}


def tables(results: Row) -> str:
    parts = [
        machine_line(results),
        "### Targets",
        _table(["figure", "target", "measured", ""], [list(t) for t in targets(results)]),
    ]
    if results["profile"] not in BRIEF:
        batch, delay = MAIN_BATCH
        parts += [
            f"### Main configuration ({MAIN_GRAPH} edges, 1 worker, closed loop; ours and echo "
            f"batch {batch} / {delay} ms; FastAPI with torch's default threads)",
            _main_table(results),
            "### Open loop (latency from the scheduled send time)",
            _open_loop_table(results),
            f"### Our batching settings ({MAIN_GRAPH} edges, 1 worker)",
            _settings_table(results),
            "### Latency per graph size (1 conn, [10,10], p50 / p99 ms)",
            _sizes_table(results),
            "### Worker memory after load (total PSS of the model's processes, MiB: anon + file)",
            _memory_table(results),
        ]
    return "\n\n".join(parts)


def plots(results: Row, directory: Path) -> list[Path]:
    """Throughput vs connections, latency p50/p99 per system, latency vs graph size, memory vs
    workers, handler stages: one message each, a handful of series."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = f"bench-{results['profile']}-"
    written = [_throughput_plot(results, directory / f"{prefix}throughput-vs-concurrency.png")]
    written.append(_latency_plot(results, directory / f"{prefix}latency-p50-p99.png"))
    written.append(_size_plot(results, directory / f"{prefix}latency-vs-graph-size.png"))
    if memory_by_mode(results):
        written.append(_memory_plot(results, directory / f"{prefix}memory-vs-workers.png"))
    if _stage_rows(results)[1]:
        written.append(_stages_plot(results, directory / f"{prefix}stages.png"))
    return written


def _log_axis_ticks(axis: Any, values: Iterable[float]) -> None:
    """Ticks at exactly ``values`` on a log axis, written as plain numbers."""
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_locator(NullLocator())


def _legend_outside(ax: Any, **kwargs: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, **kwargs)


def _throughput_plot(results: Row, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    levels: set[int] = set()
    for key, *_ in SYSTEMS:
        rows = main_rows(results, key)
        if not rows:
            continue
        label, colour, style = _STYLE[key]
        levels |= {r["concurrency"] for r in rows}
        ax.plot(
            [r["concurrency"] for r in rows],
            [r["throughput"] for r in rows],
            style,
            color=colour,
            label=label,
            linewidth=2,
            markersize=6,
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="concurrent connections (closed loop)",
        ylabel="throughput, requests/s (log)",
        title=f"Throughput, {MAIN_GRAPH}-edge graph, 1 worker, batch "
        f"{MAIN_BATCH[0]} / {MAIN_BATCH[1]} ms",
    )
    _log_axis_ticks(ax.xaxis, levels)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.grid(True, which="major", alpha=0.3)
    _legend_outside(ax)
    return _save(fig, path)


def _latency_plot(results: Row, path: Path) -> Path:
    """p50 and p99 at one connection per system: what one request costs with no queueing."""
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    names, p50, p99, colours = [], [], [], []
    for key, label, colour, _ in SYSTEMS:
        row = next((r for r in main_rows(results, key) if r["concurrency"] == 1), None)
        if row:
            names.append(label.replace(" (", "\n("))
            p50.append(row["p50_ms"])
            p99.append(row["p99_ms"])
            colours.append(colour)
    x = range(len(names))
    width = 0.38
    bars50 = ax.bar([i - width / 2 for i in x], p50, width, color=colours)
    bars99 = ax.bar([i + width / 2 for i in x], p99, width, color=colours, alpha=0.45, hatch="//")
    for bars in (bars50, bars99):
        ax.bar_label(bars, labels=[_ms(b.get_height()) for b in bars], fontsize=8, padding=2)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set(
        yscale="log",
        ylabel="latency, ms (log)",
        title=f"Latency at 1 connection, {MAIN_GRAPH}-edge graph",
    )
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_ylim(top=max(p99, default=1) * 3)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(
        handles=[
            Patch(facecolor="#999999", label="p50"),
            Patch(facecolor="#999999", alpha=0.45, hatch="//", label="p99"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        frameon=False,
    )
    return _save(fig, path)


def _size_plot(results: Row, path: Path) -> Path:
    """p50 at one connection against the graph's edges: ours (no batching delay and the main
    batching) and the baselines."""
    sizes = [
        r
        for r in results["load"]
        if r.get("experiment") == "sizes" and r["concurrency"] == 1 and r.get("fanouts") == [10, 10]
    ]
    baselines = [r for r in _sweep(results) if r["concurrency"] == 1 and not r.get("threads")]
    series = [
        ("gnnserve, batch 1 (no delay)", "#0072B2", "o-", _find(sizes, batch=1)),
        (
            f"gnnserve, batch {MAIN_BATCH[0]} / {MAIN_BATCH[1]} ms",
            "#56B4E9",
            "o--",
            _find(sizes, batch=MAIN_BATCH[0], delay=MAIN_BATCH[1]),
        ),
        (
            _STYLE["fastapi-khop"][0],
            *_STYLE["fastapi-khop"][1:],
            _find(baselines, system="fastapi-khop"),
        ),
        (
            _STYLE["fastapi-whole"][0],
            *_STYLE["fastapi-whole"][1:],
            _find(baselines, system="fastapi-whole"),
        ),
    ]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    edges: set[int] = set()
    for label, colour, style, rows in series:
        rows = sorted(rows, key=lambda r: GRAPHS[r["graph"]].edges)
        if not rows:
            continue
        xs = [GRAPHS[r["graph"]].edges for r in rows]
        edges |= set(xs)
        ax.plot(xs, [r["p50_ms"] for r in rows], style, color=colour, label=label, linewidth=2)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="graph size, edges (log; nodes = edges / 10)",
        ylabel="p50 latency at 1 connection, ms (log)",
        title="Latency vs graph size, fanouts [10,10]",
    )
    _log_axis_ticks(ax.xaxis, edges)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.grid(True, which="major", alpha=0.3)
    _legend_outside(ax)
    return _save(fig, path)


def _memory_plot(results: Row, path: Path) -> Path:
    """Total PSS against workers, pre-forked and plain, each bar split into the file-backed part
    (the graph's memory map and libraries, shared) and the anonymous part (per process)."""
    memory = memory_by_mode(results)
    modes = [
        (m, label, colour)
        for m, label, colour in (
            ("prefork", "pre-forked workers (default)", "#0072B2"),
            ("plain", "plain workers (one interpreter each)", "#E69F00"),
        )
        if m in memory
    ]
    counts = sorted({w for rows in memory.values() for w in rows})
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    width = 0.8 / len(modes)
    handles = []
    for i, (mode, label, colour) in enumerate(modes):
        rows = [memory[mode][w] for w in counts if w in memory[mode]]
        xs = [counts.index(r["workers"]) + (i - (len(modes) - 1) / 2) * width for r in rows]
        files = [r["loaded"]["pss_file"] for r in rows]
        anon = [r["loaded"]["pss_anon"] for r in rows]
        ax.bar(xs, files, width * 0.92, color=colour, alpha=0.35)
        top = ax.bar(xs, anon, width * 0.92, bottom=files, color=colour)
        ax.bar_label(
            top, labels=[_mib(f + a) for f, a in zip(files, anon, strict=True)], fontsize=8
        )
        handles.append(Patch(facecolor=colour, label=label))
    handles += [
        Patch(facecolor="#555555", label="dark: anonymous (per process)"),
        Patch(facecolor="#555555", alpha=0.35, label="light: file-backed (graph map, libraries)"),
    ]
    ax.set_xticks(range(len(counts)), [str(c) for c in counts])
    ax.set(
        xlabel="workers",
        ylabel="total PSS after load, MiB",
        title="Worker memory, graph with 1.13 GB of features",
    )
    ax.set_ylim(top=ax.get_ylim()[1] * 1.08)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _save(fig, path)


def _stages_plot(results: Row, path: Path) -> Path:
    graph, rows = _stage_rows(results)
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    labels = [str(r["batch_size"]) for r in rows]
    bottom = [0.0] * len(rows)
    for stage, colour in _STAGES:
        values = [r[stage] for r in rows]
        ax.bar(labels, values, 0.6, bottom=bottom, label=stage, color=colour)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(
        xlabel="one-node requests (seeds) per batch",
        ylabel="median time per batch, ms",
        title=f"Handler stages in process, {graph} edges, [10,10], 1 thread",
    )
    ax.grid(True, axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(
        handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False
    )
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
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
    parser.add_argument(
        "results", type=Path, help="results-<profile>.json from bench.experiments.suite"
    )
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
