"""Build and load gnnserve's serialized graph: validated input, memory-mapped CSC store.

No torch here: the model and the handler import this package, never the other way round.
"""

from graph_assets.errors import GraphInputError, StoreError
from graph_assets.input.reader import read_graph_dir
from graph_assets.input.synthetic import generate_synthetic, write_synthetic_csv
from graph_assets.stored.shared import share_store
from graph_assets.stored.store import FORMAT_VERSION, GraphStore, StoreMeta, open_store, read_meta
from graph_assets.stored.writer import StoreBuilder, write_store
from graph_assets.tables import RawGraph

__all__ = [
    "FORMAT_VERSION",
    "GraphInputError",
    "GraphStore",
    "RawGraph",
    "StoreBuilder",
    "StoreError",
    "StoreMeta",
    "generate_synthetic",
    "open_store",
    "read_graph_dir",
    "read_meta",
    "share_store",
    "write_store",
    "write_synthetic_csv",
]
