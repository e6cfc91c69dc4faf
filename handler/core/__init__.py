"""The serving core every task shares: the batch pipeline and its fault rules, the router over a
task's engines, the graph view and sampler, explanations, settings and batch metrics."""
