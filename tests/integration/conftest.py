"""Fixtures shared by the integration modules: the node archive built by build_mar.sh, a store
holding it with a link and a graph archive, the ``serve`` factory a module starts a TorchServe
of its own with, and the session's one shared TorchServe, which serves those archives and on
which modules register their own (``register``) instead of starting a server each."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from graph_assets.input.graph_dataset import generate_graph_dataset, write_graph_dataset_csv
from tests.servers.torchserve import Register, Serve, TorchServe, register_archives

from .archives import (
    SHARED_UPDATE_SECRET,
    TASK_MODELS,
    build_archive,
    concurrently,
    write_small_graph,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Serve:
    """Starts a TorchServe serving ``models`` from ``model_store`` and stops it, by PID, when
    the ``with`` block ends however it ends. ``home`` defaults to a new temporary directory
    named after ``name``; ``env`` is added to the server's (and so its workers') environment.
    A module fixture holding the block open around its ``yield`` shares one server among the
    module's tests; a test may hold it around its own body, and stop or start it inside."""

    @contextlib.contextmanager
    def serving(
        model_store: Path,
        models: str,
        *,
        name: str = "torchserve",
        home: Path | None = None,
        extra_config: str = "",
        env: Mapping[str, str] | None = None,
        prefork: bool = False,
    ) -> Iterator[TorchServe]:
        server = TorchServe(
            home=home if home is not None else tmp_path_factory.mktemp(name),
            model_store=model_store,
            prefork=prefork,
            extra_env=dict(env or {}),
        )
        try:
            server.start(models, extra_config=extra_config)
            yield server
        finally:
            server.stop()

    return serving


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gnn.mar: gcn, full neighbourhoods, batches of 8. Trained for 3 epochs: its tests hold
    answers to the model's own forward, none to its accuracy (each epoch costs seconds)."""
    root = tmp_path_factory.mktemp("archives")
    graph = write_small_graph(root / "graph")
    return build_archive(
        root / "model_store",
        graph,
        "--arch",
        "gcn",
        "--epochs",
        "3",
        "--fanouts",
        "-1,-1",
        "--batch-size",
        "8",
        "--max-batch-delay",
        "100",
        "--max-ids",
        "16",
    )


@pytest.fixture(scope="session")
def tasks_store(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    """One archive of each task: the node archive above (``gnn``), ``link`` and ``graphs``
    (TorchServe batching on: 8 requests, 100 ms). ``graphs`` trains for 40 epochs: test_tasks
    checks its accuracy; ``link`` for 3, as no test checks its own."""
    root = tmp_path_factory.mktemp("tasks")
    store = root / "model_store"
    store.mkdir()
    os.link(model_store / "gnn.mar", store / "gnn.mar")  # the node archive (gcn, -1,-1)
    common = ["--batch-size", "8", "--max-batch-delay", "100"]
    link_graph = write_small_graph(root / "graph")
    graphs = root / "graphs"
    write_graph_dataset_csv(generate_graph_dataset(160, seed=1), graphs)
    link = (
        *("--task", "link", "--name", "link", "--arch", "gcn", "--decoder", "mlp"),
        *("--fanouts", "-1,-1", "--max-top-k", "20", "--epochs", "3", *common),
    )
    graph_task = (
        *("--task", "graph", "--name", "graphs", "--max-graph-nodes", "40", "--epochs", "40"),
        *("--metrics-interval", "0", *common),  # a log line per batch: tests read batch sizes
    )
    concurrently(
        functools.partial(build_archive, store, link_graph, *link),
        functools.partial(build_archive, store, graphs, *graph_task),
    )
    return store


@pytest.fixture(scope="session")
def shared_server(serve: Serve, tasks_store: Path) -> Iterator[TorchServe]:
    """The session's TorchServe: the shipped config.properties, the task archives (``gnn``,
    ``link``, ``graphs``) of ``tasks_store``, and the archives modules ``register`` on it.
    Its workers inherit ``GNNSERVE_UPDATE_SECRET=SHARED_UPDATE_SECRET``, so a module whose
    archives take live updates sends that key. A test that kills workers or the server, needs
    another config.properties or environment, pre-forks, or runs replicas starts its own with
    ``serve`` instead."""
    env = {"GNNSERVE_UPDATE_SECRET": SHARED_UPDATE_SECRET}
    with serve(tasks_store, TASK_MODELS, name="shared_server", env=env) as started:
        yield started


@pytest.fixture(scope="session")
def register(shared_server: TorchServe) -> Register:
    """``with register(store, ["a", "b"]) as server:`` registers ``store``'s a.mar and b.mar on
    the shared server and unregisters them when the block ends (a module fixture holds it)."""

    def registering(
        model_store: Path, names: list[str]
    ) -> contextlib.AbstractContextManager[TorchServe]:
        return register_archives(shared_server, model_store, names)

    return registering


@pytest.fixture(scope="module")
def server(shared_server: TorchServe) -> TorchServe:
    """The shared server, for modules that ask the node archive (``gnn``) only questions."""
    return shared_server
