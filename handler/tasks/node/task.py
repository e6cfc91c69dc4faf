"""The node classification task: predictions, embeddings and cold-start nodes, explanations,
and live graph updates, all on one shared view of the graph."""

from __future__ import annotations

from typing import Any

from graph_assets import GraphStore
from handler.core.explain import ExplainEngine
from handler.core.graph_source import mapped_graph
from handler.core.router import EXPLAIN, EXTRAS, PREDICT, Router, TaskEngine
from handler.live.live_graph import UpdatePolicy, open_live_graph
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.explain import NodeExplanation
from handler.tasks.node.extras import NodeExtrasEngine
from handler.tasks.node.requests import is_node_extra
from handler.tasks.spec import Archive, Loaded, StartedTask, TaskSpec, check_fits
from model.served import serving_needs
from model.user_model import Output


def node_router(engine: NodeClassificationEngine, model_version: str) -> Router:
    """Predictions; bodies with ``return_embedding`` or ``new_node`` to the extras engine;
    explanations to the explain engine; all on the prediction engine's graph and sampler."""

    def choose(body: Any, explain: bool) -> str:
        if explain:
            return EXPLAIN
        return EXTRAS if is_node_extra(body) else PREDICT

    engines: dict[str, TaskEngine] = {
        PREDICT: engine,
        EXTRAS: NodeExtrasEngine(engine.ego, model_version),
        EXPLAIN: ExplainEngine(NodeExplanation(engine.ego), model_version),
    }
    return Router(engines, choose)


def start(archive: Archive, loaded: Loaded) -> StartedTask:
    store, settings = loaded.stored_graph(), archive.settings
    classes = serving_needs(loaded.model).output is not Output.RAW
    check_fits(loaded.config, store, settings, classes=classes)
    if isinstance(store, GraphStore) or settings.updates_enabled:
        live, policy = open_live_graph(mapped_graph(store, "live updates"), settings)
    else:  # a graph in Redis serves without live updates (the overlay maps its base)
        live, policy = None, UpdatePolicy(None, settings.max_update_operations)
    engine = NodeClassificationEngine.create(
        store,
        loaded.model,
        settings,
        archive.device,
        archive.model_version,
        live=live,
        model_name=archive.model_name,
        precomputed=loaded.precomputed,
    )
    router = node_router(engine, archive.model_version)
    return StartedTask(
        archive,
        engine,
        router,
        store=store,
        live=live,
        update_policy=policy,
        precomputed=engine.ego.precomputed,
    )


TASK = TaskSpec(stored_graph=True, start=start)
