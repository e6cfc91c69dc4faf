"""The suite's record of CPU time the hypervisor gave to other guests (bench.harness.watch)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.harness import watch
from bench.harness.watch import host_steal, steal_percent

# /proc/stat's aggregate line: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice: they must not be summed again.
BEFORE = "cpu  1000 0 500 8000 100 0 50 350 40 0\ncpu0 9 9 9 9 9 9 9 9 9 9\nintr 1 2 3\n"
AFTER = "cpu  1600 0 700 9000 150 0 70 480 90 0\ncpu0 1 1 1 1 1 1 1 1 1 1\nintr 4 5 6\n"


class ProcStat:
    """Stands in for ``Path`` in bench.harness.watch: each /proc/stat read returns the next text."""

    def __init__(self, *snapshots: str) -> None:
        self.snapshots = list(snapshots)

    def __call__(self, path: str) -> ProcStat:
        assert path == "/proc/stat"
        return self

    def read_text(self) -> str:
        return self.snapshots.pop(0)


@pytest.fixture()
def proc_stat(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ProcStat]:
    def feed(*snapshots: str) -> ProcStat:
        fake = ProcStat(*snapshots)
        monkeypatch.setattr(watch, "Path", fake)
        return fake

    return feed


def test_steal_and_total_are_read_from_the_aggregate_line_without_guest_time(proc_stat):
    proc_stat(BEFORE)
    # the first 8 fields only: 1000+0+500+8000+100+0+50+350; the cpu0 line is not read
    assert host_steal() == (350, 10_000)


def test_steal_percent_is_the_share_of_the_ticks_since_the_mark(proc_stat):
    fake = proc_stat(BEFORE, AFTER)
    mark = host_steal()
    # (480 - 350) stolen of (12000 - 10000) ticks
    assert steal_percent(mark) == 6.5
    assert fake.snapshots == []  # /proc/stat read once per call


def test_steal_percent_rounds_to_one_decimal(proc_stat):
    proc_stat("cpu  100 0 0 0 0 0 0 0 0 0\n", "cpu  100 0 0 2 0 0 0 1 0 0\n")
    assert steal_percent(host_steal()) == 33.3  # 1 of 3


def test_no_tick_since_the_mark_is_zero_percent_not_a_division_by_zero(proc_stat):
    proc_stat(BEFORE, BEFORE)
    assert steal_percent(host_steal()) == 0.0


def test_a_steal_counter_that_went_backwards_gives_a_negative_share_as_read(proc_stat):
    # Some kernels' steal counter has stepped back; the suite reports the difference unclamped:
    # (300 - 350) of (11920 - 10000) ticks.
    proc_stat(BEFORE, "cpu  1700 0 700 9000 150 0 70 300 0 0\n")
    assert steal_percent(host_steal()) == -2.6


def test_a_stat_line_without_the_steal_column_is_an_error_not_zero_steal(proc_stat):
    # Kernels before 2.6.11 (and some containers' fake /proc) stop after softirq.
    proc_stat("cpu  1000 0 500 8000 100 0 50\n")
    with pytest.raises(IndexError):
        host_steal()


def test_all_ticks_stolen_since_the_mark_is_a_hundred_percent():
    steal, total = host_steal()
    # A mark as if every tick since boot but the first had been stolen.
    assert steal_percent((steal - total + 1, 1)) >= 99.0
