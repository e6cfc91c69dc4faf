"""A sampled ego-graph of a heterogeneous graph in PyG's per-type form, and back.

The sampler works in one global index space: each row has a node type and each edge a relation
index. PyG's heterogeneous layers read per-type dicts instead (``x_dict``, ``edge_index_dict``
in positions within each type). :class:`TypedLayout` is that mapping, computed once per
ego-graph, so features, node indices and edge features are split by the same rule. A
homogeneous graph is the one-type case: every split is the tensor itself, no copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import HeteroData
from torch_geometric.typing import EdgeType

Key = TypeVar("Key", str, EdgeType)


@dataclass(frozen=True)
class HeteroInput:
    """One forward's input, in PyG's names.

    Attributes:
        x_dict: ``[n_t, d_t]`` features of each node type's rows (``d_t`` may be 0).
        edge_index_dict: ``[2, E_r]`` each relation's edges in per-type positions.
        n_id_dict: ``[n_t]`` each row's node index within its type (PyG's ``n_id``), for
            learned embeddings of featureless types. A boundary row holds 0: no answer a seed
            reads depends on its values, only on the edges it adds.
        edge_attr_dict: ``[E_r, D_r]`` edge features of the relations that have them.
        num_sampled_nodes_dict: on a sampled ego-graph, each type's rows per hop (hop 0
            first: its rows are in hop order), as PyG's ``trim_to_layer`` takes them; None on a
            whole graph.
        num_sampled_edges_dict: each relation's edges per hop of their destination (likewise
            in hop order); None on a whole graph.
    """

    x_dict: dict[str, Tensor]
    edge_index_dict: dict[EdgeType, Tensor]
    n_id_dict: dict[str, Tensor]
    edge_attr_dict: dict[EdgeType, Tensor]
    num_sampled_nodes_dict: dict[str, list[int]] | None = None
    num_sampled_edges_dict: dict[EdgeType, list[int]] | None = None


@dataclass(frozen=True)
class TypedLayout:
    """Where each row and edge of an ego-graph goes in PyG's per-type dicts.

    Attributes:
        node_types, edge_types: the graph's metadata; row type ``i`` is ``node_types[i]``,
            relation ``r`` is ``edge_types[r]``.
        rows: each node type's rows, ascending (so the seeds, rows ``0..s-1`` of the target
            type, are its first positions).
        position: ``[n]`` each row's position within its type.
        edge_index_dict: each relation's ``edge_index`` in per-type positions.
        edges: each relation's edge positions in ``E``, ascending (to split any per-edge
            tensor, such as edge IDs, by relation).
        homogeneous: one node type and one relation: every split is the tensor itself.
    """

    node_types: tuple[str, ...]
    edge_types: tuple[EdgeType, ...]
    rows: dict[str, Tensor]
    position: Tensor
    edge_index_dict: dict[EdgeType, Tensor]
    edges: dict[EdgeType, Tensor]
    homogeneous: bool

    @classmethod
    def build(
        cls,
        row_type: Tensor,
        edge_index: Tensor,
        edge_type: Tensor,
        node_types: Sequence[str],
        edge_types: Sequence[EdgeType],
    ) -> TypedLayout:
        """The layout of rows typed ``row_type`` ``[n]`` and edges ``edge_index`` ``[2, E]``
        (rows, message direction) of relations ``edge_type`` ``[E]``. Raises ValueError when an
        index is out of range or an edge joins rows of other types than its relation's."""
        node_types, edge_types = tuple(node_types), tuple(edge_types)
        _check_metadata(node_types, edge_types)
        n, num_edges = row_type.numel(), edge_index.size(1)
        if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_type.shape != (num_edges,):
            raise ValueError(
                f"edge_index must be [2, E] and edge_type [E]; got {list(edge_index.shape)} "
                f"and {list(edge_type.shape)}"
            )
        if len(node_types) == 1 and len(edge_types) == 1:
            _check_range("edge_index", edge_index.cpu().numpy(), n)
            positions = torch.arange(n, device=row_type.device)
            everything = torch.arange(num_edges, device=edge_index.device)
            return cls(
                node_types=node_types,
                edge_types=edge_types,
                rows={node_types[0]: positions},
                position=positions,
                edge_index_dict={edge_types[0]: edge_index},
                edges={edge_types[0]: everything},
                homogeneous=True,
            )
        # Split on the host in numpy (a sampled ego-graph comes from there): a few vectorised
        # passes, where torch's argsort and per-relation gathers cost a served batch ~0.3 ms.
        types, ends = row_type.cpu().numpy(), edge_index.cpu().numpy()
        relations = edge_type.cpu().numpy()
        _check_range("row_type", types, len(node_types))
        _check_range("edge_type", relations, len(edge_types))
        _check_range("edge_index", ends, n)
        _check_edge_ends(types, ends, relations, node_types, edge_types)
        rows, position = _split_positions(types, len(node_types))
        edges, _ = _split_positions(relations, len(edge_types))

        def tensor(values: np.ndarray) -> Tensor:  # row-major: an edge_index row is contiguous
            return torch.from_numpy(np.ascontiguousarray(values)).to(edge_index.device)

        return cls(
            node_types=node_types,
            edge_types=edge_types,
            rows={key: tensor(part) for key, part in zip(node_types, rows, strict=True)},
            position=tensor(position),
            edge_index_dict={
                key: tensor(position[ends[:, part]])
                for key, part in zip(edge_types, edges, strict=True)
            },
            edges={key: tensor(part) for key, part in zip(edge_types, edges, strict=True)},
            homogeneous=False,
        )

    def to(self, device: torch.device) -> TypedLayout:
        """The same layout with its tensors on ``device`` (itself when they are there)."""
        if self.position.device == device:
            return self
        return dataclasses.replace(
            self,
            rows={key: t.to(device, non_blocking=True) for key, t in self.rows.items()},
            position=self.position.to(device, non_blocking=True),
            edge_index_dict={
                key: t.to(device, non_blocking=True) for key, t in self.edge_index_dict.items()
            },
            edges={key: t.to(device, non_blocking=True) for key, t in self.edges.items()},
        )

    def split_rows(self, values: Tensor) -> dict[str, Tensor]:
        """A per-row tensor (e.g. each row's index within its type) split by node type."""
        if self.homogeneous:
            return {self.node_types[0]: values}
        return {key: values[rows] for key, rows in self.rows.items()}

    def split_edges(self, values: Tensor) -> dict[EdgeType, Tensor]:
        """A per-edge tensor (e.g. edge IDs) split by relation."""
        if self.homogeneous:
            return {self.edge_types[0]: values}
        return {key: values[edges] for key, edges in self.edges.items()}

    def inputs(
        self,
        features: Mapping[str, Tensor],
        n_id: Mapping[str, Tensor],
        edge_features: Mapping[EdgeType, Tensor],
        level_sizes: Sequence[int] | None = None,
        edge_index: Tensor | None = None,
    ) -> HeteroInput:
        """The model's input from each type's feature rows and node indices (in the order of
        :attr:`rows`) and each featured relation's edge-feature rows (in the order of
        :attr:`edges`); shapes are checked here, not mid-forward. With the ego-graph's
        ``level_sizes`` (rows per hop) and its ``edge_index`` (rows), the per-hop counts
        a layer-wise trim reads."""
        for key in self.node_types:
            count = self.rows[key].numel()
            for name, given in (("features", features), ("n_id", n_id)):
                if key not in given or given[key].size(0) != count:
                    got = list(given[key].shape) if key in given else "nothing"
                    raise ValueError(f"{name}[{key!r}] must have {count} rows; got {got}")
        unknown = sorted(str(key) for key in edge_features if key not in self.edges)
        if unknown:
            raise ValueError(f"edge features of unknown relation(s) {unknown}")
        for key, attr in edge_features.items():
            if attr.size(0) != self.edges[key].numel():
                raise ValueError(
                    f"edge_features[{key}] must have {self.edges[key].numel()} rows; got "
                    f"{list(attr.shape)}"
                )
        nodes_per_hop, edges_per_hop = None, None
        if level_sizes is not None and edge_index is not None:
            nodes_per_hop, edges_per_hop = self._per_hop(level_sizes, edge_index)
        return HeteroInput(
            x_dict={key: features[key] for key in self.node_types},
            edge_index_dict=dict(self.edge_index_dict),
            n_id_dict={key: _real_node(n_id[key]) for key in self.node_types},
            edge_attr_dict=dict(edge_features),
            num_sampled_nodes_dict=nodes_per_hop,
            num_sampled_edges_dict=edges_per_hop,
        )

    def _per_hop(
        self, level_sizes: Sequence[int], edge_index: Tensor
    ) -> tuple[dict[str, list[int]], dict[EdgeType, list[int]]]:
        """Each type's rows and each relation's edges (by their destination's hop) per hop."""
        hops = len(level_sizes)
        ends = np.cumsum(np.asarray(level_sizes, dtype=np.int64))
        hop = np.searchsorted(ends, np.arange(self.position.numel()), side="right")
        destination_hop = hop[edge_index[1].cpu().numpy()]
        nodes = _counts_per_hop(self.rows, hop, hops)
        edges = _counts_per_hop(self.edges, destination_hop, hops)
        return nodes, edges


