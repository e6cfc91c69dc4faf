"""The layout's hash tags: each group's slot in its equal share of the 16384 slots, so a
cluster of equal slot ranges holds an equal share of the blocks; a recorded layout of another
format is refused with the command that reloads it."""

from __future__ import annotations

import json

import pytest
from redis.crc import key_slot

from graph_assets.remote.layout import SLOT_GROUPS, Keys, RemoteLayout


def test_each_group_tag_hashes_into_its_share_of_the_slots() -> None:
    keys = Keys("fraud")
    slots = [key_slot(keys.block(group, "adj").encode()) for group in range(SLOT_GROUPS)]
    share = 16384 / SLOT_GROUPS
    assert [int(slot // share) for slot in slots] == list(range(SLOT_GROUPS))
    # Every field of a block, and every block of a group, shares the group's slot.
    assert key_slot(keys.block(SLOT_GROUPS + 5, "x0").encode()) == slots[5]
    assert len({keys.block(b, "adj") for b in range(1000)}) == 1000
    # Three primaries of equal ranges hold 16 groups each.
    assert [sum(int(slot * 3 // 16384) == p for slot in slots) for p in range(3)] == [16] * 3


def test_a_layout_of_another_format_is_refused_with_how_to_reload() -> None:
    with pytest.raises(ValueError) as stale:
        RemoteLayout.from_json(json.dumps({"format": 1, "block_size": 32}))
    message = str(stale.value)
    assert "\n" not in message and "layout format 1" in message
    assert "reload it with `python -m graph_assets load-redis` under a new --prefix" in message
    with pytest.raises(ValueError, match="malformed"):
        RemoteLayout.from_json("{}")
