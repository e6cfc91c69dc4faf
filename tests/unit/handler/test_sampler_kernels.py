"""The compiled hops (handler.sampling.sampler_kernels) draw exactly what the vectorised numpy steps
draw, bit for bit, in every case the sampler supports: all neighbours (-1), lists no longer
than the fanout, self-loops and parallel edges, int32 and int64 structure, a boundary, typed
relations, live updates, a graph read through its view, and the limits. They are compiled when
a sampler is built, never on a request, and work where numba has nowhere to cache them and in a
worker forked from the pre-fork zygote, which started numba."""

from __future__ import annotations

import contextlib
import os
import random
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graph_assets import GraphStore
from graph_assets.errors import SubgraphTooLarge
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.sampling import sampler_kernels
from handler.sampling.arrays import NumpyOps
from handler.sampling.sampler import NeighbourSampler, SampledSubgraph, sampler_for
from handler.settings import ServingSettings
from tests.live_reference import live_ids, random_update
from tests.typed_graphs import fraud_store
from tests.typed_live_reference import random_typed_update

JIT = sampler_kernels._jit()
SOURCE = Path(sampler_kernels.__file__).with_name("sampler_jit.py")
KERNELS = (JIT.draw, JIT.csc_draw, JIT.relabel)


@contextlib.contextmanager
def compiling_refused() -> Iterator[None]:
    """Any call of a kernel that would need compiling (or loading from the cache) raises."""
    for kernel in KERNELS:
        kernel.disable_compile()
    try:
        yield
    finally:
        for kernel in KERNELS:
            kernel.disable_compile(False)


def multigraph_csc(
    num_nodes: int, num_edges: int, seed: int, dtype: type = np.int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random graph as CSC with its self-loops and parallel edges kept, as stores keep them."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    loops = rng.random(num_edges) < 0.1
    src[loops] = dst[loops]
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=dtype)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return torch.from_numpy(indptr), torch.from_numpy(src[order].astype(dtype))


def reference(sampler: NeighbourSampler) -> NeighbourSampler:
    """The same sampler with the vectorised numpy steps."""
    return NeighbourSampler(
        sampler.indptr,
        sampler.indices,
        sampler.fanouts,
        sampler._seed,
        sampler._graph_key,
        sampler.max_nodes,
        sampler.max_edges,
        overlay=sampler.overlay,
        boundary=sampler.boundary,
        ops=NumpyOps(fused=False),
        relations=sampler.relations,
        view=sampler.view,
    )


def assert_identical(fused: SampledSubgraph, vectorised: SampledSubgraph) -> None:
    for name in ("node", "edge_index", "edge"):
        mine, theirs = getattr(fused, name), getattr(vectorised, name)
        assert mine.dtype == theirs.dtype == torch.int64, name
        assert torch.equal(mine, theirs), name
    assert fused.level_sizes == vectorised.level_sizes
    assert (fused.num_seeds, fused.boundary) == (vectorised.num_seeds, vectorised.boundary)


def assert_same_draws(sampler: NeighbourSampler, seeds: torch.Tensor) -> SampledSubgraph:
    """The fused sample equals the vectorised one, and needed no compiling on the request."""
    assert sampler.ops.fused
    with compiling_refused():
        fused = sampler.sample(seeds)
    assert_identical(fused, reference(sampler).sample(seeds))
    return fused


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 60),
    edges=st.integers(0, 600),
    graph_seed=st.integers(0, 10**6),
    fanouts=st.lists(st.sampled_from([-1, 1, 2, 3, 5, 8, 40]), min_size=1, max_size=3),
    sampling_seed=st.integers(0, 2**63 - 1),
    boundary=st.booleans(),
    narrow=st.booleans(),
    data=st.data(),
)
def test_kernels_draw_what_the_vectorised_steps_draw(
    nodes, edges, graph_seed, fanouts, sampling_seed, boundary, narrow, data
):
    indptr, indices = multigraph_csc(nodes, edges, graph_seed, np.int32 if narrow else np.int64)
    seeds = data.draw(st.lists(st.integers(0, nodes - 1), min_size=1, max_size=8, unique=True))
    sampler = NeighbourSampler(
        indptr, indices, fanouts, sampling_seed, graph_seed, 10**9, 10**9, boundary=boundary
    )
    assert_same_draws(sampler, torch.tensor(sorted(seeds)))


