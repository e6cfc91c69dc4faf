"""python -m graph_assets: what it prints, and exit status 2 without a traceback on bad input."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from graph_assets import open_store
from graph_assets.__main__ import _parser, main

REPO = Path(__file__).resolve().parents[3]


def write_graph(directory: Path, nodes: str, edges: str) -> Path:
    directory.mkdir()
    (directory / "nodes.csv").write_text(nodes)
    (directory / "edges.csv").write_text(edges)
    return directory


def test_build_prints_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = write_graph(tmp_path / "g", "id,f\n1,0\n2,1\n3,2\n", "src,dst\n1,2\n1,2\n3,3\n2,3\n")
    assert main(["build", "--graph", str(graph), "--out", str(tmp_path / "s"), "--undirected"]) == 0
    out = capsys.readouterr().out
    store = open_store(tmp_path / "s")
    assert f"built store {tmp_path / 's'}" in out
    # --undirected adds the reverses of 1->2, 1->2 and 2->3, not of the self-loop 3->3.
    assert "nodes 3 (int ids), edges 7 (of 7), features 1, edge features 0, classes 0" in out
    assert "kept 1 self-loops and 2 parallel edges (--drop-self-loops / " in out
    assert f"checksum {store.checksum}" in out
    assert out.rstrip().endswith(" s")


def test_bad_input_exits_2_with_the_message_only(tmp_path: Path) -> None:
    graph = write_graph(tmp_path / "g", "id,f\n1,0\n2,x\n", "src,dst\n1,2\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "graph_assets",
            "build",
            "--graph",
            str(graph),
            "--out",
            str(tmp_path / "s"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "error: nodes.csv row 2: feature 'f' is 'x', not a number; every feature must be a "
        "finite number\n"
    )
    assert not (tmp_path / "s").exists()


def test_refusing_to_overwrite_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = write_graph(tmp_path / "g", "id,f\n1,0\n", "src,dst\n")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "keep.txt").write_text("x")
    assert main(["build", "--graph", str(graph), "--out", str(tmp_path / "s")]) == 2
    assert "is not a graph store" in capsys.readouterr().err


def test_synthetic_store_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["synthetic", "200", "1000", "--feature-dim", "4", "--seed", "3", "--homophily", "0.5"]
    assert main([*args, "--out", str(tmp_path / "s"), "--class-names", "a,b,c"]) == 0
    out = capsys.readouterr().out
    assert (
        "generated store" in out
        and "(1000 edges requested)" in out
        and " duplicate edges drawn by chance" in out
    )
    store = open_store(tmp_path / "s")
    assert (store.num_nodes, store.feature_dim, store.class_names) == (200, 4, ["a", "b", "c"])
    assert main([*args, "--csv", str(tmp_path / "csv")]) == 0
    assert "build with --drop-self-loops --drop-duplicate-edges" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "csv").iterdir()) == ["edges.csv", "nodes.csv"]


@pytest.mark.parametrize(
    "argv",
    [
        ["synthetic", "10", "10", "--out", "x", "--num-classes", "2", "--class-names", "a,b,c"],
        ["synthetic", "10", "10", "--out", "x", "--csv", "y"],
        ["synthetic", "0", "10", "--out", "x"],
        ["synthetic", "10", "10", "--out", "x", "--homophily", "2"],
        ["build", "--graph", "g"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_every_option_has_help() -> None:
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = ["build", "graphs", "load-redis", "synthetic", "synthetic-graphs"]
    assert sorted(commands.choices) == names
    for name, command in commands.choices.items():
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
