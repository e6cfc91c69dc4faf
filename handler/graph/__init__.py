"""The graph as a worker serves it: where the store comes from, ego-graphs and their features,
precomputed rows kept exact under updates."""
