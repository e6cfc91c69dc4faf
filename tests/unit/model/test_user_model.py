"""Refusals of the user's model at build time: each is one line that says what to do instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_geometric.nn.models import GraphSAGE

from model.user_model import (
    UserModelConfig,
    import_model_class,
    instantiate,
    load_weights,
    parse_model_args,
    read_state_dict,
)


def sage() -> GraphSAGE:
    torch.manual_seed(0)
    return GraphSAGE(4, 8, 2, 3)


def one_line(error: pytest.ExceptionInfo[ValueError]) -> str:
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_state_dict_is_read(tmp_path: Path) -> None:
    torch.save(sage().state_dict(), tmp_path / "w.pt")
    assert set(read_state_dict(tmp_path / "w.pt")) == set(sage().state_dict())


def test_a_pickled_module_is_refused(tmp_path: Path) -> None:
    torch.save(sage(), tmp_path / "module.pt")
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "module.pt")
    assert "state_dict()" in one_line(refused) and "pickled" in one_line(refused)


def test_torchscript_is_refused(tmp_path: Path) -> None:
    scripted = torch.jit.trace(torch.nn.Linear(3, 2), torch.zeros(1, 3))
    torch.jit.save(scripted, str(tmp_path / "scripted.pt"))
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "scripted.pt")
    assert "TorchScript" in one_line(refused) and "state_dict()" in one_line(refused)


def test_torch_export_is_refused(tmp_path: Path) -> None:
    program = torch.export.export(torch.nn.Linear(3, 2), (torch.zeros(1, 3),))
    torch.export.save(program, tmp_path / "program.pt2")
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "program.pt2")
    assert "torch.export" in one_line(refused)


def test_a_training_checkpoint_is_refused_naming_the_key(tmp_path: Path) -> None:
    torch.save({"state_dict": sage().state_dict(), "epoch": 3}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "ckpt.pt")
    assert "checkpoint['state_dict']" in one_line(refused)


def test_not_a_torch_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.pt").write_text("hello")
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "w.pt")
    assert "is not a torch or safetensors weights file (it starts with b'hello'" in one_line(
        refused
    )


@pytest.mark.parametrize("size", [1, 100, 4096])
def test_a_file_of_zeros_is_not_a_weights_file(tmp_path: Path, size: int) -> None:
    (tmp_path / "w.pt").write_bytes(bytes(size))
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "w.pt")
    head = bytes(min(size, 16))
    assert one_line(refused) == (
        f"--weights {tmp_path / 'w.pt'} is not a torch or safetensors weights file (it starts "
        f"with {head!r}; torch.save writes a zip archive); save torch.save(model.state_dict(), "
        "F) in your training script"
    )


def test_a_safetensors_file_is_named(tmp_path: Path) -> None:
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    (tmp_path / "w.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "w.safetensors")
    assert one_line(refused) == (
        f"--weights {tmp_path / 'w.safetensors'} is a safetensors file, which is not read here; "
        "load it with safetensors.torch.load_file and torch.save the dict it returns"
    )


def test_sparse_tensors_are_refused_before_loading(tmp_path: Path) -> None:
    weights = sage().state_dict()
    weights["convs.0.lin_l.weight"] = weights["convs.0.lin_l.weight"].to_sparse()
    torch.save(weights, tmp_path / "w.pt")
    with pytest.raises(ValueError) as refused:
        read_state_dict(tmp_path / "w.pt")
    assert one_line(refused) == (
        f"--weights {tmp_path / 'w.pt'} holds sparse tensors (convs.0.lin_l.weight: "
        "torch.sparse_coo), which no module's parameters are; save the model's own "
        "state_dict(), or each tensor's .to_dense()"
    )


def test_missing_and_unexpected_keys_are_listed_with_the_fix() -> None:
    weights = GraphSAGE(4, 8, 3, 3).state_dict()  # one layer more than the model
    with pytest.raises(ValueError) as refused:
        load_weights(sage(), weights, "w.pt")
    message = one_line(refused)
    assert "unexpected keys convs.2" in message and "wrong shapes" in message
    assert "--model-args" in message


def test_a_wrapped_state_dict_names_its_prefix() -> None:
    weights = {f"module.{key}": value for key, value in sage().state_dict().items()}
    with pytest.raises(ValueError) as refused:
        load_weights(sage(), weights, "w.pt")
    assert "start with 'module.'" in one_line(refused)


def test_classes_are_found_by_dotted_path_or_in_a_file(tmp_path: Path) -> None:
    assert import_model_class("torch_geometric.nn.models.GraphSAGE", None) is GraphSAGE
    (tmp_path / "mine.py").write_text(
        "import torch\nclass Mine(torch.nn.Module):\n    pass\nclass Other(torch.nn.Module):\n"
        "    pass\n"
    )
    assert import_model_class("Mine", tmp_path / "mine.py").__name__ == "Mine"
    with pytest.raises(ValueError) as refused:
        import_model_class("Missing", tmp_path / "mine.py")
    assert "Mine, Other" in one_line(refused)
    with pytest.raises(ValueError) as refused:
        import_model_class("GraphSAGE", None)
    assert "--model-file" in one_line(refused)
    with pytest.raises(ValueError) as refused:
        import_model_class("no_such_package.Model", None)
    assert "cannot import" in one_line(refused)


def test_a_model_file_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError) as refused:
        import_model_class("Model", tmp_path / "broken.py")
    assert "RuntimeError: boom" in one_line(refused)


def test_bad_constructor_arguments_show_the_signature() -> None:
    with pytest.raises(ValueError) as refused:
        instantiate(GraphSAGE, {"in_channels": 4, "hiden_channels": 8})
    assert "GraphSAGE(" in one_line(refused) and "hidden_channels" in one_line(refused)


def test_model_args_must_be_a_json_object() -> None:
    assert parse_model_args('{"hidden": 64}', "--model-args") == {"hidden": 64}
    for text in ("[1, 2]", "{hidden: 64}"):
        with pytest.raises(ValueError) as refused:
            parse_model_args(text, "--model-args")
        assert "--model-args" in one_line(refused)


class _Scaled(torch.nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)


def test_tensor_arguments_are_written_as_tensor_objects() -> None:
    module = instantiate(_Scaled, {"scale": {"tensor": [1.0, 2.0]}})
    assert torch.equal(module.scale, torch.tensor([1.0, 2.0]))


def test_the_config_round_trips_for_every_task_and_refuses_an_unknown_one() -> None:
    for task in ("node", "link", "graph"):
        config = UserModelConfig(model_class="a.B", in_dim=4, out_dim=3, num_layers=2, task=task)
        assert UserModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="task must be one of"):
        UserModelConfig(model_class="a.B", in_dim=4, out_dim=3, num_layers=2, task="edge")


def test_a_preset_says_it_reads_no_edge_features(tmp_path: Path, capsys) -> None:
    """A graph's edge feature columns are never dropped silently: a preset says it reads none."""
    from model.__main__ import main
    from tests.edge_graph import edge_feature_store

    store = edge_feature_store(tmp_path)
    argv = ["train", "--store", str(store.path), "--out", str(tmp_path / "m"), "--epochs", "1"]
    assert main([*argv, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "read no edge features" in out and "amount, timestamp" in out
