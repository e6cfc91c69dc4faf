"""The node classification task: predictions, embeddings and cold-start nodes, explanations,
and live graph updates, all on one shared view of the graph."""

from __future__ import annotations

from typing import Any

from handler.explain.ego_explain import ExplainEngine
from handler.pipeline.router import EXPLAIN, EXTRAS, PREDICT, Router, TaskEngine
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.explain import NodeExplanation
from handler.tasks.node.extras import NodeExtrasEngine
from handler.tasks.node.requests import is_node_extra
from handler.tasks.spec import Archive, Loaded, StartedTask, TaskSpec, check_fits, open_updates
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
    live, policy = open_updates(store, settings)
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
