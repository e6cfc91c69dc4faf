"""Live graph updates: the update log a worker appends to and follows, and the graph version
every answer reports."""
