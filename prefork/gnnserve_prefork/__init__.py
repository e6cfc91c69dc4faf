"""Pre-forked TorchServe workers: one process imports torch and PyG, workers are forked from it.

TorchServe starts every worker as a fresh interpreter, so each pays ~290 MiB of private memory
for torch, PyG and their imports. Forked workers share those pages copy-on-write instead.
This package imports nothing of ours and nothing heavy at launch time: the launcher runs at the
start of every worker process.
"""
