"""Serving layer. ``gnn_handler.py`` and ``worker_socket.py`` are the TorchServe glue and the only
modules that import TorchServe; below them, ``protocol/`` decodes and words requests and errors,
``tasks/`` holds one subpackage per task, ``core/`` the batch pipeline, sampler and graph view
they share, and ``live/`` the live graph updates.
"""
