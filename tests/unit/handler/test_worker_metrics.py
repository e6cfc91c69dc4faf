"""TorchServe's per-batch HandlerTime and PredictionTime are held back and written as their
means once per report."""

from __future__ import annotations

from handler.worker_metrics import HANDLER_TIME, PREDICTION_TIME, HeldTimes

from .conftest import MockMetrics


class Recording(MockMetrics):
    """Records every argument, to check what reaches TorchServe's cache."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.request_ids: dict[int, str] = {}

    def add_time(self, name, value, *args, **kwargs) -> None:
        self.calls.append((name, value, args, kwargs))


def test_prediction_times_wait_for_the_report_and_are_written_as_their_mean() -> None:
    cache = Recording()
    held = HeldTimes(cache)
    for value in (0.4, 0.6, 0.8):
        held.add_time(PREDICTION_TIME, value)  # as ts.service.Service calls it
    assert cache.calls == []
    held.report()
    assert cache.calls == [(PREDICTION_TIME, 0.6, (None, "ms"), {})]
    held.report()  # nothing held: nothing written
    assert len(cache.calls) == 1


def test_handler_times_are_held_and_written_as_their_mean_per_batch() -> None:
    cache = Recording()
    held = HeldTimes(cache)
    for milliseconds in (4, 8, 9):
        held.add_time(HANDLER_TIME, milliseconds)  # as the handler records each batch
    held.report()
    assert cache.calls == [(HANDLER_TIME, round((4 + 8 + 9) / 3, 2), (None, "ms"), {})]


def test_everything_else_goes_straight_to_the_cache() -> None:
    cache = Recording()
    held = HeldTimes(cache)
    held.add_time(HANDLER_TIME, 1.5, None, "ms")  # not the plain call (BaseHandler's): passed on
    held.add_time(PREDICTION_TIME, 2.0, None, "s")
    held.request_ids = {0: "a"}  # TorchServe sets the batch's IDs on the cache it holds
    assert cache.calls == [
        ("HandlerTime", 1.5, (None, "ms"), {}),
        (PREDICTION_TIME, 2.0, (None, "s"), {}),
    ]
    assert cache.request_ids == {0: "a"} and held.request_ids == {0: "a"}
    held.add_metric("GnnBatchSize", 4, "Count")
    assert cache.recorded == [("GnnBatchSize", 4)]
