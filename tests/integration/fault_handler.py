"""Test-only TorchServe handler: the production GNNHandler with faults triggered by feature markers.

``tests/integration/faults.py`` packs this file into a copy of a built archive as its handler
(the production archive and code carry no test hook). The model's forward pass raises when its
input holds a node whose first feature is one of the MARKERS, the way a real failure would
surface: a bug in the model, the host or the GPU running out of memory, or a CUDA error that
poisons the device. Marker nodes have no edges, so they reach the model only as seeds of their
own requests.
"""

from __future__ import annotations

from typing import Any

import torch
from ts.context import Context

from handler.gnn_handler import GNNHandler

MARKERS = {
    -1001.0: "bug",
    -1002.0: "oom",
    -1003.0: "cuda_oom",
    -1004.0: "cuda_error",
}


def inject_fault(x: torch.Tensor) -> None:
    """Raises the fault whose marker is in the first feature column of ``x``, if any."""
    for value, fault in MARKERS.items():
        if bool((x[:, 0] == value).any()):
            if fault == "bug":
                raise ValueError("injected: a bug in the model")
            if fault == "oom":
                raise MemoryError("injected: the host ran out of memory")
            if fault == "cuda_oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB")
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")


class FaultInjectingHandler(GNNHandler):
    """GNNHandler whose model runs ``inject_fault`` on its input before the real forward."""

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        assert self.engine is not None
        forward = self.engine.model.forward

        def faulty_forward(x: torch.Tensor, edge_index: torch.Tensor, **kwargs: Any) -> Any:
            inject_fault(x)
            return forward(x, edge_index, **kwargs)

        self.engine.model.forward = faulty_forward  # type: ignore[method-assign]
