"""The batch pipeline every task plugs into: the router over a task's engines, the one batch loop
and its fault rules, batch metrics."""
