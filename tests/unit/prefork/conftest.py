from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .standins import write_worker


@pytest.fixture(autouse=True)
def short_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TMPDIR for the zygote's socket directory: a socket path holds at most 107 bytes, which a
    path under pytest's ``tmp_path`` can exceed."""
    path = Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    """The stand-in TorchServe's worker script, in a ``ts`` package under ``tmp_path``."""
    (tmp_path / "ts").mkdir()
    (tmp_path / "ts" / "__init__.py").write_text("")
    return write_worker(tmp_path / "ts" / "model_service_worker.py")
