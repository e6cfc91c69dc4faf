"""Progress bars only on a terminal: a build log written to a file gets no ``\\r`` updates."""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from graph_assets.input.synthetic import generate_synthetic


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("progress") / "store"
    generate_synthetic(200, 800, path, feature_dim=8, num_classes=3)
    return path


def train_command(store: Path, out: Path, *extra: str) -> list[str]:
    """``python -m model train`` for a few epochs: a bar is drawn from the first one."""
    options = ["--hidden-dim", "8", "--epochs", "3", "--patience", "3", *extra]
    command = [sys.executable, "-m", "model", "train", "--store", str(store), "--out", str(out)]
    return command + options


def stderr_on_a_terminal(command: list[str]) -> bytes:
    """What ``command`` writes to stderr when stderr is a pseudo-terminal."""
    master, slave = pty.openpty()
    # A new pty is 0 columns wide, and tqdm draws nothing in 0 columns.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        process = subprocess.Popen(command, stderr=slave, stdout=subprocess.DEVNULL)
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError as error:  # EIO once the child has closed the terminal (Linux)
                if error.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0, b"".join(chunks)[-500:]
    finally:
        os.close(master)
    return b"".join(chunks)


def test_no_bar_when_stderr_is_a_file(store: Path, tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with log.open("wb") as stderr:
        subprocess.run(train_command(store, tmp_path / "m"), stderr=stderr, check=True)
    text = log.read_bytes()
    assert b"\r" not in text, f"carriage returns in a log file: {text[:300]!r}"
    assert b"train sage" not in text


def test_bar_on_a_terminal(store: Path, tmp_path: Path) -> None:
    output = stderr_on_a_terminal(train_command(store, tmp_path / "m"))
    assert b"train sage" in output and b"\r" in output


def test_quiet_hides_the_bar_on_a_terminal(store: Path, tmp_path: Path) -> None:
    output = stderr_on_a_terminal(train_command(store, tmp_path / "m", "--quiet"))
    assert b"train sage" not in output