def test_high_degree_nodes_collide_and_match():
    """Lists barely longer than the fanout (most of Floyd's draws collide) and much longer."""
    degrees = np.array([9, 10, 11, 12, 30, 200, 5000] * 20)
    indptr = np.zeros(len(degrees) + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    indices = np.random.default_rng(1).integers(0, len(degrees), int(indptr[-1]))
    sampler = NeighbourSampler(
        torch.from_numpy(indptr), torch.from_numpy(indices), [10, 10], 3, 4, 10**9, 10**9
    )
    sub = assert_same_draws(sampler, torch.arange(len(degrees)))
    assert sub.num_edges > 10 * len(degrees)


@pytest.mark.parametrize(("max_nodes", "max_edges"), [(5, 10**9), (10**9, 7), (40, 60), (1, 1)])
@pytest.mark.parametrize("boundary", [False, True])
def test_limits_raise_what_the_vectorised_steps_raise(max_nodes, max_edges, boundary):
    indptr, indices = multigraph_csc(50, 900, seed=2)
    fused = NeighbourSampler(
        indptr, indices, [4, -1], 0, 1, max_nodes, max_edges, boundary=boundary
    )
    seeds = torch.tensor([0, 7, 30])
    with pytest.raises(SubgraphTooLarge) as raised:
        fused.sample(seeds)
    with pytest.raises(SubgraphTooLarge) as expected:
        reference(fused).sample(seeds)
    assert str(raised.value) == str(expected.value)


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed") / "store", 120, 20, 50, 500, seed=4)


TYPED_SETTINGS = [
    {"fanouts": [-1, -1]},
    {"fanouts": [2, 3], "relation_fanouts": {"merchant__rev_pays__user": [1, -1]}},
    {"fanouts": [1, 1]},
]


@pytest.mark.parametrize("config", TYPED_SETTINGS)
@pytest.mark.parametrize("boundary", [False, True])
@pytest.mark.parametrize("through_view", [False, True])
def test_typed_relations_match(typed_store, config, boundary, through_view):
    """Each relation's segments with its own fanout, from the mapped arrays or, as a remote
    store is read, from one read of the in-lists per hop."""
    sampler = sampler_for(
        typed_store,
        ServingSettings.from_yaml_section(config),
        torch.device("cpu"),
        boundary=boundary,
    )
    if through_view:
        sampler = view_sampler(sampler, typed_store)
    for seeds in ([0], [3, 50, 119], list(range(0, 120, 3))):
        assert_same_draws(sampler, torch.tensor(seeds))


def view_sampler(sampler: NeighbourSampler, store: GraphStore) -> NeighbourSampler:
    """``sampler`` reading its in-lists through the store's graph view, as from Redis."""
    empty = torch.empty(0, dtype=torch.int64)
    return NeighbourSampler(
        empty,
        empty,
        sampler.fanouts,
        sampler._seed,
        sampler._graph_key,
        sampler.max_nodes,
        sampler.max_edges,
        boundary=sampler.boundary,
        relations=sampler.relations,
        view=store,
    )


@pytest.mark.parametrize("fanouts", [[2, 3], [-1, 2]])
@pytest.mark.parametrize("boundary", [False, True])
def test_live_updates_match(int_store, tmp_path, fanouts, boundary):
    """Frontiers mixing changed in-lists (read from the overlay) and stored ones, new nodes,
    added self-loops and parallel edges."""
    live = LiveGraph(int_store, tmp_path / "updates.log")
    rng, counter = random.Random(5), [0]
    for _ in range(60):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    settings = ServingSettings.from_yaml_section({"fanouts": fanouts})
    sampler = sampler_for(int_store, settings, torch.device("cpu"), live.overlay, boundary)
    nodes = np.unique(live.overlay.lookup(live_ids(live)))
    for size in (1, 5, len(nodes)):
        assert_same_draws(sampler, torch.from_numpy(nodes[:size]))
    assert_same_draws(view_sampler(sampler, int_store), torch.from_numpy(nodes[:20]))


def test_typed_live_updates_match(typed_store, tmp_path):
    live = LiveGraph(typed_store, tmp_path / "updates.log")
    rng, counter = random.Random(2), [0]
    for _ in range(60):
        live.update(UpdateRequest(random_typed_update(rng, live, counter)))
    settings = ServingSettings.from_yaml_section({"fanouts": [2, 2]})
    sampler = sampler_for(typed_store, settings, torch.device("cpu"), live.overlay, True)
    users = np.flatnonzero(live.overlay.types_of(np.arange(live.overlay.num_nodes)) == 0)
    kept = users[live.overlay.lookup(live.overlay.external_ids(users)) >= 0]
    for size in (1, 7, len(kept)):
        assert_same_draws(sampler, torch.from_numpy(kept[:size]))


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.integers(0, 2**62), max_size=300)
    | st.lists(st.integers(0, 40), max_size=3000)
)
def test_sorted_order_sorts(values):
    array = np.array(values, dtype=np.int64)
    order = JIT.sorted_order(array)
    assert sorted(order.tolist()) == list(range(len(values)))
    assert array[order].tolist() == sorted(values)


