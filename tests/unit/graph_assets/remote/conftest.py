"""The two stores the tests load into Redis (the session's shared instances, tests/conftest.py,
or a fault test's own): the typed fraud graph (three node types, four relations, string and int
IDs, a featureless type, edge features on one relation) and a one-type graph with edge
features, self-loops and parallel edges."""

from __future__ import annotations

import pytest

from graph_assets import GraphStore
from tests.edge_graph import edge_feature_store
from tests.typed_graphs import fraud_store


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("fraud"), 300, 40, 60, 1500, seed=1)


@pytest.fixture(scope="module")
def one_type_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("edges"))
