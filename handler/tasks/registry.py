"""Every task an archive can serve, one line each; how a worker starts the archive's task;
and the management API's description of a started one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.explain.ego_explain import METHOD
from handler.graph.graph_source import ServedGraph
from handler.live.updates import UpdateEngine
from handler.tasks.graph.task import TASK as GRAPH
from handler.tasks.link.task import TASK as LINK
from handler.tasks.node.task import TASK as NODE
from handler.tasks.spec import Archive, Loaded, StartedTask, TaskSpec
from model.export import load_model
from model.precompute import PRECOMPUTED_DIR, open_archive_precomputed

TASKS: dict[str, TaskSpec] = {
    "node": NODE,
    "link": LINK,
    "graph": GRAPH,
}


def start_task(archive: Archive, open_graph: Callable[[], ServedGraph]) -> StartedTask:
    """Loads the model (and the graph, if the task serves one) and starts the archive's task,
    its router with the update route (``handler.live.updates``)."""
    task = archive.settings.task
    spec = TASKS[task]
    store = open_graph() if spec.stored_graph else None
    model, config = load_model(archive.model_dir, map_location=archive.device)
    if config.task.value != task:
        raise ValueError(
            f"archive is inconsistent: model_config.json is for task {config.task.value!r}, the "
            f"model-config YAML (gnn: task) says {task!r}; rebuild the archive"
        )
    precomputed = None
    if store is not None and (archive.model_dir / PRECOMPUTED_DIR).is_dir():
        precomputed = open_archive_precomputed(
            archive.model_dir, store, archive.settings.verify_checksum
        )
    loaded = Loaded(model=model, config=config, store=store, precomputed=precomputed)
    started = spec.start(archive, loaded)
    # Every task's router takes updates the same way: applied where the task has a live graph,
    # refused (403, saying how to turn them on) where it has none.
    started.router.take_updates(UpdateEngine(started.live, started.update_policy))
    return started


def build_record(model_dir: Path) -> dict[str, Any]:
    """The model and the build-time verification as ``build_info.json`` records them (archives
    built before verification existed have none)."""
    path = model_dir / "build_info.json"
    if not path.is_file():
        return {}
    info = json.loads(path.read_text())
    model = info.get("model", {})
    record: dict[str, Any] = {"verification": info.get("verification")}
    if "model_class" in model:
        record["model"] = {
            key: model[key]
            for key in ("model_class", "model_file", "num_layers", "output", "edge_input")
        }
    else:
        record["model"] = {"preset": model.get("arch"), "num_layers": model.get("num_layers")}
    return record


def describe(task: StartedTask) -> dict[str, Any]:
    """The management API's ``customized=true`` description of any archive."""
    archive, settings = task.archive, task.archive.settings
    described: dict[str, Any] = {
        "task": settings.task,
        "model_version": archive.model_version,
        "device": str(archive.device),
    }
    store = task.store
    if store is not None:
        described["fanouts"] = list(settings.fanouts)
        described["graph"] = {
            "nodes": store.num_nodes,
            "edges": store.num_edges,
            "feature_dim": store.schema.target_type.feature_dim,
            "num_classes": store.num_classes,
            "class_names": store.class_names,
            "checksum": store.checksum,
        }
    if task.details is not None:
        described[settings.task] = task.details()
    described.update(build_record(archive.model_dir))
    if task.live is not None:
        described["updates"] = task.live.describe()
    if task.precomputed is not None:
        described["precomputed"] = task.precomputed.describe()
    described["explanations"] = {
        "method": METHOD,
        "steps": settings.explain_steps,
        "time_budget_ms": settings.explain_time_budget_ms,
    }
    return described
