"""The link prediction task: pair scores and top-k recommendations from the archive's
candidate embeddings (or its precomputed rows, which follow live updates), and pair
explanations."""

from __future__ import annotations

from handler.explain.ego_explain import ExplainEngine
from handler.graph.ego import EgoGraphs
from handler.pipeline.batch import apply_threads
from handler.pipeline.router import EXPLAIN, PREDICT, Router, TaskEngine, predict_or_explain
from handler.tasks.link.engine import LinkEngine
from handler.tasks.link.explain import PairExplanation
from handler.tasks.spec import Archive, Loaded, StartedTask, TaskSpec, check_fits, open_updates
from model.link_assets import LINK_DIR, open_link_assets


def start(archive: Archive, loaded: Loaded) -> StartedTask:
    """Checks the graph, the model and the candidate embeddings fit together."""
    store, config, settings = loaded.stored_graph(), loaded.config, archive.settings
    check_fits(config, store, settings, classes=False)
    assets = open_link_assets(archive.model_dir / LINK_DIR, store, settings.verify_checksum)
    if assets.embeddings.shape[1] != config.out_dim:
        raise ValueError(
            f"{LINK_DIR}/embeddings.npy is {assets.embeddings.shape[1]} wide, the model's "
            f"embeddings are {config.out_dim} (model_config.json out_dim); rebuild the archive"
        )
    if settings.updates_enabled and loaded.precomputed is None:
        raise ValueError(
            "a link archive that takes updates needs precomputed rows (top-k searches every "
            "node's embedding); rebuild it with ./build_mar.sh --task link --precompute"
        )
    apply_threads(settings)
    live, policy = open_updates(store, settings)
    ego = EgoGraphs.create(
        store, loaded.model, settings, archive.device, live, precomputed=loaded.precomputed
    )
    engine = LinkEngine(ego, assets, archive.model_version, archive.model_name)
    engines: dict[str, TaskEngine] = {
        PREDICT: engine,
        EXPLAIN: ExplainEngine(PairExplanation(ego), archive.model_version),
    }
    router = Router(engines, predict_or_explain)
    return StartedTask(
        archive,
        engine,
        router,
        details=engine.describe,
        store=store,
        live=live,
        update_policy=policy,
        precomputed=ego.precomputed,
    )


TASK = TaskSpec(stored_graph=True, start=start)
