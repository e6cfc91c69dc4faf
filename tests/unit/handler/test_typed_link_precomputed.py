"""Precomputed link archives of a relation of a typed graph (user__pays__merchant): every user's
and merchant's ``encode`` embedding is stored, and after a seeded random stream of typed
updates taken by two workers on one log, pair scores and top-k over the live merchants (new
ones included, removed ones left out, the user's neighbours on the relation left out) equal
decode(encode(the whole updated graph)) on both workers and on a worker started afterwards,
for the recipes and a user's link model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from graph_assets import GraphStore
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.tasks.link.engine import LinkEngine
from model import ModelConfig, build_model
from model.hetero_link import HeteroLinkModel
from model.link import answer_scores
from model.served import serving_needs
from model.served_hetero_link import UserHeteroLinkModel
from model.typed_graph import hetero_section
from tests.precomputed_engines import link_worker
from tests.typed_graphs import fraud_store
from tests.typed_live_reference import live_nodes, materialized_typed, random_typed_update
from tests.unit.archive_build import user_models

PAYS = "user__pays__merchant"
UPDATES = 60
DEVICES = 30


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    path = tmp_path_factory.mktemp("typed_link_precomputed") / "store"
    return fraud_store(path, 80, 15, DEVICES, 250, 6)


def link_model(store: GraphStore, arch: str, decoder: str) -> HeteroLinkModel:
    """A seeded recipe encoder with ``decoder``, or (``own``) the user's FraudPaysLink; the
    payments' edge-feature maps scaled down so that attention does not saturate."""
    torch.manual_seed(0)
    if arch == "own":
        module = user_models.FraudPaysLink(devices=DEVICES, hidden=8, edge_dim=2)
        model: torch.nn.Module = UserHeteroLinkModel(module, ("user", "pays", "merchant"), hops=2)
    else:
        config = ModelConfig(
            task="link", arch=arch, decoder=decoder, in_dim=store.feature_dim, out_dim=8,
            hidden_dim=8, heads=2, hetero=hetero_section(store.schema, PAYS),
        )  # fmt: skip
        model = build_model(config)
    with torch.no_grad():
        for sub in model.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    assert isinstance(model, HeteroLinkModel)
    return model.eval()


def worker(
    store: GraphStore, model: HeteroLinkModel, directory: Path, log: Path
) -> tuple[LinkEngine, LiveGraph]:
    """A worker of the link archive under ``directory`` with sampled fanouts, on ``log``."""
    engine, live = link_worker(store, model, directory, log, fanouts=(2, 1))
    assert live is not None
    return engine, live


def reference(live: LiveGraph, model: HeteroLinkModel):
    """The live users and merchants (global indices, ascending) and decode-ready
    embeddings of the updated graph's whole encode."""
    live.sync()
    _, inputs = materialized_typed(live)
    with torch.no_grad():
        z = model.encode(inputs)
    schema = live.store.schema
    users = live_nodes(live, schema.type_index("user"))
    merchants = live_nodes(live, schema.type_index("merchant"))
    return users, merchants, z


def scores(model: HeteroLinkModel, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return answer_scores(model.score(z_src, z_dst), serving_needs(model).output)


def neighbours_on_pays(live: LiveGraph, user: int) -> set[int]:
    """The merchants ``user`` pays, and those with a rev_pays edge into it, now."""
    overlay, schema = live.overlay, live.store.schema
    pays, rev = schema.relation_index(PAYS), schema.relation_index("merchant__rev_pays__user")
    linked = set(
        overlay.in_list(user)[
            overlay.edge_relations(overlay.in_list_edge_ids(user)) == rev
        ].tolist()
    )
    for merchant in live_nodes(live, schema.type_index("merchant")).tolist():
        sources = overlay.in_list(merchant)
        kinds = overlay.edge_relations(overlay.in_list_edge_ids(merchant))
        if ((sources == user) & (kinds == pays)).any():
            linked.add(merchant)
    return linked


def check(engine: LinkEngine, live: LiveGraph, model: HeteroLinkModel, rng: random.Random) -> None:
    users, merchants, z = reference(live, model)
    overlay = live.overlay
    picked_users = [rng.randrange(len(users)) for _ in range(24)]
    picked_merchants = [rng.randrange(len(merchants)) for _ in range(24)]
    pairs = [
        [a, b]
        for a, b in zip(
            overlay.external_ids(users[picked_users]),
            overlay.external_ids(merchants[picked_merchants]),
            strict=True,
        )
    ]
    bodies = [{"pairs": pairs[i : i + 8]} for i in range(0, len(pairs), 8)]
    sources = rng.sample(range(len(users)), 4)
    bodies += [{"src": i, "top_k": len(merchants)} for i in overlay.external_ids(users[sources])]
    answers = engine.handle([{"body": body} for body in bodies])
    assert all(a.status == 200 for a in answers), [a.body for a in answers if a.status != 200]
    got = torch.tensor([p["score"] for a in answers[:3] for p in a.body["predictions"]])
    expected = scores(model, z["user"][picked_users], z["merchant"][picked_merchants])
    assert float((got - expected).abs().max()) <= 1e-5
    for source, answer in zip(sources, answers[3:], strict=True):
        skip = neighbours_on_pays(live, int(users[source]))
        kept = [i for i, m in enumerate(merchants.tolist()) if m not in skip]
        every = scores(model, z["user"][[source] * len(kept)], z["merchant"][kept])
        want = dict(zip(overlay.external_ids(merchants[kept]), every.tolist(), strict=True))
        found = answer.body["recommendations"]  # every merchant kept, best first (ties any way)
        assert sorted(r["dst"] for r in found) == sorted(want)
        ranked = torch.tensor([r["score"] for r in found])
        assert float((ranked - torch.tensor([want[r["dst"]] for r in found])).abs().max()) <= 1e-5
        assert torch.equal(ranked, ranked.sort(descending=True).values)


@pytest.mark.parametrize(
    ("arch", "decoder"), [("sage", "dot"), ("gat", "mlp"), ("gcn", "dot"), ("hgt", "mlp"),
                          ("own", "decode")],
)  # fmt: skip
def test_pair_scores_and_top_k_are_exact_after_typed_updates(store, tmp_path, arch, decoder):
    model = link_model(store, arch, decoder)
    log = tmp_path / "updates.log"
    first, live = worker(store, model, tmp_path, log)
    second, second_live = worker(store, model, tmp_path, log)
    rng, counter = random.Random(23), [0]
    check(first, live, model, random.Random(0))  # before any update: the stored rows
    for step in range(UPDATES):
        taker = live if step % 2 else second_live
        taker.update(UpdateRequest(random_typed_update(rng, taker, counter)))
    late, _ = worker(store, model, tmp_path, log)
    for engine in (first, second, late):
        check(engine, live, model, random.Random(1))
