"""The one neighbour sampler: deterministic k-hop in-neighbourhoods of any graph (one type is the
one-relation case), compiled on the CPU, vectorised on a GPU."""
