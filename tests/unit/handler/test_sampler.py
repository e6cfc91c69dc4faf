"""The sampler against a brute-force BFS reference on random graphs."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graph_assets.errors import SubgraphTooLarge
from handler.sampling.arrays import NumpyOps, TorchOps
from handler.sampling.sampler import NeighbourSampler, SampledSubgraph


def random_csc(num_nodes: int, num_edges: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random graph without self-loops or duplicate edges, as CSC (grouped by destination)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], axis=1), axis=0)  # sorted by dst, src
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=num_nodes), out=indptr[1:])
    return torch.from_numpy(indptr), torch.from_numpy(pairs[:, 1].copy())


def in_neighbours(indptr: torch.Tensor, indices: torch.Tensor, node: int) -> list[int]:
    return indices[int(indptr[node]) : int(indptr[node + 1])].tolist()


def reference_tree(
    indptr: torch.Tensor, indices: torch.Tensor, seeds: list[int], hops: int
) -> set[tuple[int, int, int, int]]:
    """Edges ((src, hop+1) -> (dst, hop)) of the full (node, hop) tree, by plain BFS."""
    edges = set()
    level = sorted(set(seeds))
    for hop in range(hops):
        found = set()
        for node in level:
            for source in in_neighbours(indptr, indices, node):
                edges.add((source, hop + 1, node, hop))
                found.add(source)
        level = sorted(found)
    return edges


def tree_edges(sub: SampledSubgraph) -> set[tuple[int, int, int, int]]:
    """The sampled edges as ((global src, hop), (global dst, hop)) tuples."""
    hop_of_row = torch.repeat_interleave(
        torch.arange(len(sub.level_sizes)), torch.tensor(sub.level_sizes)
    )
    src, dst = sub.edge_index
    return {
        (int(sub.node[s]), int(hop_of_row[s]), int(sub.node[d]), int(hop_of_row[d]))
        for s, d in zip(src.tolist(), dst.tolist(), strict=True)
    }


def in_edge_sets(sub: SampledSubgraph) -> dict[tuple[int, int], set[int]]:
    """(node, hop) -> the set of global in-neighbours the sampler chose for it."""
    chosen: dict[tuple[int, int], set[int]] = defaultdict(set)
    for source, _, target, hop in tree_edges(sub):
        chosen[(target, hop)].add(source)
    return chosen


def make_sampler(
    indptr, indices, fanouts, seed=0, max_nodes=10**9, max_edges=10**9, ops=None, overlay=None
):
    return NeighbourSampler(
        indptr, indices, fanouts, seed, 12345, max_nodes, max_edges, overlay=overlay, ops=ops
    )


BACKENDS = {"numpy": NumpyOps(), "torch": TorchOps(torch.device("cpu"))}


@settings(max_examples=25, deadline=None)
@given(
    nodes=st.integers(2, 60),
    edges=st.integers(0, 400),
    graph_seed=st.integers(0, 10**6),
    hops=st.integers(1, 3),
    data=st.data(),
)
def test_full_fanouts_equal_bfs_reference(nodes, edges, graph_seed, hops, data):
    indptr, indices = random_csc(nodes, edges, graph_seed)
    seeds = data.draw(st.lists(st.integers(0, nodes - 1), min_size=1, max_size=8, unique=True))
    sub = make_sampler(indptr, indices, [-1] * hops).sample(torch.tensor(seeds))
    assert sub.node[: sub.num_seeds].tolist() == seeds
    assert tree_edges(sub) == reference_tree(indptr, indices, seeds, hops)
    # every (node, hop) pair is one row: no duplicated rows within a level
    start = 0
    for size in sub.level_sizes:
        level = sub.node[start : start + size]
        assert level.unique().numel() == size
        start += size


@pytest.mark.parametrize("fanouts", [[3, 2], [1, 5, 2], [25, 10]])
def test_sampled_fanouts_are_subsets_with_the_right_counts(fanouts):
    indptr, indices = random_csc(300, 6000, seed=7)
    sub = make_sampler(indptr, indices, fanouts).sample(torch.tensor([0, 5, 17, 299]))
    chosen = in_edge_sets(sub)
    edges_per_row = torch.bincount(sub.edge_index[1], minlength=sub.num_nodes)
    start = 0
    for hop, size in enumerate(sub.level_sizes[:-1]):
        for row in range(start, start + size):
            node = int(sub.node[row])
            true_neighbours = set(in_neighbours(indptr, indices, node))
            expected = min(len(true_neighbours), fanouts[hop])
            assert int(edges_per_row[row]) == expected  # without replacement: no repeats
            assert chosen.get((node, hop), set()) <= true_neighbours
            assert len(chosen.get((node, hop), set())) == expected
        start += size
    # the last level is not expanded
    assert int(edges_per_row[start:].sum()) == 0


def test_same_request_same_sample_across_calls_and_batches():
    indptr, indices = random_csc(500, 8000, seed=3)
    sampler = make_sampler(indptr, indices, [4, 3])
    alone = in_edge_sets(sampler.sample(torch.tensor([11])))
    again = in_edge_sets(make_sampler(indptr, indices, [4, 3]).sample(torch.tensor([11])))
    assert alone == again
    batched = in_edge_sets(sampler.sample(torch.tensor([400, 11, 3, 250, 77])))
    for key, neighbours in alone.items():
        assert batched[key] == neighbours


def test_seed_and_graph_version_change_the_sample():
    indptr, indices = random_csc(200, 6000, seed=5)
    seeds = torch.arange(0, 200, 7)
    base = in_edge_sets(make_sampler(indptr, indices, [3, 3], seed=0).sample(seeds))
    other_seed = in_edge_sets(make_sampler(indptr, indices, [3, 3], seed=1).sample(seeds))
    other_graph = in_edge_sets(
        NeighbourSampler(indptr, indices, [3, 3], 0, 999, 10**9, 10**9).sample(seeds)
    )
    assert base != other_seed
    assert base != other_graph


def test_choices_are_spread_over_the_neighbourhood():
    """Each neighbour of a high in-degree node is picked about equally often across seeds."""
    num_neighbours, fanout, trials = 20, 5, 4000
    src = np.arange(1, num_neighbours + 1)
    # trials hubs 1000.. each with the same 20 in-neighbours
    hubs = np.arange(1000, 1000 + trials)
    indptr = np.zeros(1000 + trials + 1, dtype=np.int64)
    indptr[1001:] = np.arange(1, trials + 1) * num_neighbours
    indices = np.tile(src, trials)
    sampler = make_sampler(torch.from_numpy(indptr), torch.from_numpy(indices), [fanout])
    sub = sampler.sample(torch.from_numpy(hubs))
    picked = torch.bincount(sub.node[sub.edge_index[0]], minlength=num_neighbours + 1)[1:]
    expected = trials * fanout / num_neighbours
    assert picked.min() > 0.85 * expected and picked.max() < 1.15 * expected


def test_limits_raise_before_building():
    indptr, indices = random_csc(400, 8000, seed=9)
    sampler = make_sampler(indptr, indices, [-1, -1], max_nodes=50, max_edges=10**9)
    with pytest.raises(SubgraphTooLarge, match="limits are 50 nodes"):
        sampler.sample(torch.tensor([1, 2, 3]))
    sampler = make_sampler(indptr, indices, [-1, -1], max_nodes=10**9, max_edges=30)
    with pytest.raises(SubgraphTooLarge):
        sampler.sample(torch.tensor([1]))


@pytest.mark.parametrize("fanouts", [[0, 2], [-2]])
def test_bad_fanouts_are_refused(fanouts):
    indptr, indices = random_csc(10, 20, seed=1)
    with pytest.raises(ValueError, match="fanout"):
        make_sampler(indptr, indices, fanouts)


def test_no_hop_samples_the_seeds_alone():
    """A model without message passing: its ego-graph is its seeds, no edge."""
    indptr, indices = random_csc(10, 20, seed=1)
    sub = make_sampler(indptr, indices, []).sample(torch.tensor([7, 2]))
    assert sub.node.tolist() == [7, 2] and sub.level_sizes == (2,) and sub.num_seeds == 2
    assert tuple(sub.edge_index.shape) == (2, 0) and sub.edge.numel() == 0


def test_int32_structure_is_accepted():
    indptr, indices = random_csc(100, 1000, seed=2)
    wide = make_sampler(indptr, indices, [-1, 3]).sample(torch.tensor([4, 9]))
    narrow = make_sampler(indptr.int(), indices.int(), [-1, 3]).sample(torch.tensor([4, 9]))
    assert tree_edges(wide) == tree_edges(narrow)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sample_equals_cpu_sample():
    """Sampling on the GPU (torch) draws what sampling on the CPU (compiled hops) draws, rows
    and edges in the same order."""
    indptr, indices = random_csc(500, 8000, seed=4)
    seeds = torch.tensor([1, 50, 499])
    on_cpu = make_sampler(indptr, indices, [5, 3]).sample(seeds)
    on_gpu = make_sampler(indptr.cuda(), indices.cuda(), [5, 3]).sample(seeds)
    for name in ("node", "edge_index", "edge"):
        assert torch.equal(getattr(on_cpu, name), getattr(on_gpu, name).cpu()), name
    assert on_cpu.level_sizes == on_gpu.level_sizes


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_floyd_matches_the_sequential_algorithm(backend):
    """The batched fix-up of colliding draws gives exactly sequential Floyd's choice."""
    from handler.sampling.sampler import _GOLDEN, _LOW_63, _as_int64, _mix

    ops = BACKENDS[backend]
    indptr, indices = random_csc(50, 200, seed=5)
    sampler = make_sampler(indptr, indices, [7, 7], ops=ops)
    nodes = ops.arange(400)
    counts = 8 + nodes % 5  # barely more than the fanout: collisions on most rows
    fanout = 7
    for hop in (0, 1):
        chosen = sampler._floyd(nodes, hop, counts, fanout, 0)
        keys = _mix(nodes ^ sampler._base_key)
        for row in range(len(nodes)):
            picked: list[int] = []
            for step in range(fanout):
                limit = int(counts[row]) - fanout + step
                salt = _as_int64((hop * 4096 + step + 1) * _GOLDEN)
                draw = int(_mix(keys[row : row + 1] + salt)[0]) & _LOW_63
                candidate = draw % (limit + 1)
                picked.append(limit if candidate in picked else candidate)
            assert chosen[row].tolist() == picked
            assert len(set(picked)) == fanout and max(picked) < int(counts[row])


