"""scripts/serve.sh start, run in a copy of the repo with a fake torchserve and a fake curl that
record their command lines: the management key never appears on one (ps shows them to every
user), and TorchServe's temp dir is private."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MANAGEMENT_KEY = "management-key-5d1f0c"
RECORDS = """printf '%s\\n' "$0" "$@" >>"$FAKE_RECORDS/argv"
"""
FAKE_CURL = f"""#!/bin/sh
{RECORDS}cat >>"$FAKE_RECORDS/curl.stdin"
echo '[{{"modelName": "gnn", "workers": [{{"status": "READY"}}]}}]'
"""
FAKE_TORCHSERVE = f"""#!/bin/sh
{RECORDS}"""


def ports_in_use() -> list[int]:
    """serve.sh refuses to start while 127.0.0.1:8080-8082 are taken."""
    busy = []
    for port in (8080, 8081, 8082):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy


def write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A copy of the repo's serve.sh, with graph_assets, the venv's python and the fakes."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "serve.sh", root / "scripts" / "serve.sh")
    (root / "graph_assets").symlink_to(REPO / "graph_assets")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    write_script(bin_dir / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    write_script(bin_dir / "curl", FAKE_CURL)
    write_script(bin_dir / "torchserve", FAKE_TORCHSERVE)
    (root / ".serve").mkdir()
    # What TorchServe writes where it starts (the fake torchserve writes nothing).
    keys = {name: {"key": f"{name}-key"} for name in ("inference", "API")}
    keys["management"] = {"key": MANAGEMENT_KEY}
    (root / ".serve" / "key_file.json").write_text(json.dumps(keys))
    (tmp_path / "records").mkdir()
    return root


def start(repo: Path) -> subprocess.CompletedProcess[str]:
    busy = ports_in_use()
    if busy:
        pytest.skip(f"serve.sh needs 127.0.0.1 ports {busy} free")
    return subprocess.run(
        ["bash", str(repo / "scripts" / "serve.sh"), "start"],
        env={**os.environ, "FAKE_RECORDS": str(repo.parent / "records")},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_start_never_puts_the_management_key_on_a_command_line(repo):
    done = start(repo)
    assert done.returncode == 0, done.stderr
    assert "TorchServe is serving 'gnn'" in done.stdout
    argv = (repo.parent / "records" / "argv").read_text()
    assert "torchserve" in argv and "curl" in argv  # both fakes ran
    assert MANAGEMENT_KEY not in argv
    # The readiness check still authenticates: curl read the header from its stdin.
    curl_stdin = (repo.parent / "records" / "curl.stdin").read_text()
    assert f'header = "Authorization: Bearer {MANAGEMENT_KEY}"' in curl_stdin


def test_start_makes_the_temp_dir_private(repo):
    assert start(repo).returncode == 0
    assert stat.S_IMODE((repo / ".serve" / "tmp").stat().st_mode) == 0o700


def test_start_narrows_an_existing_temp_dir_to_0700(repo):
    (repo / ".serve" / "tmp").mkdir(mode=0o755)
    (repo / ".serve" / "tmp").chmod(0o755)  # what serve.sh made before
    assert start(repo).returncode == 0
    assert stat.S_IMODE((repo / ".serve" / "tmp").stat().st_mode) == 0o700


def test_start_refuses_a_temp_dir_others_can_write(repo):
    (repo / ".serve" / "tmp").mkdir()
    (repo / ".serve" / "tmp").chmod(0o777)
    done = start(repo)
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()  # one line, naming the directory and the problem
    assert line.startswith(f"serve.sh: {repo / '.serve' / 'tmp'} is writable by its group")
    assert not (repo.parent / "records" / "argv").exists()  # TorchServe was not started
