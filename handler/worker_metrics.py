"""TorchServe's per-batch timings held back and written once per reporting interval.

A TorchServe 0.12 worker writes ``HandlerTime`` (``BaseHandler.handle``) and ``PredictionTime``
(``ts.service.Service``) after every batch: each a metric line of ~700 bytes (it lists the
batch's request IDs) that the worker formats (~20 us) and the frontend parses and logs. The
handler reports its own figures once per ``gnn.metrics_interval_s`` (handler.pipeline.metrics); this
wrapper around the worker's metrics cache holds those two timings for that report, which writes
each as the mean per batch of the batches since the last one, under the same name and unit.
"""

from __future__ import annotations

from typing import Any

HANDLER_TIME, PREDICTION_TIME = "HandlerTime", "PredictionTime"
HELD = (HANDLER_TIME, PREDICTION_TIME)


class HeldTimes:
    """The worker's metrics cache, except that ``HandlerTime`` and ``PredictionTime`` recorded
    as TorchServe does (name and milliseconds only) wait for :meth:`report`.

    Everything else (other metrics, ``request_ids``, which TorchServe sets per batch) goes
    straight to the wrapped cache.
    """

    def __init__(self, cache: Any) -> None:
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_held", {name: [0.0, 0] for name in HELD})  # ms summed, batches

    def add_time(self, name: str, value: float, *args: Any, **kwargs: Any) -> None:
        """Holds a plain ``HandlerTime`` or ``PredictionTime`` in ms; passes the rest on."""
        if name in self._held and not args and not kwargs:
            held = self._held[name]
            held[0] += value
            held[1] += 1
            return
        self._cache.add_time(name, value, *args, **kwargs)

    def report(self) -> None:
        """Writes each held timing's mean per batch (nothing for one that holds no batch)."""
        for name, held in self._held.items():
            total_ms, batches = held
            if batches:
                self._cache.add_time(name, round(total_ms / batches, 2), None, "ms")
                held[:] = [0.0, 0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cache, name, value)
