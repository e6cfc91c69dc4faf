"""Who can reach the zygote and what it runs: a socket in a directory private to the serving
user, the peer's uid checked by both ends, and nothing forked but TorchServe's worker script
with the arguments TorchServe gives it."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gnnserve_prefork import launcher
from gnnserve_prefork.protocol import LineReader, Refused, send_request, zygote_address
from gnnserve_prefork.zygote import Zygote, _first_zygote, accept, check_worker_argv, worker_script
from ts.arg_parser import ArgParser

from .standins import (
    TS_ARGS,
    launcher_and_worker,
    launcher_pid,
    reported,
    run_frontend,
    start_frontend,
    write_worker,
    zygote_log,
)


def own_socket_dir(base: Path) -> Path:
    return base / f"gnnserve-prefork-{os.getuid()}"


# -- the rendezvous: a socket file in a directory only this user can enter ---------------------


def test_the_zygote_socket_is_a_file_in_a_directory_private_to_this_user(
    short_tmpdir: Path,
) -> None:
    address = zygote_address(1234)
    directory = own_socket_dir(short_tmpdir)
    assert address == str(directory / "1234.sock")
    info = directory.lstat()
    assert stat.S_ISDIR(info.st_mode)
    assert info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) == 0o700


def _open_to_others(directory: Path) -> None:
    directory.mkdir()
    directory.chmod(0o755)


def _a_symbolic_link(directory: Path) -> None:
    target = directory.with_name("elsewhere")
    target.mkdir(mode=0o700)
    directory.symlink_to(target)


def _a_file(directory: Path) -> None:
    directory.write_text("")


@pytest.mark.parametrize(
    ("spoil", "complaint"),
    [
        (_open_to_others, "has mode 0755, not 0700"),
        (_a_symbolic_link, "is not a directory (or is a symbolic link)"),
        (_a_file, "is not a directory"),
    ],
)
def test_a_socket_directory_that_is_not_private_is_refused(
    short_tmpdir: Path, spoil: Callable[[Path], None], complaint: str
) -> None:
    spoil(own_socket_dir(short_tmpdir))
    with pytest.raises(Refused, match=re.escape(complaint)):
        zygote_address(1234)


def test_a_socket_directory_owned_by_another_user_is_refused(
    short_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another user who created the directory first in a shared /tmp leaves us with. The
    test plays it the other way round: the directory is ours, the uid we claim is not."""
    owner, claimed = os.getuid(), os.getuid() + 1
    (short_tmpdir / f"gnnserve-prefork-{claimed}").mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: claimed)
    with pytest.raises(Refused, match=f"is owned by uid {owner}, not {claimed}"):
        zygote_address(1234)


