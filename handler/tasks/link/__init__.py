"""Link prediction: pair scores, top-k recommendations, pair explanations."""
