"""GNNHandler through TorchServe's own calling convention, with a MockContext."""

from __future__ import annotations

import json
import logging
import re
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import torch

from graph_assets import StoreError, open_store
from graph_assets.errors import UnsafeDirectory
from graph_assets.live.log_lineage import update_log_path
from handler.gnn_handler import GNNHandler

from .conftest import MockContext, started


def test_mixed_batch_gets_one_status_and_body_per_request(model_dir):
    handler, context = started(model_dir, 4, fanouts=[-1, -1])
    data = [
        {"body": {"node_id": 0}},
        {"body": bytearray(b"{oops")},
        {"body": {"node_ids": [3, 1]}},
        {"data": {"node_ids": [3, 6]}},
    ]
    output = handler.handle(data, context)
    assert len(output) == 4
    bodies = [json.loads(item) for item in output]
    statuses = [context.get_response_status(i)[0] for i in range(4)]
    assert statuses == [200, 400, 404, 200]
    assert bodies[0]["node_id"] == 0 and bodies[0]["model_version"] == "1.0"
    assert bodies[1]["type"] == "BadRequest" and bodies[2]["type"] == "NotFound"
    assert [p["node_id"] for p in bodies[3]["predictions"]] == [3, 6]
    assert all(context.get_response_content_type(i) == "application/json" for i in range(4))
    recorded = dict(context.metrics.recorded)
    assert recorded["GnnBatchSize"] == 4 and recorded["GnnSeedNodes"] == 3
    assert recorded["GnnErrorResponses"] == 2 and recorded["GnnSampledNodes"] >= 3
    for stage in ("Parse", "Sample", "Gather", "Forward", "Format"):
        assert recorded[f"Gnn{stage}Time"] >= 0


def test_device_is_cpu_without_cuda(model_dir):
    handler, _ = started(model_dir, 1)
    assert handler.device == torch.device("cpu")


def test_inconsistent_archive_fails_at_start(model_dir):
    with pytest.raises(ValueError, match="one fanout per layer"):
        started(model_dir, 1, fanouts=[5, 5, 5])
    with pytest.raises(ValueError, match="unknown key"):
        started(model_dir, 1, fanout=[5, 5])


def test_corrupt_graph_fails_at_start(model_dir):
    features = model_dir / "graph" / "features.0.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0xFF
    features.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt"):
        started(model_dir, 1)


def test_describe_reports_graph_and_settings(model_dir):
    handler, _context = started(model_dir, 1, fanouts=[7, 3])
    described = json.loads(handler.describe_handle())
    assert described["fanouts"] == [7, 3]
    assert described["graph"]["nodes"] == 80
    assert described["graph"]["class_names"] == ["fraud", "legit", "review"]


def test_versions_with_the_same_graph_map_one_shared_copy(model_dir, tmp_path_factory):
    second = tmp_path_factory.mktemp("version2")
    shutil.copytree(model_dir, second, dirs_exist_ok=True)
    cache = str(tmp_path_factory.mktemp("shared-cache"))
    first_handler, _ = started(model_dir, 1, graph_cache_dir=cache)
    second_handler, _ = started(second, 1, graph_cache_dir=cache)
    first_store, second_store = first_handler.engine.store, second_handler.engine.store
    assert first_store.path == second_store.path
    assert str(first_store.path).startswith(cache)
    features = first_store.path / "features.0.npy"
    assert features.samefile(model_dir / "graph" / "features.0.npy")  # a hard link, not a copy


def test_sharing_can_be_turned_off(model_dir):
    handler, _ = started(model_dir, 1, share_graph=False)
    assert handler.engine.store.path == model_dir / "graph"


def test_updates_in_a_batch_are_applied_first_and_need_the_key(model_dir, tmp_path, monkeypatch):
    from ts.context import RequestProcessor

    secret = "update-secret-0123456789"
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", secret)
    handler, context = started(
        model_dir, 4, updates_enabled=True, update_state_dir=str(tmp_path / "state")
    )
    context.request_processor = [
        RequestProcessor({"X-Gnnserve-Update-Key": secret}),
        RequestProcessor({}),
        RequestProcessor({}),
        RequestProcessor({"x-gnnserve-update-key": "wrong"}),
    ]
    new_node = {"type": "add_node", "id": 900, "x": [0.1] * 6}
    data = [
        {
            "body": {
                "op": "update",
                "operations": [new_node, {"type": "add_edge", "src": 900, "dst": 0}],
            }
        },
        {"body": {"node_id": 900}},
        {"body": {"op": "update", "operations": [{"type": "remove_node", "id": 0}]}},
        {"body": {"op": "update", "operations": [{"type": "remove_node", "id": 0}]}},
    ]
    bodies = [json.loads(item) for item in handler.handle(data, context)]
    statuses = [context.get_response_status(i)[0] for i in range(4)]
    assert statuses == [200, 200, 403, 403]
    assert bodies[0]["status"] == "applied" and bodies[0]["graph_version"].endswith("+1")
    assert bodies[1]["node_id"] == 900 and bodies[1]["graph_version"].endswith("+1")
    assert (tmp_path / "state").is_dir()


def test_updates_are_refused_when_disabled(model_dir):
    handler, context = started(model_dir, 1)
    (body,) = handler.handle([{"body": {"op": "update", "operations": [{}]}}], context)
    assert context.get_response_status(0)[0] == 403 and "disabled" in json.loads(body)["message"]


