"""What the client integration tests send, the way users' clients send it: the JSON API with
``requests``, and tritonclient's HTTP client on ``/v2/models/<m>/infer`` with each archive
kind's tensors (docs/api.md, "KServe v2")."""

from __future__ import annotations

from typing import Any

import numpy as np
import requests
import tritonclient.http as triton

from tests.servers.torchserve import TorchServe

# The output tensors of each archive of conftest's tasks_store.
OUTPUTS = {
    "gnn": ("node_id", "predicted_class", "probabilities"),
    "link": ("src", "dst", "score"),
    "graphs": ("predicted_class", "probabilities"),
}


def rest(server: TorchServe, model: str, body: Any) -> requests.Response:
    """``POST /predictions/<model>`` with a JSON body."""
    return requests.post(
        f"{server.inference_url}/predictions/{model}",
        json=body,
        headers=server.auth("inference"),
        timeout=60,
    )


def triton_client(server: TorchServe) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.inference_url.removeprefix("http://"))


def tensor(name: str, values: np.ndarray, datatype: str, binary: bool = False) -> Any:
    """One tritonclient input; JSON data unless ``binary`` (the client's default encoding)."""
    item = triton.InferInput(name, list(values.shape), datatype)
    item.set_data_from_numpy(values, binary_data=binary)
    return item


def node_tensors(ids: list[str], shape: list[int], binary: bool = False) -> list[Any]:
    return [tensor("node_ids", np.array(ids, dtype=object).reshape(shape), "BYTES", binary)]


def pair_tensors(pairs: list[list[str]], binary: bool = False) -> list[Any]:
    return [tensor("pairs", np.array(pairs, dtype=object).reshape(-1, 2), "BYTES", binary)]


def graph_tensors(graph: dict[str, Any], binary: bool = False) -> list[Any]:
    x = np.array(graph["x"], dtype=np.float32)
    edge_index = np.array(graph["edge_index"], dtype=np.int64).reshape(2, -1)
    return [tensor("x", x, "FP32", binary), tensor("edge_index", edge_index, "INT64", binary)]


def triton_infer(
    server: TorchServe, model: str, inputs: list[Any], request_id: str = "req-7"
) -> Any:
    """tritonclient's ``infer`` with every output of ``model`` requested as JSON."""
    outputs = [triton.InferRequestedOutput(name, binary_data=False) for name in OUTPUTS[model]]
    # tritonclient adds its own headers to the dict it is given: a fresh one per call
    return triton_client(server).infer(
        model,
        inputs,
        outputs=outputs,
        request_id=request_id,
        headers=dict(server.auth("inference")),
    )


def strings(values: np.ndarray) -> list[str]:
    """tritonclient's BYTES output (bytes or str elements) as text."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values.ravel()]


def assert_same_answer(served: Any, expected: Any, atol: float = 1e-6) -> None:
    """The same JSON answer, numbers to float32 rounding (a batch changes BLAS's kernels)."""
    if isinstance(expected, dict):
        assert isinstance(served, dict) and served.keys() == expected.keys(), (served, expected)
        for key, value in expected.items():
            assert_same_answer(served[key], value, atol)
    elif isinstance(expected, list):
        assert isinstance(served, list) and len(served) == len(expected), (served, expected)
        for item, value in zip(served, expected, strict=True):
            assert_same_answer(item, value, atol)
    elif isinstance(expected, float):
        assert abs(served - expected) <= atol, (served, expected)
    else:
        assert served == expected, (served, expected)
