"""The TorchServe handler: picks the device, loads graph and weights, maps results to statuses.

Thin on purpose: parsing, sampling and inference live in ``handler.engine`` and below, which do
not import TorchServe.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
from ts.context import Context
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from graph_assets import GraphStore, open_store, share_store
from handler.engine import (
    BatchResult,
    NodeClassificationEngine,
    PreparedBatch,
    Response,
    StageTimes,
)
from handler.settings import ServingSettings
from model.export import load_model

logger = logging.getLogger(__name__)

GRAPH_CACHE = "gnnserve-graph-cache"
_GAUGE = MetricTypes.GAUGE
_PHRASES = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large"}


def select_device(gpu_id: Any) -> torch.device:
    """cuda:<gpu_id> when TorchServe assigned a GPU and CUDA is usable, else the CPU."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


class GNNHandler(BaseHandler):
    """Serves node classification from the graph and weights packed in the archive."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: NodeClassificationEngine | None = None

    def initialize(self, context: Context) -> None:
        """Loads everything once per worker; a bad archive fails here, not mid-request."""
        properties = context.system_properties
        model_dir = Path(properties["model_dir"])
        self.device = select_device(properties.get("gpu_id"))
        settings = ServingSettings.from_yaml_section((context.model_yaml_config or {}).get("gnn"))
        graph_dir = model_dir / settings.graph_dir
        if settings.share_graph:
            cache = Path(settings.graph_cache_dir or Path(tempfile.gettempdir()) / GRAPH_CACHE)
            graph_dir = share_store(graph_dir, cache)
        store = open_store(graph_dir, verify_checksum=settings.verify_checksum)
        model, config = load_model(model_dir, map_location=self.device)
        check_compatible(config.in_dim, config.out_dim, config.num_layers, store, settings)
        version = str(context.manifest.get("model", {}).get("modelVersion", "1.0"))
        self.engine = NodeClassificationEngine(store, model, settings, self.device, version)
        self.context = context
        self.initialized = True
        logger.info(
            "gnn model %s ready on %s: %d nodes, %d edges, graph %s, fanouts %s",
            version,
            self.device,
            store.num_nodes,
            store.num_edges,
            store.checksum[:12],
            list(settings.fanouts),
        )

    def preprocess(self, data: list[Any]) -> PreparedBatch:
        """Validates each request alone, then samples one ego-graph for the batch's seeds."""
        return self._engine().prepare(data)

    def inference(self, data: PreparedBatch, *args: Any, **kwargs: Any) -> BatchResult:
        """One forward pass for the batch, under ``torch.inference_mode()`` (in the engine)."""
        result = self._engine().run(data)
        times = data.times
        logger.info(
            "batch of %d requests: %d seeds, %d sampled nodes, %d sampled edges",
            times.batch_size,
            times.seed_nodes,
            times.sampled_nodes,
            times.sampled_edges,
        )
        return result

    def postprocess(self, data: BatchResult) -> list[str]:
        """One JSON body per request, in order, each with its own HTTP status."""
        responses = self._engine().respond(data)
        self._report(data.batch.times, responses)
        for index, response in enumerate(responses):
            phrase = _PHRASES.get(response.status, "Error")
            self.context.set_response_status(code=response.status, phrase=phrase, idx=index)
            self.context.set_response_content_type(index, "application/json")
        return [json.dumps(response.body) for response in responses]

    def _report(self, times: StageTimes, responses: list[Response]) -> None:
        """Per-batch custom metrics; TorchServe exposes them on its Prometheus endpoint."""
        metrics = self.context.metrics
        if metrics is None:
            return
        values = {
            "GnnBatchSize": (times.batch_size, "Count"),
            "GnnSeedNodes": (times.seed_nodes, "Count"),
            "GnnSampledNodes": (times.sampled_nodes, "Count"),
            "GnnSampledEdges": (times.sampled_edges, "Count"),
            "GnnParseTime": (times.parse * 1000, "ms"),
            "GnnSampleTime": (times.sample * 1000, "ms"),
            "GnnGatherTime": (times.gather * 1000, "ms"),
            "GnnForwardTime": (times.forward * 1000, "ms"),
            "GnnFormatTime": (times.format * 1000, "ms"),
        }
        for name, (value, unit) in values.items():
            metrics.add_metric(
                name, round(value, 3), unit, dimensions=self._dimensions(), metric_type=_GAUGE
            )
        errors = sum(1 for response in responses if response.status >= 400)
        metrics.add_metric("GnnErrorResponses", errors, "Count", dimensions=self._dimensions())

    def _dimensions(self) -> list[Dimension]:
        """A fresh list per call: TorchServe appends default dimensions to the one it is given."""
        return [Dimension("ModelName", self.context.model_name), Dimension("Level", "Model")]

    def describe_handle(self) -> str:
        """Answers the management API's ``GET /models/{name}?customized=true``."""
        engine = self._engine()
        store = engine.store
        return json.dumps(
            {
                "task": engine.settings.task,
                "model_version": engine.model_version,
                "device": str(engine.device),
                "fanouts": list(engine.settings.fanouts),
                "graph": {
                    "nodes": store.num_nodes,
                    "edges": store.num_edges,
                    "feature_dim": store.feature_dim,
                    "num_classes": store.num_classes,
                    "class_names": store.class_names,
                    "checksum": store.checksum,
                },
            }
        )

    def _engine(self) -> NodeClassificationEngine:
        if self.engine is None:
            raise RuntimeError("the handler was not initialized")
        return self.engine


def check_compatible(
    in_dim: int, out_dim: int, num_layers: int, store: GraphStore, settings: ServingSettings
) -> None:
    """Refuses weights, graph and fanouts that do not fit together, naming the mismatch."""
    problems = []
    if in_dim != store.feature_dim:
        problems.append(f"the model expects {in_dim} features, the graph has {store.feature_dim}")
    if out_dim != store.num_classes:
        problems.append(f"the model predicts {out_dim} classes, the graph has {store.num_classes}")
    if len(settings.fanouts) != num_layers:
        problems.append(
            f"the model has {num_layers} layers but fanouts {list(settings.fanouts)} name "
            f"{len(settings.fanouts)} hops; give one fanout per layer"
        )
    if problems:
        raise ValueError("archive is inconsistent: " + "; ".join(problems))
