"""A random heterogeneous graph and its ego-graphs laid out as gnnserve's sampler lays them out.

Global index space: type ``t``'s nodes are ``[offset_t, offset_t + n_t)``. An ego-graph's level
0 is the seeds; level ``h+1`` the unique in-neighbours (over all relations) of level ``h``'s
nodes, ascending; every in-edge of a level ``h < k`` node comes from its source's row at level
``h+1``, except a self-loop, which stays on its own row (the sampler's ``self_loops_in_place``).
A boundary adds, for every in-edge of a level ``k`` node, an edge from a zero-feature row
(node ``-1``) of the relation's source type: one such row per source type, since a row has one
type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.typing import EdgeType

from model.served_hetero import HeteroNodeModel, answer_seeds
from model.typed_batch import TypedLayout, take_rows

COUNTS = {"user": 30, "merchant": 12, "device": 10}
WIDTHS = {"user": 5, "merchant": 3, "device": 0}
FOLLOWS = ("user", "follows", "user")
SELLS_TO = ("merchant", "sells_to", "user")
USED_BY = ("device", "used_by", "user")
BUYS_FROM = ("user", "buys_from", "merchant")
USES = ("user", "uses", "device")
# Every type is some relation's destination (to_hetero needs that of a user's model).
RELATIONS: tuple[EdgeType, ...] = (FOLLOWS, SELLS_TO, USED_BY, BUYS_FROM, USES)
# The device type is a source only.
SOURCE_ONLY_RELATIONS: tuple[EdgeType, ...] = (FOLLOWS, SELLS_TO, USED_BY, BUYS_FROM)
EDGE_WIDTHS = {FOLLOWS: 2, SELLS_TO: 2}
TARGET = "user"
SEEDS = [3, 0, 17, 25, 11]  # users, in the order a request gives them


def random_hetero_graph(
    seed: int = 0, relations: tuple[EdgeType, ...] = RELATIONS, edges: int = 40
) -> HeteroData:
    """Random relations with parallel edges; ``follows`` also has self-loops."""
    generator = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for key, count in COUNTS.items():
        if WIDTHS[key]:
            data[key].x = torch.randn(count, WIDTHS[key], generator=generator)
        else:
            data[key].num_nodes = count
    for key in relations:
        src, _, dst = key
        edge_index = torch.stack(
            [
                torch.randint(0, COUNTS[src], (edges,), generator=generator),
                torch.randint(0, COUNTS[dst], (edges,), generator=generator),
            ]
        )
        edge_index = torch.cat([edge_index, edge_index[:, :4]], dim=1)  # parallel edges
        if src == dst:
            loops = torch.tensor([[3, 5, 5], [3, 5, 5]])
            edge_index = torch.cat([edge_index, loops], dim=1)
        data[key].edge_index = edge_index
        if key in EDGE_WIDTHS:
            data[key].edge_attr = torch.randn(
                edge_index.size(1), EDGE_WIDTHS[key], generator=generator
            )
    return data


@dataclass(frozen=True)
class Ego:
    """A sampled ego-graph in the global index space (fields as ``SampledSubgraph``'s)."""

    node: Tensor
    row_type: Tensor
    edge_index: Tensor
    edge_type: Tensor
    relation_edge: Tensor  # each edge's position within its relation (its feature row)
    num_seeds: int


def ego_graph(
    data: HeteroData, seeds: list[int], hops: int, boundary: bool, target: str = TARGET
) -> Ego:
    """The full-neighbourhood ``hops``-hop ego-graph of ``target``-type ``seeds`` (indices
    within that type)."""
    node_types, edge_types = data.metadata()
    offsets = _offsets(data)
    type_of = torch.cat(
        [torch.full((data[key].num_nodes,), i) for i, key in enumerate(node_types)]
    ).tolist()
    in_edges: dict[int, list[tuple[int, int, int]]] = {}
    for r, (src, _, dst) in enumerate(edge_types):
        for k, (u, v) in enumerate(data[edge_types[r]].edge_index.t().tolist()):
            in_edges.setdefault(v + offsets[dst], []).append((u + offsets[src], r, k))
    rows = [offsets[target] + seed for seed in seeds]
    level = list(range(len(rows)))
    src_rows: list[int] = []
    dst_rows: list[int] = []
    relation: list[int] = []
    position: list[int] = []
    for _ in range(hops):
        sources = sorted({u for row in level for u, _, _ in in_edges.get(rows[row], [])})
        next_row = {u: len(rows) + i for i, u in enumerate(sources)}
        rows.extend(sources)
        for row in level:
            for u, r, k in in_edges.get(rows[row], []):
                src_rows.append(row if u == rows[row] else next_row[u])
                dst_rows.append(row)
                relation.append(r)
                position.append(k)
        level = list(next_row.values())
    row_type = [type_of[v] for v in rows]
    if boundary:
        source_types = sorted({node_types.index(src) for src, _, _ in edge_types})
        boundary_row = {t: len(rows) + i for i, t in enumerate(source_types)}
        rows.extend([-1] * len(source_types))
        row_type.extend(source_types)
        for row in level:
            for u, r, k in in_edges.get(rows[row], []):
                source_type = node_types.index(edge_types[r][0])
                src_rows.append(row if u == rows[row] else boundary_row[source_type])
                dst_rows.append(row)
                relation.append(r)
                position.append(k)
    return Ego(
        node=torch.tensor(rows),
        row_type=torch.tensor(row_type),
        edge_index=torch.tensor([src_rows, dst_rows], dtype=torch.long).view(2, -1),
        edge_type=torch.tensor(relation, dtype=torch.long),
        relation_edge=torch.tensor(position, dtype=torch.long),
        num_seeds=len(seeds),
    )


def answer_on_ego(
    model: HeteroNodeModel, data: HeteroData, ego: Ego, embedding: bool = False
) -> tuple[Tensor, Tensor | None]:
    """The model's seed rows on ``ego``, its inputs gathered as a server gathers them: each
    type's features and each relation's edge features by index, zeros for boundary rows."""
    node_types, edge_types = data.metadata()
    layout = TypedLayout.build(ego.row_type, ego.edge_index, ego.edge_type, node_types, edge_types)
    starts = torch.tensor([_offsets(data)[key] for key in node_types])
    local = torch.where(ego.node >= 0, ego.node - starts[ego.row_type], -1)
    n_id = layout.split_rows(local)
    features = {key: take_rows(_table(data, key), n_id[key]) for key in node_types}
    positions = layout.split_edges(ego.relation_edge)
    edge_features = {
        key: take_rows(data[key].edge_attr, positions[key])
        for key in edge_types
        if "edge_attr" in data[key]
    }
    return answer_seeds(model, layout, features, n_id, edge_features, ego.num_seeds, embedding)


def _table(data: HeteroData, key: str) -> Tensor:
    x = data[key].get("x")
    return x if isinstance(x, Tensor) else torch.empty(data[key].num_nodes, 0)


def _offsets(data: HeteroData) -> dict[str, int]:
    offsets, start = {}, 0
    for key in data.node_types:
        offsets[key] = start
        start += data[key].num_nodes
    return offsets