def test_a_symbolic_link_above_the_socket_directory_is_refused(
    short_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = short_tmpdir / "real"
    real.mkdir()
    (short_tmpdir / "link").symlink_to(real)
    monkeypatch.setenv("TMPDIR", str(short_tmpdir / "link"))
    with pytest.raises(Refused, match=r"parent .*/link is a symbolic link"):
        zygote_address(1234)
    assert not any(real.iterdir())  # nothing was created through the link


def test_a_socket_path_over_the_kernel_limit_is_refused(
    short_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = short_tmpdir / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    with pytest.raises(Refused, match="longer than 107 bytes"):
        zygote_address(1234)


def test_a_socket_directory_open_to_others_leaves_a_plain_worker(
    tmp_path: Path, worker_script: Path, short_tmpdir: Path
) -> None:
    directory = own_socket_dir(short_tmpdir)
    directory.mkdir()
    directory.chmod(0o777)
    result = run_frontend(tmp_path, worker_script, "exit 0")
    assert result.returncode == 0
    assert reported(result.stdout)["pid"] == launcher_pid(result.stdout)
    assert (
        f"gnnserve prefork: refused: the socket directory {directory} has mode 0777, not 0700; "
        "this worker starts as a plain interpreter"
    ) in result.stderr
    assert not (tmp_path / "logs" / "gnnserve_prefork.log").exists()  # no zygote was started


def test_a_socket_left_by_a_killed_zygote_is_replaced_and_the_last_one_cleans_up(
    short_tmpdir: Path,
) -> None:
    address = zygote_address(1234)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(address)  # the file stays after the socket is closed, as after a SIGKILL
    with _first_zygote(address) as lock:
        assert lock is not None
        assert not os.path.exists(address)  # removed under the lock: ready for a fresh bind
        with _first_zygote(address) as second:
            assert second is None  # a zygote started in a race leaves the first one alone
            assert os.path.exists(f"{address}.lock")
    assert os.listdir(own_socket_dir(short_tmpdir)) == []


# -- the peer's uid, checked by both ends -------------------------------------------------------


@pytest.fixture
def listener(short_tmpdir: Path) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(short_tmpdir / "zygote.sock"))
        sock.listen(1)
        yield sock


def test_the_launcher_refuses_a_zygote_of_another_uid(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener runs as us; the launcher is made to believe it runs as the next uid."""
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    with pytest.raises(Refused) as refusal:
        launcher._try_connect(listener.getsockname())
    assert str(refusal.value) == f"the zygote (pid {os.getpid()}) runs as uid {uid}, not {uid + 1}"


def test_the_zygote_refuses_a_launcher_of_another_uid(
    listener: socket.socket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    uid = os.getuid()
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer,
        (tmp_path / "lock").open("ab") as lock,
    ):
        peer.connect(listener.getsockname())
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
        with caplog.at_level(logging.WARNING, logger="gnnserve_prefork"):
            accept(Zygote(listener, lock, "/nonexistent/ts/model_service_worker.py"), {})
        complaint = f"the launcher (pid {os.getpid()}) runs as uid {uid}, not {uid + 1}"
        assert LineReader(peer).next() == {"error": complaint}
        assert caplog.messages == [f"refused a launcher: {complaint}"]


# -- what a forked worker runs: TorchServe's worker script, as TorchServe starts it -------------


def ask_the_zygote(frontend_pid: int, argv: list[str], cwd: Path) -> dict | None:
    """What a same-uid process that reaches the zygote's socket is answered."""
    alive_read, alive_write = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(zygote_address(frontend_pid))
            request = {"argv": argv, "env": dict(os.environ), "cwd": str(cwd), "path": []}
            send_request(sock, request, [0, 1, 2, alive_read])
            sock.settimeout(30)
            return LineReader(sock).next()
    finally:
        os.close(alive_read)
        os.close(alive_write)


@pytest.mark.parametrize("how", ["another script", "extra arguments"])
def test_a_same_uid_peer_cannot_make_the_zygote_run_other_code(
    tmp_path: Path, worker_script: Path, how: str
) -> None:
    marker = tmp_path / "ran"
    payload = tmp_path / "payload.py"
    payload.write_text(f"open({str(marker)!r}, 'w').close()\n")
    argv = {
        "another script": [str(payload)],
        "extra arguments": [str(worker_script), *TS_ARGS, "--and-more"],
    }[how]
    frontend = start_frontend(tmp_path, worker_script, "sleep")
    try:
        launcher_and_worker(frontend)  # the zygote is serving
        answer = ask_the_zygote(frontend.pid, argv, tmp_path)
        assert answer is not None and "error" in answer, answer
        assert not marker.exists()
        log = zygote_log(tmp_path)
        assert log.count("forked worker") == 1  # the frontend's own worker only
        assert "refused a launcher: pid" in log
    finally:
        frontend.kill()
        frontend.wait()


def test_a_worker_script_that_is_not_torchserves_starts_as_a_plain_worker(
    tmp_path: Path, worker_script: Path
) -> None:
    """The launcher hands over any ``model_service_worker.py``; the zygote refuses it and the
    launcher goes on as a plain worker."""
    other = write_worker(tmp_path / "other" / "model_service_worker.py")
    result = run_frontend(tmp_path, other, "exit 0")
    assert result.returncode == 0
    assert reported(result.stdout)["pid"] == launcher_pid(result.stdout)
    assert "gnnserve prefork: refused: the zygote refused this worker: pid " in result.stderr
    assert f"is not TorchServe's worker script {worker_script}" in zygote_log(tmp_path)


TCP_ARGS = ["--sock-type", "tcp", "--port", "9000", "--metrics-config", "/m.yaml"]


@pytest.mark.parametrize("args", [TS_ARGS, [*TS_ARGS, "--async"], TCP_ARGS, [*TCP_ARGS, "--async"]])
def test_torchserves_worker_command_lines_are_accepted(
    worker_script: Path, tmp_path: Path, args: list[str]
) -> None:
    ArgParser.model_service_worker_args().parse_args(args)  # what TorchServe's worker parses
    script = os.path.realpath(worker_script)
    check_worker_argv([str(worker_script), *args], script)
    (tmp_path / "link.py").symlink_to(worker_script)
    check_worker_argv([str(tmp_path / "link.py"), *args], script)  # compared by real path


def _replace(args: list[str], index: int, value: str) -> list[str]:
    return [*args[:index], value, *args[index + 1 :]]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["SCRIPT"],
        ["OTHER", *TS_ARGS],
        ["ts/model_service_worker.py", *TS_ARGS],  # relative: not what the frontend passes
        ["SCRIPT", *TS_ARGS, "--and-more"],
        ["SCRIPT", *TS_ARGS[:4]],
        ["SCRIPT", "--async", *TS_ARGS],
        ["SCRIPT", *_replace(TS_ARGS, 1, "tcp")],  # tcp with --sock-name
        ["SCRIPT", *_replace(TCP_ARGS, 3, "9000x")],
        ["SCRIPT", *_replace(TS_ARGS, 3, "-c")],
        ["SCRIPT", *_replace(TS_ARGS, 5, "")],
        ["SCRIPT", *TS_ARGS[2:4], *TS_ARGS[:2], *TS_ARGS[4:]],
    ],
)
def test_every_other_command_line_is_refused(
    worker_script: Path, tmp_path: Path, argv: list[str]
) -> None:
    other = write_worker(tmp_path / "other" / "model_service_worker.py")
    names = {"SCRIPT": str(worker_script), "OTHER": str(other)}
    with pytest.raises(Refused):
        check_worker_argv([names.get(arg, arg) for arg in argv], os.path.realpath(worker_script))


def test_the_script_allowed_is_the_installed_torchserves_worker() -> None:
    """The path the frontend passes: ``<ts home>/ts/model_service_worker.py``, with the home
    resolved as ``torchserve`` resolves it (ts/model_server.py)."""
    spec = importlib.util.find_spec("ts.model_server")
    assert spec is not None and spec.origin is not None
    ts_home = os.path.dirname(os.path.dirname(os.path.realpath(spec.origin)))
    script = os.path.join(ts_home, "ts/model_service_worker.py")
    assert worker_script() == script
    check_worker_argv([script, *TS_ARGS], worker_script())


def test_without_torchserve_the_zygote_has_nothing_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(Refused, match=r"TorchServe \(the ts package\) is not installed"):
        worker_script()
