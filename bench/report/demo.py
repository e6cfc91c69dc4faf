"""Per-architecture report on the demo graph: test accuracy and served-vs-full-graph exactness.

``python -m bench.report.demo`` trains gcn, sage, gat and gin on ``graph_assets/demo``, serves
every node through the handler's engine with full neighbourhoods (fanouts -1 per hop), in
batches of 64 single-node requests, and prints the largest difference between a served
probability and PyG's full-graph forward.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from graph_assets import open_store, read_graph_dir, write_store
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model import Arch, ModelConfig, build_model
from model.train import train_node_classifier

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--graph", type=Path, default=ROOT / "graph_assets" / "demo")
    parser.add_argument("--batch", type=int, default=64, help="requests per served batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_store(read_graph_dir(args.graph), Path(tmp) / "store")
        store = open_store(Path(tmp) / "store")
        x = torch.from_numpy(np.array(store.features))
        edge_index = torch.from_numpy(store.edge_index())
        labels = torch.from_numpy(np.array(store.labels))
        ids = store.external_ids(np.arange(store.num_nodes))
        print(f"graph {args.graph}: {store.num_nodes} nodes, {store.num_edges} edges")
        print("arch  test_acc  val_acc  epochs  max|served - full|")
        for arch in ("gcn", "sage", "gat", "gin"):
            config = ModelConfig(
                arch=Arch.parse(arch), in_dim=store.feature_dim, out_dim=store.num_classes
            )
            result = train_node_classifier(x, edge_index, labels, config, progress=False)
            model = build_model(config)
            model.load_state_dict(result.state_dict)
            model.eval()
            with torch.no_grad():
                expected = torch.softmax(model(x, edge_index), dim=-1)
            settings = ServingSettings(fanouts=(-1,) * config.num_layers)
            engine = NodeClassificationEngine.create(
                store, model, settings, torch.device("cpu"), "1.0"
            )
            served = []
            for start in range(0, len(ids), args.batch):
                batch = [{"body": {"node_id": i}} for i in ids[start : start + args.batch]]
                served += [r.body["probabilities"] for r in engine.handle(batch)]
            difference = float((torch.tensor(served) - expected).abs().max())
            print(
                f"{arch:<5} {result.test_accuracy:8.3f} {result.val_accuracy:8.3f} "
                f"{result.epochs_run:7d}  {difference:.2e}"
            )


if __name__ == "__main__":
    main()
