"""The handler's folders import one way, so that a prediction's path reads as a straight line:
protocol <- live <- sampling <- gpu <- pipeline <- graph <- explain <- tasks (settings below them
all, imported by any), and no two folders depend on each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HANDLER = Path(__file__).resolve().parents[3] / "handler"
LAYERS = ("protocol", "live", "sampling", "gpu", "pipeline", "graph", "explain", "tasks")
# What each folder may import of the handler, besides itself: settings and the layers below it.
ALLOWED = {folder: {"settings", *LAYERS[:index]} for index, folder in enumerate(LAYERS)}


def handler_imports(path: Path) -> set[str]:
    """The handler folders (or top-level modules) a module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("handler."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("handler.")}
    return found


def test_every_folder_has_its_layer() -> None:
    folders = {path.name for path in HANDLER.iterdir() if (path / "__init__.py").is_file()}
    assert folders == set(LAYERS)


@pytest.mark.parametrize("folder", LAYERS)
def test_a_folder_imports_only_the_layers_below_it(folder: str) -> None:
    wrong = {
        str(path.relative_to(HANDLER)): sorted(handler_imports(path) - ALLOWED[folder] - {folder})
        for path in (HANDLER / folder).rglob("*.py")
    }
    assert not {module: names for module, names in wrong.items() if names}


def test_settings_imports_nothing_of_the_handler() -> None:
    assert handler_imports(HANDLER / "settings.py") == set()
