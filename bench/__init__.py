"""Benchmarks and reports; each module runs with ``python -m bench.<name>``."""
