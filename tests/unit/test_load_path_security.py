"""No pickle on the load path: the code packed into an archive never unpickles anything.

An archive's graph, weights and configs may come from anyone who can write to the model store;
loading them must never run code. This scans every module that build_mar.sh packs (so a new
module is covered the day it lands): no pickle-family imports, ``np.load`` always with
``allow_pickle=False``, ``torch.load`` always with ``weights_only=True``, no ``yaml.load``,
``eval``, ``exec`` or TorchScript loading. Then it checks that the loaders really refuse pickles.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import StoreError, generate_synthetic, open_store
from model.export import load_model

ROOT = Path(__file__).resolve().parents[2]
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}
PICKLE_MODULES |= {"marshal", "copyreg"}


def packed_packages() -> list[str]:
    """The packages build_mar.sh copies into every archive (its `for package in ...` loop)."""
    script = (ROOT / "build_mar.sh").read_text()
    match = re.search(r"^for package in ([\w ]+); do", script, re.MULTILINE)
    assert match, "build_mar.sh no longer lists the packages it packs; update this test"
    return match.group(1).split()


def packed_modules() -> list[Path]:
    return sorted(p for package in packed_packages() for p in (ROOT / package).rglob("*.py"))


def dotted(node: ast.AST) -> str:
    """``np.load`` for the expression ``np.load`` (best effort, for call targets)."""
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


def keyword_is(call: ast.Call, name: str, value: object) -> bool:
    return any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value
        for k in call.keywords
    )


def problems_in(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    relative = path.relative_to(root)  # once: per node it was most of this test's 8 s
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        found += [f"{where}: imports {n}" for n in names if n in PICKLE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        target = dotted(node.func)
        if target in ("np.load", "numpy.load") and not keyword_is(node, "allow_pickle", False):
            found.append(f"{where}: {target} without allow_pickle=False")
        if target == "torch.load" and not keyword_is(node, "weights_only", True):
            found.append(f"{where}: torch.load without weights_only=True")
        if target in ("yaml.load", "yaml.unsafe_load", "yaml.full_load"):
            found.append(f"{where}: {target} (use yaml.safe_load)")
        if target in ("eval", "exec", "torch.jit.load", "pd.read_pickle", "pandas.read_pickle"):
            found.append(f"{where}: {target}")
    return found


def test_the_scan_covers_every_packed_package():
    assert packed_packages() == ["graph_assets", "model", "handler"]
    assert len(packed_modules()) >= 15


def test_no_pickle_on_the_load_path():
    problems = [problem for path in packed_modules() for problem in problems_in(path)]
    assert not problems, "\n".join(problems)


def test_the_scanner_catches_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom dill import loads\nimport numpy as np\nimport torch\nimport yaml\n"
        "np.load('a.npy')\nnp.load('a.npy', allow_pickle=True)\ntorch.load('m.pt')\n"
        "torch.load('m.pt', weights_only=False)\nyaml.load(s)\neval('1')\n"
    )
    assert len(problems_in(bad, root=tmp_path)) == 8


class Boom:
    """Unpickling it would run code: the loaders must refuse it before that can happen."""

    def __reduce__(self):
        return (Path.touch, (Path("/nonexistent-dir/should-not-exist"),))


def test_an_object_array_in_a_store_is_refused(tmp_path):
    store = tmp_path / "store"
    generate_synthetic(50, 200, store, feature_dim=4, num_classes=2)
    with (store / "labels.npy").open("wb") as f:
        np.save(f, np.array([Boom()] * 50, dtype=object), allow_pickle=True)
    meta = json.loads((store / "meta.json").read_text())
    meta["files"]["labels.npy"]["bytes"] = (store / "labels.npy").stat().st_size
    (store / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"labels\.npy: cannot read it as a \.npy array"):
        open_store(store, verify_checksum=False)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickled_object_in_the_weights_is_refused(tmp_path):
    (tmp_path / "model_config.json").write_text(json.dumps({"in_dim": 4, "out_dim": 2}))
    torch.save({"weight": Boom()}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="holds objects other than tensors"):
        load_model(tmp_path)
    (tmp_path / "model.pt").write_bytes(pickle.dumps({"weight": Boom()}))
    with pytest.raises(ValueError, match="holds objects other than tensors"):
        load_model(tmp_path)
