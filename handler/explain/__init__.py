"""Explanations on an ego-graph, one type or several: Integrated Gradients through PyG's Captum
path, budgets and listings."""
