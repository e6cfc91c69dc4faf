"""Turns a TorchServe Python worker started with this folder on ``PYTHONPATH`` into a thin
launcher whose real worker is forked from a process that imported torch and PyG once
(``gnnserve_prefork``; docs/operations.md, "Worker memory"). Every other Python process started
with this folder on its path is left alone."""

from gnnserve_prefork.launcher import hand_over_to_zygote

hand_over_to_zygote()
