"""A generated heterogeneous fraud graph: users pay merchants and use devices.

Users carry 8 features and a label (``fraud`` or ``legit``), merchants 4 features, devices none
(a model learns them by index). Fraud users share a small pool of devices and favour a few
risky merchants, so the relations carry signal a model can learn beyond the users' own noisy
features. Payments carry ``amount`` and ``hour`` as edge features. The same arguments give the
same graph, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graph_assets.schema import EdgeType
from graph_assets.tables import RawNodes, RawRelation, TypedGraph

USER_FEATURES, MERCHANT_FEATURES = 8, 4
FRAUD_SHARE = 0.1


def fraud_graph(
    users: int, merchants: int, devices: int, payments: int, seed: int = 0
) -> TypedGraph:
    """The graph as a `TypedGraph` (user IDs ``u<i>``, merchant IDs integers, device IDs
    ``d<i>``); ``payments`` payments and one or two devices per user."""
    rng = np.random.default_rng(seed)
    fraud = rng.random(users) < FRAUD_SHARE
    user_x = rng.normal(size=(users, USER_FEATURES)).astype(np.float32)
    user_x[fraud, :2] += 0.6  # a weak signal of their own
    risky = rng.random(merchants) < 0.05
    merchant_x = rng.normal(size=(merchants, MERCHANT_FEATURES)).astype(np.float32)
    merchant_x[risky, 0] += 1.5
    payer = rng.integers(0, users, payments)
    fraud_payer = fraud[payer]
    risky_ids = np.flatnonzero(risky) if risky.any() else np.arange(1)
    merchant = np.where(
        fraud_payer & (rng.random(payments) < 0.7),
        rng.choice(risky_ids, payments),
        rng.integers(0, merchants, payments),
    )
    amount = np.where(
        fraud_payer, rng.lognormal(4.5, 1.0, payments), rng.lognormal(3.5, 1.0, payments)
    )
    hour = rng.integers(0, 24, payments)
    pays = np.stack([amount, hour], axis=1).astype(np.float32)
    pool = max(1, devices // 50)  # the devices fraud rings share
    per_user = 1 + (rng.random(users) < 0.3)
    user_of_use = np.repeat(np.arange(users), per_user)
    device = np.where(
        fraud[user_of_use] & (rng.random(len(user_of_use)) < 0.8),
        rng.integers(0, pool, len(user_of_use)),
        rng.integers(0, devices, len(user_of_use)),
    )
    no_features = np.empty((len(user_of_use), 0), dtype=np.float32)
    return TypedGraph(
        node_types=(
            RawNodes("user", _ids("u", users), user_x, [f"x{i}" for i in range(USER_FEATURES)]),
            RawNodes(
                "merchant",
                np.arange(merchants, dtype=np.int64) + 1000,
                merchant_x,
                [f"m{i}" for i in range(MERCHANT_FEATURES)],
            ),
            RawNodes("device", _ids("d", devices), np.empty((devices, 0), np.float32), []),
        ),
        relations=(
            RawRelation(
                EdgeType("user", "pays", "merchant"), payer, merchant, pays, ["amount", "hour"]
            ),
            RawRelation(EdgeType("user", "uses", "device"), user_of_use, device, no_features, []),
        ),
        target="user",
        labels=fraud.astype(np.int64),
        class_names=["legit", "fraud"],
    )


def write_fraud_graph_csv(graph: TypedGraph, out: Path) -> Path:
    """``graph`` as a typed graph directory (``nodes/<type>.csv``,
    ``edges/<src>__<relation>__<dst>.csv``), the layout ``--graph`` reads."""
    for folder in ("nodes", "edges"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for nodes in graph.node_types:
        columns = [
            _text(nodes.ids),
            *(nodes.features[:, j].astype(str) for j in range(nodes.feature_dim)),
        ]
        header = ["id", *nodes.feature_names]
        if nodes.name == graph.target:
            assert graph.class_names is not None
            columns.append(np.array(graph.class_names, dtype=object)[graph.labels].astype(str))
            header.append("label")
        _write_csv(out / "nodes" / f"{nodes.name}.csv", header, columns)
    ids = {nodes.name: _text(nodes.ids) for nodes in graph.node_types}
    for relation in graph.relations:
        edge_type = relation.edge_type
        columns = [
            ids[edge_type.src][relation.src],
            ids[edge_type.dst][relation.dst],
            *(
                relation.edge_features[:, j].astype(str)
                for j in range(relation.edge_features.shape[1])
            ),
        ]
        _write_csv(
            out / "edges" / f"{edge_type.name}.csv",
            ["src", "dst", *relation.edge_feature_names],
            columns,
        )
    return out


def _ids(prefix: str, count: int) -> np.ndarray:
    return np.array(
        [f"{prefix}{i}".encode() for i in range(count)], dtype=f"S{len(prefix) + len(str(count))}"
    )


def _text(ids: np.ndarray) -> np.ndarray:
    return ids.astype(str) if ids.dtype.kind == "i" else np.char.decode(ids, "utf-8")


def _write_csv(file: Path, header: list[str], columns: list[np.ndarray]) -> None:
    rows = np.stack(columns, axis=1) if columns else np.empty((0, 0))
    with file.open("w", encoding="utf-8") as f:
        f.write(",".join(header) + "\n")
        for row in rows:
            f.write(",".join(row) + "\n")
