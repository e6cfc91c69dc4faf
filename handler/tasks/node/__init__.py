"""Node classification: predictions, embeddings, cold-start nodes, explanations, updates."""