def test_building_a_sampler_compiles_its_kernels():
    """int64 pointers and int32 sources (a store of 2^31 edges or more): a pair no other test
    samples, so nothing compiled them before this sampler was built."""
    indptr, _ = multigraph_csc(30, 200, seed=1)
    indices = multigraph_csc(30, 200, seed=1, dtype=np.int32)[1]
    sampler = NeighbourSampler(indptr, indices, [3, 2], 0, 1, 10**9, 10**9)
    with compiling_refused():
        assert sampler.sample(torch.tensor([0, 4])).num_edges > 0


def test_kernels_load_from_a_private_copy_that_outlives_the_archive():
    """Numba's cache is keyed on the kernels' path: a copy named by their source's hash, in a
    directory private to this user, is the same path at every start of every archive."""
    copy = Path(JIT.__file__)
    assert copy.read_bytes() == SOURCE.read_bytes()
    cache = copy.parent.parent
    assert cache == sampler_kernels._cache_root()
    assert cache.name == sampler_kernels.CACHE
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_the_cache_is_the_users_and_the_temp_dirs_when_that_is_unsafe(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    assert sampler_kernels._cache_root() == tmp_path / "user" / sampler_kernels.CACHE
    shared = tmp_path / "shared"
    (shared / sampler_kernels.CACHE).mkdir(parents=True, mode=0o777)
    (shared / sampler_kernels.CACHE).chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    assert sampler_kernels._cache_root() == tmp_path / "temp" / sampler_kernels.CACHE


def test_an_unsafe_cache_directory_loads_the_kernels_in_place(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    (shared / sampler_kernels.CACHE).mkdir(parents=True, mode=0o777)
    (shared / sampler_kernels.CACHE).chmod(0o777)  # another user could plant cached code
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    monkeypatch.setitem(sys.modules, JIT.__name__, JIT)  # restored after this load's
    jit = sampler_kernels._jit.__wrapped__()
    assert Path(jit.__file__) == SOURCE
    assert "loaded in place" in caplog.text


def test_no_cache_location_compiles_in_memory(monkeypatch):
    """Read-only code and no writable cache directory: the kernels still compile."""
    monkeypatch.setattr(numba.config, "CACHE_LOCATOR_CLASSES", "IPythonCacheLocator")

    def double(x: int) -> int:
        return 2 * x

    kernel = JIT.compiled(double)
    assert kernel(21) == 42
    assert type(kernel._cache).__name__ == "NullCache"


FORKED_AFTER_NUMBA = """
import os, sys
import numpy as np
import gnnserve_prefork.numba_ready  # what the pre-fork zygote imports before forking
child = os.fork()
if child == 0:
    from handler.sampling import sampler_kernels
    sampler_kernels.warm(np.dtype(np.int64), np.dtype(np.int32), False)
    drawn = sampler_kernels.draw_csc(
        np.array([0, 3]), np.array([5, 6, 7], dtype=np.int32), np.array([0]), np.array([0]),
        -1, 0, 0, np.zeros(0, dtype=np.int64), 10,
    )
    os._exit(0 if drawn[1].tolist() == [5, 6, 7] else 3)
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_kernels_run_in_a_worker_forked_after_numba_started():
    """A pre-forked worker: forked from a zygote that imported numba and compiled once, it
    compiles (or loads) and runs the kernels itself."""
    root = Path(__file__).resolve().parents[3]
    path = os.pathsep.join([str(root), str(root / "prefork")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", FORKED_AFTER_NUMBA], env=env, timeout=120)
    assert done.returncode == 0
