"""What a pair's two ends are in a link archive, and who a source's neighbours are.

On a graph of one type both ends are its nodes, top-k searches every node and a node's
neighbours are its in- and out-neighbours. On a graph of several node types the archive
predicts one relation ``src__relation__dst``: a pair is ``[src node, dst node]``, top-k searches
the destination type, and a source's neighbours are those it has on that relation, in both
directions where the reverse relation (``rev_<relation>``) exists. The one-type case is that
rule with the graph's one relation, so the engine asks this class and never which case it is in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graph_assets.graph_view import GraphView
from graph_assets.remote import RemoteStore
from graph_assets.schema import EdgeType
from graph_assets.stored.store import GraphStore
from model.link_assets import LinkAssets


@dataclass(frozen=True)
class LinkEnds:
    """The ends of the relation a link archive predicts.

    Attributes:
        src_type, dst_type: node types of a pair's source and destination.
        sources: ``(start, stop)``, the global range of the source type.
        candidates: ``(start, stop)``, the global range of the destination type: top-k's
            candidates.
        in_relations: relations whose in-edges of a source are its neighbours on the
            relation: the relation itself when it joins one type, its reverse where it exists.
        typed: the graph has several node types or relations (lookups name the type).
        relation: the relation's name (``src__relation__dst``), for messages and describe.
    """

    src_type: str
    dst_type: str
    sources: tuple[int, int]
    candidates: tuple[int, int]
    in_relations: tuple[int, ...]
    typed: bool
    relation: str

    @classmethod
    def of(
        cls, store: GraphStore | RemoteStore, predicted: tuple[str, str, str] | None
    ) -> LinkEnds:
        """The ends of ``predicted``, the relation a typed graph's link model predicts (the
        contract's ``edge_type``), or (None) of a graph of one type's one relation."""
        schema = store.schema
        relation = schema.relations[0].edge_type
        if predicted is not None:
            relation = EdgeType(*predicted)
        names = schema.edge_type_names
        inward = [relation.name] if relation.src == relation.dst else []
        inward.append(relation.reverse().name)
        src, dst = schema.node_type(relation.src), schema.node_type(relation.dst)
        return cls(
            src_type=relation.src,
            dst_type=relation.dst,
            sources=(src.offset, src.stop),
            candidates=(dst.offset, dst.stop),
            in_relations=tuple(names.index(name) for name in inward if name in names),
            typed=not schema.is_homogeneous,
            relation=relation.name,
        )

    @property
    def hint(self) -> str:
        """What a pair is, for a 404 of an ID of the wrong type."""
        return f"a pair is [{self.src_type} ID, {self.dst_type} ID] on {self.relation}"

    def neighbours(self, graph: GraphView, assets: LinkAssets, node: int) -> list[np.ndarray]:
        """``node``'s neighbours on the relation: its out-neighbours (``link/``'s out-lists hold
        the relation's edges only) and its in-neighbours on :attr:`in_relations`, read through
        the graph view (one read, whichever graph source serves)."""
        lists = graph.in_lists(np.array([node], dtype=np.int64))
        sources = lists.indices[np.isin(lists.relations, self.in_relations)]
        out = assets.out_indices[assets.out_indptr[node] : assets.out_indptr[node + 1]]
        return [sources, np.asarray(out)]
