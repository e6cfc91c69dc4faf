"""Serving layer: request parsing, neighbour sampling, batched inference, responses.

Only ``gnn_handler.py`` imports TorchServe; the other modules are plain Python/torch so they can
be tested and reused without a server.
"""
