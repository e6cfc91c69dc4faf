"""TorchServe's per-batch ``PredictionTime`` held back and reported once per interval.

TorchServe 0.12's worker records ``PredictionTime`` after every batch (``ts.service.Service``):
a metric line of ~700 bytes (it lists the batch's request IDs) that the worker formats and the
frontend parses and logs, 2-3 us per request of a 16-request batch between the two. The handler
already reports its own figures once per ``gnn.metrics_interval_s`` (handler.core.metrics); this
wrapper around the worker's metrics cache holds ``PredictionTime`` back for that report, which
writes the mean per batch of the batches since the last one under the same name and unit.
"""

from __future__ import annotations

from typing import Any

PREDICTION_TIME = "PredictionTime"


class HeldPredictionTime:
    """The worker's metrics cache, except that ``PredictionTime`` waits for :meth:`report`.

    Everything else (other metrics, ``request_ids``, which TorchServe sets per batch) goes
    straight to the wrapped cache.
    """

    def __init__(self, cache: Any) -> None:
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_held", [0.0, 0])  # milliseconds summed, batches

    def add_time(self, name: str, value: float, *args: Any, **kwargs: Any) -> None:
        """Holds a plain ``PredictionTime`` in ms (TorchServe's call); passes the rest on."""
        if name == PREDICTION_TIME and not args and not kwargs:
            self._held[0] += value
            self._held[1] += 1
            return
        self._cache.add_time(name, value, *args, **kwargs)

    def report(self) -> None:
        """Writes the held batches' mean ``PredictionTime`` (nothing when none is held)."""
        total_ms, batches = self._held
        if batches:
            self._cache.add_time(PREDICTION_TIME, round(total_ms / batches, 2), None, "ms")
            self._held[:] = [0.0, 0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cache, name, value)
