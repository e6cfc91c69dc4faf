"""One experiment per module, each run with ``python -m bench.experiments.<name>``."""
