"""The edge of the handler: request bodies decoded once, KServe v2 and JSON shapes, validation
worded for clients, error types and the one table that gives each its HTTP status."""
