"""The handler's folders import one way, so that a prediction's path reads as a straight line:
protocol <- live <- sampling <- gpu <- pipeline <- graph <- explain <- tasks (settings below them
all, imported by any), and no two folders depend on each other. The live graph's domain errors
(``live/errors.py``) import nothing of the handler and sit below them all too: the error table
in ``protocol`` maps them to statuses, as it maps graph_assets' own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HANDLER = Path(__file__).resolve().parents[3] / "handler"
LAYERS = ("protocol", "live", "sampling", "gpu", "pipeline", "graph", "explain", "tasks")
# What each folder may import of the handler, besides itself: settings and the layers below it.
ALLOWED = {folder: {"settings", *LAYERS[:index]} for index, folder in enumerate(LAYERS)}
LEAVES = {"live.errors"}  # modules any folder may import: they import nothing of the handler


def handler_imports(path: Path) -> set[str]:
    """The handler folders (or top-level modules, or leaves) a module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("handler."):
            module = node.module.removeprefix("handler.")
            found.add(module if module in LEAVES else module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("handler.")}
    return found


def test_every_folder_has_its_layer() -> None:
    folders = {path.name for path in HANDLER.iterdir() if (path / "__init__.py").is_file()}
    assert folders == set(LAYERS)


@pytest.mark.parametrize("folder", LAYERS)
def test_a_folder_imports_only_the_layers_below_it(folder: str) -> None:
    wrong = {
        str(path.relative_to(HANDLER)): sorted(
            handler_imports(path) - ALLOWED[folder] - LEAVES - {folder}
        )
        for path in (HANDLER / folder).rglob("*.py")
    }
    assert not {module: names for module, names in wrong.items() if names}


def test_settings_imports_nothing_of_the_handler() -> None:
    assert handler_imports(HANDLER / "settings.py") == set()


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_a_leaf_imports_nothing_of_the_handler(leaf: str) -> None:
    assert handler_imports(HANDLER / (leaf.replace(".", "/") + ".py")) == set()
