"""Turns a TorchServe Python worker started with this folder on ``PYTHONPATH`` into a thin
launcher whose real worker is forked from a process that imported torch and PyG once
(``gnnserve_prefork``; docs/operations.md, "Worker memory"), and ``torchserve --start`` into
one that starts that process with the server (``gnnserve_prefork.early``). Every other Python
process started with this folder on its path is left alone."""

from gnnserve_prefork.early import start_zygote_early
from gnnserve_prefork.launcher import hand_over_to_zygote

start_zygote_early()
hand_over_to_zygote()
