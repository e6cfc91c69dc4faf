"""How far the served answer of each typed recipe is from its full-graph forward.

The generated fraud graph (300 users, 40 merchants, 120 featureless devices, 1,500 payments
with two edge features; read as ``--undirected`` reads it, each relation's reverse added), a
seeded untrained recipe per arch with 2 and 3 layers, every user answered through the node
engine with every neighbour (fanout -1 at each hop), in batches of 16: the worst absolute
difference of any probability from the softmax of the model's forward on the whole typed
graph, and the share of users whose class agrees.

    python -m bench.experiments.typed_exactness [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from graph_assets.input.typed_input import read_graph
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model import ModelConfig, build_model
from model.config import Arch
from model.typed_graph import hetero_section, whole_graph_input

ARCHS = ("sage", "gat", "gcn", "gin", "rgcn", "hgt")
LAYERS = (2, 3)
BATCH = 16


def recipe(store: GraphStore, arch: str, layers: int) -> torch.nn.Module:
    """A seeded recipe; the payments' edge-feature maps scaled down (amounts are ~100), so
    that gat's attention does not saturate."""
    torch.manual_seed(0)
    config = ModelConfig(
        arch=Arch.parse(arch),
        in_dim=store.feature_dim,
        out_dim=2,
        hidden_dim=16,
        heads=2,
        num_layers=layers,
        hetero=hetero_section(store.schema),
    )
    model = build_model(config).eval()
    with torch.no_grad():
        for sub in model.modules():
            weight = getattr(getattr(sub, "lin_edge", None), "weight", None)
            if isinstance(weight, torch.Tensor):
                weight.mul_(1e-3)
    return model


def measure(store: GraphStore, arch: str, layers: int) -> dict[str, float]:
    """Worst difference and class agreement of one recipe over every user."""
    model = recipe(store, arch, layers)
    with torch.inference_mode():
        reference = torch.softmax(model(whole_graph_input(store)), dim=-1)
    settings = ServingSettings.from_yaml_section({"fanouts": [-1] * layers})
    engine = NodeClassificationEngine.create(store, model, settings, torch.device("cpu"), "1")
    ids = store.external_ids(np.arange(store.schema.target_type.num_nodes))
    answers = engine.handle(
        [{"body": {"node_ids": ids[i : i + BATCH]}} for i in range(0, len(ids), BATCH)]
    )
    served = torch.tensor([p["probabilities"] for a in answers for p in a.body["predictions"]])
    return {
        "worst_abs_diff": float((served - reference).abs().max()),
        "classes_agree": float((served.argmax(1) == reference.argmax(1)).float().mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        graph_dir = write_fraud_graph_csv(fraud_graph(300, 40, 120, 1500, seed=1), Path(folder))
        write_store(read_graph(graph_dir, undirected=True), Path(folder) / "store")
        store = open_store(Path(folder) / "store")
        results: dict[str, Any] = {
            arch: {str(layers): measure(store, arch, layers) for layers in LAYERS} for arch in ARCHS
        }
    print("| recipe | " + " | ".join(f"{n} layers" for n in LAYERS) + " | classes agree |")
    print("|---|" + "---|" * len(LAYERS) + "---|")
    for arch, by_layers in results.items():
        worst = " | ".join(f"{by_layers[str(n)]['worst_abs_diff']:.1e}" for n in LAYERS)
        agree = min(r["classes_agree"] for r in by_layers.values())
        print(f"| {arch} | {worst} | {agree:.0%} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
