"""Reports: docs/benchmarks.md's tables and plots, and the tasks' and demo graph's figures."""
