"""The suite's record of CPU time the hypervisor gave to other guests."""

from __future__ import annotations

from bench.suite import host_steal, steal_percent


def test_steal_is_a_share_of_the_ticks_since_the_mark():
    steal, total = host_steal()
    assert 0 <= steal <= total
    assert 0.0 <= steal_percent((steal, total)) <= 100.0


def test_all_ticks_stolen_since_the_mark_is_a_hundred_percent():
    steal, total = host_steal()
    # A mark as if every tick since boot but the first had been stolen.
    assert steal_percent((steal - total + 1, 1)) >= 99.0
