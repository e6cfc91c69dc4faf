"""Workers of precomputed archives as the tests build them: the archive's rows (built once per
directory, so that every worker of one archive reads the same rows), a live graph on a log
file or a Redis stream, and the node or link engine over both. One set-up for every graph,
one type or several."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from graph_assets import GraphStore
from graph_assets.live.redis_log import RedisLogConfig
from handler.graph.ego import EgoGraphs
from handler.live.live_graph import LiveGraph
from handler.settings import ServingSettings
from handler.tasks.link.engine import LinkEngine
from handler.tasks.node.engine import NodeClassificationEngine
from model.link_assets import open_link_assets, write_link_assets
from model.precompute import open_precomputed, precompute

WEIGHTS = "weights"
CHUNK_EDGES = 64  # small chunks: a build of the small test graphs spans many


def build_rows(model: torch.nn.Module, store: GraphStore, directory: Path) -> Path:
    """``directory``'s rows, built by the first worker of an archive and reused by the next."""
    if not directory.exists():
        precompute(model, store, directory, WEIGHTS, chunk_edges=CHUNK_EDGES, progress=False)
    return directory


def live_graph(
    store: GraphStore, log: Path | RedisLogConfig | None, follow_interval_s: float = 0.0
) -> LiveGraph | None:
    """A worker's live graph following ``log`` (a file or a Redis stream; with a background
    follower every ``follow_interval_s`` when above 0); None without a log: no updates."""
    if log is None:
        return None
    if isinstance(log, RedisLogConfig):
        return LiveGraph(store, None, follow_interval_s, redis_log=log)
    return LiveGraph(store, log, follow_interval_s)


def node_worker(
    store: GraphStore,
    model: torch.nn.Module,
    directory: Path,
    log: Path | RedisLogConfig | None = None,
    fanouts: Sequence[int] = (2, 2),
    follow_interval_s: float = 0.0,
) -> tuple[NodeClassificationEngine, LiveGraph | None]:
    """A worker of a node archive whose rows live in ``directory`` (sampled fanouts: the
    stored rows make answers exact), following ``log`` when given."""
    build_rows(model, store, directory)
    live = live_graph(store, log, follow_interval_s)
    settings = ServingSettings.from_yaml_section({"fanouts": list(fanouts)})
    engine = NodeClassificationEngine.create(
        store,
        model,
        settings,
        torch.device("cpu"),
        "1.0",
        live,
        precomputed=open_precomputed(directory, store, WEIGHTS),
    )
    return engine, live


def link_worker(
    store: GraphStore,
    model: torch.nn.Module,
    directory: Path,
    log: Path | None = None,
    fanouts: Sequence[int] = (2, 2),
) -> tuple[LinkEngine, LiveGraph | None]:
    """A worker of a link archive under ``directory`` (its precomputed/ rows and link/ assets,
    built by the first worker), following ``log`` when given."""
    rows = directory / "precomputed"
    if not rows.exists():
        write_link_assets(model, store, directory / "link")
    build_rows(model, store, rows)
    live = live_graph(store, log)
    settings = ServingSettings.from_yaml_section({"task": "link", "fanouts": list(fanouts)})
    ego = EgoGraphs.create(
        store,
        model,
        settings,
        torch.device("cpu"),
        live,
        precomputed=open_precomputed(rows, store, WEIGHTS),
    )
    return LinkEngine(ego, open_link_assets(directory / "link", store), "1.0"), live


def served(
    engine: NodeClassificationEngine,
    ids: Sequence,
    node_type: str | None = None,
    steps: int | None = None,
    batch: int = 32,
) -> torch.Tensor:
    """Every node's probabilities, asked ``batch`` nodes a request; each request must answer
    200 (and, given ``steps``, report the graph version after that many updates)."""
    typed = {} if node_type is None else {"node_type": node_type}
    bodies = [{"node_ids": ids[i : i + batch], **typed} for i in range(0, len(ids), batch)]
    answers = engine.handle([{"body": body} for body in bodies])
    assert all(a.status == 200 for a in answers), [a.body for a in answers if a.status != 200]
    if steps is not None:
        versions = [a.body["graph_version"] for a in answers]
        assert all(v.endswith(f"+{steps}") for v in versions), versions
    return torch.tensor([p["probabilities"] for a in answers for p in a.body["predictions"]])
