"""Fixtures shared by the integration modules: the node archive built by build_mar.sh, the
``serve`` factory every module starts its TorchServe with, and one server on that archive."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from bench.harness.torchserve import Serve, TorchServe

from .archives import build_archive, write_small_graph

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
    root = tmp_path_factory.mktemp("archives")
    graph = write_small_graph(root / "graph")
    return build_archive(
        root / "model_store",
        graph,
        "--arch",
        "gcn",
        "--epochs",
        "30",
        "--fanouts",
        "-1,-1",
        "--batch-size",
        "8",
        "--max-batch-delay",
        "100",
        "--max-ids",
        "16",
    )


@pytest.fixture(scope="module")
def server(serve: Serve, model_store: Path) -> Iterator[TorchServe]:
    """One server per module on the session's node archive (``gnn``)."""
    with serve(model_store, "gnn=gnn.mar") as started:
        yield started
