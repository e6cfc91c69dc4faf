"""Synthetic graphs: sizes, IDs, homophily, learnable class signal, determinism, CSV variant."""

from pathlib import Path

import numpy as np
import pytest

from graph_assets import (
    GraphStore,
    generate_synthetic,
    open_store,
    read_graph_dir,
    write_store,
    write_synthetic_csv,
)

N, E, F, C = 3000, 30000, 16, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    path = tmp_path_factory.mktemp("syn") / "store"
    generate_synthetic(N, E, path, feature_dim=F, num_classes=C, seed=1)
    return open_store(path)


def test_sizes_and_ids(store: GraphStore) -> None:
    assert (store.num_nodes, store.feature_dim, store.num_classes) == (N, F, C)
    assert store.ids.tolist() == list(range(N))
    assert store.class_names is None
    stats = store.meta["stats"]
    assert stats["input_edges"] == E
    # Only self-loops and duplicates are missing, and with N=3000 they are rare.
    assert store.num_edges == E - stats["self_loops_dropped"] - stats["duplicate_edges_dropped"]
    assert 0.97 * E < store.num_edges <= E
    assert set(np.unique(store.labels).tolist()) == set(range(C))


def test_homophily_roughly_holds(store: GraphStore, tmp_path: Path) -> None:
    src, dst = store.edge_index()
    same = np.mean(store.labels[src] == store.labels[dst])
    # Drawn from the class w.p. 0.8, else uniform (and then same class w.p. 1/C).
    assert same == pytest.approx(0.8 + 0.2 / C, abs=0.02)
    generate_synthetic(N, E, tmp_path / "h0", feature_dim=F, num_classes=C, homophily=0.0)
    other = open_store(tmp_path / "h0")
    src, dst = other.edge_index()
    assert np.mean(other.labels[src] == other.labels[dst]) == pytest.approx(1 / C, abs=0.02)


def nearest_centroid_accuracy(features: np.ndarray, labels: np.ndarray) -> float:
    centroids = np.stack([features[labels == c].mean(axis=0) for c in range(C)])
    distances = ((features[:, None, :] - centroids[None]) ** 2).sum(axis=-1)
    return float(np.mean(distances.argmin(axis=1) == labels))


def test_features_carry_a_noisy_class_signal_that_neighbours_sharpen(store: GraphStore) -> None:
    features, labels = np.asarray(store.features), np.asarray(store.labels)
    alone = nearest_centroid_accuracy(features, labels)
    assert 0.3 < alone < 0.8  # chance is 1/8: a signal, but noisy enough that neighbours help
    src, dst = store.edge_index()
    summed = features.copy()
    np.add.at(summed, dst, features[src])
    mean = summed / (np.asarray(store.in_degree) + 1)[:, None]
    assert nearest_centroid_accuracy(mean, labels) > alone + 0.2


def test_same_seed_same_store(store: GraphStore, tmp_path: Path) -> None:
    again = generate_synthetic(N, E, tmp_path / "a", feature_dim=F, num_classes=C, seed=1)
    assert again["checksum"] == store.checksum
    other = generate_synthetic(N, E, tmp_path / "b", feature_dim=F, num_classes=C, seed=2)
    assert other["checksum"] != store.checksum


def test_csv_files_build_the_same_store(store: GraphStore, tmp_path: Path) -> None:
    write_synthetic_csv(N, E, tmp_path / "csv", feature_dim=F, num_classes=C, seed=1)
    header = (tmp_path / "csv" / "nodes.csv").read_text().splitlines()[0]
    assert header == "id," + ",".join(f"f{j}" for j in range(F)) + ",label"
    raw = read_graph_dir(tmp_path / "csv")
    meta = write_store(raw, tmp_path / "built", drop_self_loops=True, drop_duplicate_edges=True)
    assert meta["checksum"] == store.checksum


def test_class_names(tmp_path: Path) -> None:
    names = ["legit", "fraud"]
    meta = generate_synthetic(
        50, 100, tmp_path / "s", feature_dim=4, num_classes=2, class_names=names
    )
    assert meta["class_names"] == names
    write_synthetic_csv(50, 100, tmp_path / "csv", feature_dim=4, num_classes=2, class_names=names)
    raw = read_graph_dir(tmp_path / "csv")
    assert raw.class_names == ["fraud", "legit"]  # the build numbers names in sorted order
    direct = open_store(tmp_path / "s").labels
    assert [raw.class_names[k] for k in raw.labels] == [names[k] for k in direct]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_nodes": 0}, "num_nodes must be >= 1"),
        ({"homophily": 1.5}, r"homophily must be in \[0, 1\]"),
        ({"num_classes": 0}, "num_classes must be >= 1"),
        ({"class_names": ["a"]}, "class_names must be 2 distinct names"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"num_nodes": 10, "num_edges": 10, "num_classes": 2, "feature_dim": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        generate_synthetic(out_dir=tmp_path / "s", **args)
    assert not list(tmp_path.iterdir())