@settings(max_examples=30, deadline=None)
@given(
    nodes=st.integers(2, 80),
    edges=st.integers(0, 600),
    graph_seed=st.integers(0, 10**6),
    fanouts=st.lists(st.sampled_from([-1, 1, 2, 3, 5, 8]), min_size=1, max_size=3),
    sampling_seed=st.integers(0, 2**63 - 1),
    data=st.data(),
)
def test_numpy_and_torch_draw_the_same_subgraph(
    nodes, edges, graph_seed, fanouts, sampling_seed, data
):
    """CPU workers sample with numpy, GPU workers with torch: the same seeds must give the same
    rows and edges, bit for bit, or a node's answer would depend on the worker's device."""
    indptr, indices = random_csc(nodes, edges, graph_seed)
    seeds = torch.tensor(
        data.draw(st.lists(st.integers(0, nodes - 1), min_size=1, max_size=8, unique=True))
    )
    samples = [
        make_sampler(indptr, indices, fanouts, sampling_seed, ops=ops).sample(seeds)
        for ops in BACKENDS.values()
    ]
    first, second = samples
    assert torch.equal(first.node, second.node)
    assert torch.equal(first.edge_index, second.edge_index)
    assert first.level_sizes == second.level_sizes and first.num_seeds == second.num_seeds
    assert first.node.dtype == second.node.dtype == torch.int64
