"""ensure_private_dir: created 0700, or an existing directory accepted only when it is private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from graph_assets import private_dir
from graph_assets.errors import UnsafeDirectory
from graph_assets.private_dir import ensure_private_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_missing_directory_and_its_missing_parents_are_created_0700(tmp_path):
    path = tmp_path / "a" / "b" / "state"
    assert ensure_private_dir(path) == path
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", path)] == [0o700] * 3


def test_an_existing_private_directory_is_accepted_as_it_is(tmp_path):
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    (path / "kept").write_text("x")
    assert ensure_private_dir(str(path)) == path
    assert (path / "kept").read_text() == "x"


def test_a_relative_path_comes_back_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ensure_private_dir(Path("state")) == tmp_path / "state"


def test_a_directory_others_can_write_is_refused_with_one_line(tmp_path):
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o777)  # pre-created in a shared temp dir
    with pytest.raises(UnsafeDirectory) as info:
        ensure_private_dir(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and "writable by its group or others (mode 0777)" in message
    assert "remove it" in message
    assert mode(path) == 0o777  # refused, not repaired


def test_a_group_writable_directory_is_refused(tmp_path):
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o770)
    with pytest.raises(UnsafeDirectory, match="writable by its group or others"):
        ensure_private_dir(path)


def test_a_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    owner = os.stat(path).st_uid
    monkeypatch.setattr(private_dir.os, "geteuid", lambda: owner + 1)
    with pytest.raises(UnsafeDirectory, match=rf"owned by uid {owner}, not by this user"):
        ensure_private_dir(path)


def test_one_of_ours_that_others_may_only_read_is_narrowed_to_0700(tmp_path, caplog):
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o755)  # what mkdir made before this check existed
    assert ensure_private_dir(path) == path
    assert mode(path) == 0o700
    assert "narrowed to 0700" in caplog.text


def test_a_file_is_refused(tmp_path):
    path = tmp_path / "state"
    path.write_text("")
    with pytest.raises(UnsafeDirectory, match="is not a directory"):
        ensure_private_dir(path)


def test_a_link_in_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone may plant a link here
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (shared / "state").symlink_to(real)
    with pytest.raises(UnsafeDirectory) as info:
        ensure_private_dir(shared / "state" / "lineage")
    message = str(info.value)
    assert "\n" not in message
    assert f"{shared / 'state'} is a symbolic link that another user could have made" in message
    assert f"use the real path {real / 'lineage'}" in message
    assert not (real / "lineage").exists()


def test_a_link_above_the_directory_is_checked_too(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "real").mkdir(mode=0o700)
    (shared / "up").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeDirectory, match="up is a symbolic link"):
        ensure_private_dir(shared / "up" / "a" / "state")


def test_a_link_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir(mode=0o700)
    link = tmp_path / "state"
    link.symlink_to(tmp_path / "real")
    if os.geteuid() == 0:
        os.lchown(link, 65534, 65534)  # planted by "nobody"
    else:  # only root can give a link away: become another user instead
        monkeypatch.setattr(private_dir.os, "geteuid", lambda: os.lstat(link).st_uid + 1)
    with pytest.raises(UnsafeDirectory, match="symbolic link that another user could have made"):
        ensure_private_dir(link)


def test_a_link_only_this_user_could_have_made_is_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)  # tmp_path is ours and private
    assert ensure_private_dir(tmp_path / "state" / "lineage") == tmp_path / "state" / "lineage"
    assert mode(real / "lineage") == 0o700