def _counts_per_hop(
    parts: Mapping[Key, Tensor], hop: np.ndarray, hops: int
) -> dict[Key, list[int]]:
    """For each part (a type's rows, a relation's edges) how many of its entries lie at each
    hop, from each entry's ``hop``: one bincount for all parts."""
    keys = list(parts)
    kind = np.concatenate([np.full(parts[key].numel(), i) for i, key in enumerate(keys)])
    entries = np.concatenate([parts[key].cpu().numpy() for key in keys])
    counts = np.bincount(kind * hops + hop[entries], minlength=len(keys) * hops)
    return {key: counts[i * hops : (i + 1) * hops].tolist() for i, key in enumerate(keys)}


def take_rows(table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` with a zero row where ``index`` is negative (a boundary row's
    features): the one gather for node features per type and edge features per relation."""
    missing = index < 0
    if not bool(missing.any()):
        return table[index]
    rows = table[index.clamp(min=0)]
    return rows.masked_fill(missing.unsqueeze(-1), 0) if rows.dim() > 1 else rows


def inputs_from_hetero_data(data: HeteroData) -> HeteroInput:
    """A whole ``HeteroData`` as one input (a type without ``x`` is featureless: ``[n, 0]``),
    for full-graph forwards such as training and verification."""
    x_dict: dict[str, Tensor] = {}
    for key in data.node_types:
        store = data[key]
        x = store.get("x")
        x_dict[key] = x if isinstance(x, Tensor) else torch.empty(store.num_nodes, 0)
    return HeteroInput(
        x_dict=x_dict,
        edge_index_dict={key: data[key].edge_index for key in data.edge_types},
        n_id_dict={key: torch.arange(data[key].num_nodes) for key in data.node_types},
        edge_attr_dict={
            key: data[key].edge_attr for key in data.edge_types if "edge_attr" in data[key]
        },
    )


def _real_node(n_id: Tensor) -> Tensor:
    return n_id.clamp(min=0) if bool((n_id < 0).any()) else n_id


def _check_metadata(node_types: tuple[str, ...], edge_types: tuple[EdgeType, ...]) -> None:
    if not node_types or not edge_types:
        raise ValueError("a graph needs at least one node type and one edge type")
    for src, rel, dst in edge_types:
        if src not in node_types or dst not in node_types:
            raise ValueError(
                f"edge type ({src!r}, {rel!r}, {dst!r}) names a node type not in {list(node_types)}"
            )


def _check_range(name: str, index: np.ndarray, size: int) -> None:
    if index.size and (int(index.min()) < 0 or int(index.max()) >= size):
        raise ValueError(
            f"{name} must hold values in [0, {size}); got [{int(index.min())}, {int(index.max())}]"
        )


def _check_edge_ends(
    row_type: np.ndarray,
    edge_index: np.ndarray,
    edge_type: np.ndarray,
    node_types: tuple[str, ...],
    edge_types: tuple[EdgeType, ...],
) -> None:
    """Each edge runs from a row of its relation's source type to one of its destination type
    (a boundary row too: one per source type, since a row has one type)."""
    index = {key: i for i, key in enumerate(node_types)}
    ends = np.array([[index[src], index[dst]] for src, _, dst in edge_types])
    for side, name in ((0, "source"), (1, "destination")):
        wrong = row_type[edge_index[side]] != ends[edge_type, side]
        if wrong.any():
            first = int(np.flatnonzero(wrong)[0])
            relation = edge_types[int(edge_type[first])]
            raise ValueError(
                f"edge {first} of relation {relation} has a {name} row of type "
                f"{node_types[int(row_type[edge_index[side, first]])]!r}"
            )


def _split_positions(kind: np.ndarray, count: int) -> tuple[list[np.ndarray], np.ndarray]:
    """For each kind the ascending indices of its entries, and each entry's position among
    those of its kind (a stable sort of 16-bit kinds: numpy's radix sort)."""
    order = np.argsort(kind.astype(np.uint16), kind="stable")
    sizes = np.bincount(kind, minlength=count)
    starts = np.cumsum(sizes) - sizes
    position = np.empty(kind.size, dtype=np.int64)
    position[order] = np.arange(kind.size) - np.repeat(starts, sizes)
    return np.split(order, np.cumsum(sizes)[:-1]), position
