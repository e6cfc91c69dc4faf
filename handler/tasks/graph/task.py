"""The graph classification task: inline graphs (no stored graph), class names from the
archive's ``classes.json``, and graph explanations."""

from __future__ import annotations

import json

from handler.explain.ego_explain import ExplainEngine
from handler.pipeline.batch import apply_threads
from handler.pipeline.router import EXPLAIN, PREDICT, Router, TaskEngine, predict_or_explain
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.graph.explain import GraphExplanation
from handler.tasks.spec import Archive, Loaded, StartedTask, TaskSpec
from model.graph_level import CLASSES_FILE


def start(archive: Archive, loaded: Loaded) -> StartedTask:
    classes = archive.model_dir / CLASSES_FILE
    class_names = json.loads(classes.read_text())["class_names"] if classes.is_file() else None
    apply_threads(archive.settings)
    engine = GraphEngine(
        loaded.model,
        class_names,
        archive.settings,
        archive.device,
        archive.model_version,
        archive.model_name,
    )
    engines: dict[str, TaskEngine] = {
        PREDICT: engine,
        EXPLAIN: ExplainEngine(GraphExplanation(engine), archive.model_version),
    }
    router = Router(engines, predict_or_explain)
    return StartedTask(archive, engine, router, details=engine.describe)


TASK = TaskSpec(stored_graph=False, start=start)
