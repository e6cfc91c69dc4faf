"""The FastAPI baselines, served by uvicorn: what users would run instead of gnnserve.

- ``whole`` is the seed articles' design: the whole graph held in memory as a PyG ``Data``,
  and every request runs the model's forward pass over the whole graph, in an ``async def``
  endpoint, to read one row.
- ``khop`` is the obvious improvement: ``torch_geometric.utils.k_hop_subgraph`` extracts the
  request's full k-hop in-neighbourhood (a pass over the edge list per hop), and the forward
  pass runs on that subgraph only.

Both answer ``{"node_id": 42}`` with the node's class and probabilities, from the same store and
the same weights as the archive under test. Configured by environment variables (uvicorn starts
the app through :func:`create_app`); ``GNNSERVE_BENCH_THREADS`` sets torch's intra-op threads
(unset: torch's default, as the seed articles leave it)::

    GNNSERVE_BENCH_MODE=whole|khop GNNSERVE_BENCH_STORE=DIR GNNSERVE_BENCH_MODEL=DIR \\
        uvicorn --factory bench.systems.baseline_app:create_app --port 8000
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from torch_geometric.data import Data
from torch_geometric.utils import k_hop_subgraph

from graph_assets import open_store
from model.export import load_model

MODES = ("whole", "khop")


class NodeBody(BaseModel):
    node_id: int


class Prediction(BaseModel):
    node_id: int
    predicted_class: int
    probabilities: list[float]


def create_app() -> FastAPI:
    """Loads graph and weights once, at start (the seed articles do the same)."""
    mode = os.environ.get("GNNSERVE_BENCH_MODE", "whole")
    if mode not in MODES:
        raise ValueError(f"GNNSERVE_BENCH_MODE must be one of {MODES}; got {mode!r}")
    threads = os.environ.get("GNNSERVE_BENCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    store = open_store(Path(os.environ["GNNSERVE_BENCH_STORE"]), verify_checksum=False)
    model, config = load_model(Path(os.environ["GNNSERVE_BENCH_MODEL"]))
    graph = Data(
        x=torch.from_numpy(np.array(store.features)),
        edge_index=torch.from_numpy(store.edge_index()),
    )
    num_nodes, num_hops = store.num_nodes, config.num_layers
    app = FastAPI(title=f"baseline: {mode}")

    def predict(node: int) -> torch.Tensor:
        with torch.no_grad():
            if mode == "whole":
                logits = model(graph.x, graph.edge_index)[node]
            else:
                subset, edge_index, mapping, _ = k_hop_subgraph(
                    node, num_hops, graph.edge_index, relabel_nodes=True, num_nodes=num_nodes
                )
                logits = model(graph.x[subset], edge_index)[mapping[0]]
            return torch.softmax(logits, dim=-1)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"mode": mode, "nodes": num_nodes}

    @app.post("/predict/node", response_model=Prediction)
    async def predict_node(body: NodeBody) -> Prediction:
        if not 0 <= body.node_id < num_nodes:
            raise HTTPException(status_code=404, detail=f"node {body.node_id} not in the graph")
        probabilities = predict(body.node_id)
        return Prediction(
            node_id=body.node_id,
            predicted_class=int(probabilities.argmax()),
            probabilities=probabilities.tolist(),
        )

    return app
