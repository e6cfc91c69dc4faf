"""A compacted store continues its source's update log: what it records, where it starts, and
when it refuses to start."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from graph_assets import GraphStore, StoreError, generate_synthetic, open_store, share_store
from graph_assets.compact import compact, replay
from graph_assets.errors import UpdateLogMismatch
from graph_assets.live.log_lineage import open_update_log, update_log_path
from graph_assets.live.update_log import UpdateLog
from graph_assets.stored.store import removed_ids_file

FEATURES = 4


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    path: Path = tmp_path_factory.mktemp("lineage") / "store"
    generate_synthetic(40, 160, path, feature_dim=FEATURES, num_classes=3)
    return open_store(path)


def set_features(value: float = 0.5) -> list[dict]:
    return [{"type": "set_features", "id": 1, "x": [value] * FEATURES}]


def write_log(path: Path, seqs: list[int], operations: list[dict] | None = None) -> Path:
    """Records of one size each (the same operations), so record boundaries are predictable."""
    log = UpdateLog.open(path)
    for seq in seqs:
        with log.exclusive():
            _, end = log.read_from(0, locked=True)
            log.append(operations or set_features(), seq, at=end)
    log.close()
    return path


def compacted(base: GraphStore, log: Path, out: Path) -> GraphStore:
    compact(replay(base.path, log), out)
    return open_store(out)


def test_the_new_store_records_the_log_position_and_the_removed_ids(base, tmp_path):
    log = write_log(tmp_path / "updates.log", [1, 2])
    write_log(log, [3], [{"type": "remove_node", "id": 5}])
    store = compacted(base, log, tmp_path / "v2")
    assert store.update_log == {"base": base.checksum, "seq": 3, "offset": log.stat().st_size}
    assert store.folded_seq == 3 and store.log_base == base.checksum != store.checksum
    assert store.removed_ids.tolist() == [5] and removed_ids_file(0) in store.meta["files"]
    assert store.was_removed(5) and store.was_removed("5") and not store.was_removed(6)
    assert update_log_path(store, tmp_path / "state") == tmp_path / "state" / base.checksum / (
        "updates.log"
    )
    shared = open_store(share_store(store.path, tmp_path / "cache"))
    assert shared.removed_ids.tolist() == [5]


def test_the_log_position_is_covered_by_the_checksum(base, tmp_path):
    store = compacted(base, write_log(tmp_path / "updates.log", [1, 2]), tmp_path / "v2")
    meta = json.loads((store.path / "meta.json").read_text())
    meta["update_log"]["offset"] -= 1
    (store.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="checksum is"):
        open_store(store.path)


def test_a_store_without_updates_behaves_as_before(base, tmp_path):
    assert base.update_log is None and base.folded_seq == 0 and base.log_base == base.checksum
    assert len(base.removed_ids) == 0 and removed_ids_file(0) not in base.meta["files"]
    log, offset = open_update_log(base, tmp_path / "updates.log")
    assert offset == 0 and log.size() == 0


def test_the_log_is_read_after_the_folded_records(base, tmp_path):
    log_path = write_log(tmp_path / "updates.log", [1, 2, 3])
    store = compacted(base, log_path, tmp_path / "v2")
    write_log(log_path, [4, 5])
    log, offset = open_update_log(store, log_path)
    assert offset == store.folded_seq * (log.size() // 5)
    assert [record.seq for record in log.read_from(offset)[0]] == [4, 5]


def test_a_log_shorter_than_the_folded_records_is_refused(base, tmp_path):
    store = compacted(base, write_log(tmp_path / "updates.log", [1, 2, 3]), tmp_path / "v2")
    other = write_log(tmp_path / "other.log", [1])
    with pytest.raises(UpdateLogMismatch, match=rf"{other} is \d+ bytes, but the store's"):
        open_update_log(store, other)


def test_a_log_with_another_seq_after_the_folded_records_is_refused(base, tmp_path):
    store = compacted(base, write_log(tmp_path / "updates.log", [1, 2, 3]), tmp_path / "v2")
    other = write_log(tmp_path / "other.log", [1, 2, 3, 7])
    with pytest.raises(UpdateLogMismatch, match=f"{other} holds seq 7 at byte .*expected seq 4"):
        open_update_log(store, other)


def test_a_log_with_no_record_at_the_folded_offset_is_refused(base, tmp_path):
    store = compacted(base, write_log(tmp_path / "updates.log", [1, 2, 3]), tmp_path / "v2")
    other = write_log(tmp_path / "other.log", [1], set_features() * 10)  # one long record
    with pytest.raises(UpdateLogMismatch, match=f"{other}: no intact update record starts"):
        open_update_log(store, other)


def test_a_missing_log_is_started_at_the_next_seq(base, tmp_path, caplog):
    store = compacted(base, write_log(tmp_path / "updates.log", [1, 2, 3]), tmp_path / "v2")
    fresh = update_log_path(store, tmp_path / "fresh_state")
    with caplog.at_level(logging.WARNING, logger="graph_assets.live.log_lineage"):
        log, offset = open_update_log(store, fresh)
    assert f"update log {fresh} did not exist: started it as a new log at seq 4" in caplog.text
    with log.exclusive():
        log.append(set_features(), 4, at=offset)
    log.close()
    caplog.clear()
    reopened, again = open_update_log(store, fresh)  # another worker, later: no new warning
    assert again == offset and not caplog.text
    assert [record.seq for record in reopened.read_from(again)[0]] == [4]
    with pytest.raises(UpdateLogMismatch, match="holds seq 3 at byte 0, expected seq 1"):
        open_update_log(base, fresh)  # the source store cannot serve it: updates 1-3 are not there


def test_a_torn_tail_after_the_folded_records_is_not_written_yet(base, tmp_path):
    log_path = write_log(tmp_path / "updates.log", [1, 2, 3])
    store = compacted(base, log_path, tmp_path / "v2")
    folded = log_path.stat().st_size
    with log_path.open("ab") as tail:
        tail.write(b"GNUP\x40\x00\x00\x00garbage")
    log, offset = open_update_log(store, log_path)
    assert offset == folded and log.read_from(offset) == ([], folded)
    assert log.torn_tail is not None and log.torn_tail.offset == folded
    assert log.size() > folded  # left for the next writer, which replaces it


def test_compacting_a_compacted_store_keeps_the_original_log(base, tmp_path):
    log_path = write_log(tmp_path / "updates.log", [1, 2, 3])
    second = compacted(base, log_path, tmp_path / "v2")
    write_log(log_path, [4], [{"type": "remove_node", "id": 7}])
    write_log(log_path, [5])
    third = compacted(second, log_path, tmp_path / "v3")
    assert third.update_log == {"base": base.checksum, "seq": 5, "offset": log_path.stat().st_size}
    assert third.removed_ids.tolist() == [7]
    assert len({base.checksum, second.checksum, third.checksum}) == 3
    np.testing.assert_array_equal(
        third.features[third.lookup([1])[0]], np.full(FEATURES, 0.5, dtype=np.float32)
    )


def test_compaction_reads_the_live_log_without_changing_it(base, tmp_path):
    log_path = write_log(tmp_path / "updates.log", [1, 2])
    with log_path.open("ab") as tail:  # a writer died mid-record: compaction must not cut it
        tail.write(b"GNUP\x40\x00\x00\x00torn")
    before = log_path.read_bytes()
    store = compacted(base, log_path, tmp_path / "v2")
    assert store.update_log is not None and store.update_log["seq"] == 2
    assert log_path.read_bytes() == before
