"""Graph classification: inline graphs, graph explanations."""