def test_enabling_updates_without_a_secret_fails_at_start(model_dir, monkeypatch):
    monkeypatch.delenv("GNNSERVE_UPDATE_SECRET", raising=False)
    with pytest.raises(ValueError, match="update secret"):
        started(model_dir, 1, updates_enabled=True)


@pytest.fixture()
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shared temp dir (mode 1777, like /tmp) as the workers' default temp dir."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", "update-secret-0123456789")
    return shared


def test_the_default_state_dir_and_its_log_dir_are_created_private(model_dir, shared_tmp):
    handler, _ = started(model_dir, 1, updates_enabled=True)
    state = shared_tmp / "gnnserve-state"
    assert handler.live is not None and handler.live.log.path.parent.parent == state
    for directory in (state, handler.live.log.path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_state_dir_another_user_could_write_is_refused(model_dir, shared_tmp):
    state = shared_tmp / "gnnserve-state"
    state.mkdir()
    state.chmod(0o777)  # pre-created, so anyone can plant update records in it
    with pytest.raises(UnsafeDirectory, match=r"gnnserve-state is writable by its group or others"):
        started(model_dir, 1, updates_enabled=True)
    assert list(state.iterdir()) == []  # no log was opened there


def test_a_log_dir_another_user_could_write_is_refused(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", "update-secret-0123456789")
    state = tmp_path / "state"
    lineage = update_log_path(open_store(model_dir / "graph"), state).parent
    lineage.mkdir(parents=True)
    state.chmod(0o700)
    lineage.chmod(0o777)
    with pytest.raises(
        UnsafeDirectory, match=re.escape(f"{lineage} is writable by its group or others")
    ):
        started(model_dir, 1, updates_enabled=True, update_state_dir=str(state))


def test_torchserves_per_batch_line_is_dropped_and_nothing_else(model_dir, caplog):
    started(model_dir, 1)
    with caplog.at_level(logging.INFO):
        logging.info("Backend received inference at: %d", 1_700_000_000)
        logging.info("Torch worker started.")
        logging.getLogger("handler.tasks.node.engine").info("Backend received inference at: %d", 1)
    messages = [record.getMessage() for record in caplog.records]
    assert "Backend received inference at: 1700000000" not in messages
    assert "Torch worker started." in messages
    assert "Backend received inference at: 1" in messages  # not on the root logger: kept


def test_a_describe_header_on_predictions_never_turns_the_batch_into_a_description(model_dir):
    from ts.context import RequestProcessor

    handler, context = started(model_dir, 3)
    context.request_processor = [RequestProcessor({"describe": "True"}) for _ in range(3)]
    data = [{"body": {"node_id": 0}}, {"body": {"node_id": 3}}, {"body": {"node_id": 6}}]
    bodies = [json.loads(item) for item in handler.handle(data, context)]
    assert [body["node_id"] for body in bodies] == [0, 3, 6]
    assert [context.get_response_status(i)[0] for i in range(3)] == [200, 200, 200]
    (alone,) = handler.handle(data[:1], context)
    assert json.loads(alone)["node_id"] == 0


def test_the_management_describe_call_is_still_answered(model_dir):
    from ts.context import RequestProcessor

    handler, context = started(model_dir, 1)
    # What TorchServe's frontend sends for GET /models/gnn?customized=true: no payload at all.
    context.request_processor = [RequestProcessor({"describe": "True"})]
    (described,) = handler.handle([{}], context)
    assert json.loads(described)["graph"]["nodes"] == 80


def test_a_worker_whose_explanations_outlast_the_response_timeout_refuses_to_start(
    model_dir, caplog
):
    gnn = {"graph_cache_dir": str(model_dir.parent / "cache"), "explain_time_budget_ms": 3000}
    config = {"batchSize": 4, "responseTimeout": 12, "gnn": gnn}
    with caplog.at_level(logging.ERROR), pytest.raises(ValueError, match="reaches responseTimeout"):
        GNNHandler().initialize(MockContext(model_dir, config, 4))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "handler.gnn_handler"]
    assert line.startswith("gnn worker refuses to start: a batch of 4 explanations")


def test_torchserve_handler_and_prediction_times_come_with_the_interval_report(model_dir):
    handler, context = started(model_dir, 2, metrics_interval_s=0)
    handler.handle([{"body": {"node_id": 0}}], context)
    recorded = dict(context.metrics.recorded)
    assert recorded["HandlerTime"] > 0 and "PredictionTime" not in recorded
    context.metrics.add_time("PredictionTime", 0.7)  # TorchServe, after the batch
    context.metrics.add_time("PredictionTime", 0.9)
    handler.handle([{"body": {"node_id": 1}}], context)
    assert [v for name, v in context.metrics.recorded if name == "PredictionTime"] == [0.8]
    assert [name for name, _ in context.metrics.recorded].count("HandlerTime") == 2


def test_torchserve_profiler_switch_still_profiles_the_batch(model_dir, monkeypatch):
    handler, context = started(model_dir, 2)
    handler.profiler_args = {
        "activities": [torch.profiler.ProfilerActivity.CPU],
        "on_trace_ready": lambda profile: None,  # no trace files
    }
    monkeypatch.setenv("ENABLE_TORCH_PROFILER", "true")
    output = handler.handle([{"body": {"node_id": 0}}, {"body": {"node_id": 10**6}}], context)
    assert json.loads(output[0])["node_id"] == 0
    assert [context.get_response_status(i)[0] for i in range(2)] == [200, 404]
    assert "HandlerTime" in dict(context.metrics.recorded)  # BaseHandler's own, per batch
