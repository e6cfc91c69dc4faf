"""The update log on a Redis stream, against a real redis-server: whole records in seq order,
one writer per seq, start markers for compacted stores, unreachable and unreplicated writes."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass

import pytest
import redis

from graph_assets.errors import (
    UpdateLogConflict,
    UpdateLogCorrupt,
    UpdateLogMismatch,
    UpdateLogUnavailable,
    UpdateLogWriteFailed,
    UpdateNotReplicated,
)
from graph_assets.live.operations import LOG_FORMAT
from graph_assets.live.redis_log import (
    KEY_PREFIX,
    RedisLogConfig,
    open_redis_update_log,
    read_password_file,
    shown_url,
)
from tests.servers.ports import free_ports

ADD = [{"type": "add_node", "id": 7, "x": [0.5, 0.5]}]


@dataclass(frozen=True)
class Lineage:
    """What opening a log reads of a store."""

    log_base: str = "a" * 64
    checksum: str = "a" * 64
    folded_seq: int = 0


def test_records_come_back_whole_and_in_seq_order(redis_server):
    log, start = open_redis_update_log(Lineage(), RedisLogConfig(redis_server.url))
    assert (start, log.size()) == (0, 0)
    for seq in (1, 2, 3):
        assert log.append([{**ADD[0], "id": seq}], seq, at=seq - 1) == seq
    records, end = log.read_from(0)
    assert [r.seq for r in records] == [1, 2, 3] and end == 3 and log.size() == 3
    assert records[1].operations == [{**ADD[0], "id": 2}]
    assert log.read_from(2)[0][0].seq == 3 and log.read_from(3) == ([], 3)
    assert redis_server.client().exists(KEY_PREFIX + "a" * 64)


def test_two_writers_cannot_both_write_one_seq(redis_server):
    first, _ = open_redis_update_log(Lineage(), RedisLogConfig(redis_server.url))
    second, _ = open_redis_update_log(Lineage(), RedisLogConfig(redis_server.url))
    first.append(ADD, 1, at=0)
    with pytest.raises(UpdateLogConflict, match="seq 1 was written by another server first"):
        second.append(ADD, 1, at=0)
    assert [r.seq for r in second.read_from(0)[0]] == [1]


def test_a_compacted_store_starts_an_empty_stream_and_refuses_another(redis_server):
    config = RedisLogConfig(redis_server.url)
    log, start = open_redis_update_log(Lineage(folded_seq=5), config)
    assert start == 5 and log.size() == 5 and log.read_from(5) == ([], 5)
    log.append(ADD, 6, at=5)
    again, start = open_redis_update_log(Lineage(folded_seq=5), config)
    assert start == 5 and [r.seq for r in again.read_from(5)[0]] == [6]
    with pytest.raises(UpdateLogMismatch, match="does not hold seq 9"):
        open_redis_update_log(Lineage(folded_seq=9), config)


def test_an_unreachable_server_is_named_without_its_password():
    (port,) = free_ports(1)
    config = RedisLogConfig(f"redis://app:s3cret@127.0.0.1:{port}/0", timeout_s=0.5)
    with pytest.raises(UpdateLogUnavailable, match=f"app:\\*\\*\\*@127.0.0.1:{port}") as error:
        open_redis_update_log(Lineage(), config)
    assert "s3cret" not in str(error.value)


def test_a_write_no_replica_confirms_is_not_acknowledged_but_stays(redis_server):
    config = RedisLogConfig(redis_server.url, wait_replicas=1, wait_timeout_ms=50)
    log, _ = open_redis_update_log(Lineage(), config)
    with pytest.raises(UpdateNotReplicated, match="0 of the 1 required replicas"):
        log.append(ADD, 1, at=0)
    assert log.size() == 1  # in the log: every server applies it, but nobody was told 200


def test_a_timeout_after_the_record_was_sent_says_it_may_be_written(redis_server, monkeypatch):
    """Redis ran the append, then the answer timed out: the refusal never claims nothing was
    written, and names the seq to look for."""
    log, _ = open_redis_update_log(Lineage(), RedisLogConfig(redis_server.url))
    real = log._append_after

    def written_then_timed_out(*args, **kwargs):
        real(*args, **kwargs)
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(log, "_append_after", written_then_timed_out)
    with pytest.raises(UpdateLogUnavailable, match="may have been written as seq 1") as refused:
        log.append(ADD, 1, at=0)
    assert "below +1" in str(refused.value) and log.size() == 1


def test_a_wait_that_times_out_is_written_but_not_acknowledged(redis_server, monkeypatch):
    config = RedisLogConfig(redis_server.url, wait_replicas=1)
    log, _ = open_redis_update_log(Lineage(), config)

    def timed_out(*args, **kwargs):
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(log.client, "wait", timed_out)
    with pytest.raises(UpdateNotReplicated, match="seq 1 was written but Redis did not answer"):
        log.append(ADD, 1, at=0)
    assert log.size() == 1


def test_a_full_redis_refuses_the_record_whole(own_redis_server):
    log, _ = open_redis_update_log(Lineage(), RedisLogConfig(own_redis_server.url))
    own_redis_server.client().config_set("maxmemory", "1")
    with pytest.raises(UpdateLogWriteFailed, match="maxmemory") as refused:
        log.append(ADD, 1, at=0)
    assert refused.value.errno == errno.ENOSPC and refused.value.rolled_back
    own_redis_server.client().config_set("maxmemory", "0")
    assert log.size() == 0


def test_configuration_comes_from_the_environment(tmp_path):
    assert RedisLogConfig.from_environment({}) is None
    secret = tmp_path / "password"
    secret.write_text("pw\n")
    os.chmod(secret, 0o640)
    config = RedisLogConfig.from_environment(
        {
            "GNNSERVE_UPDATE_LOG_URL": "rediss://cache:6380/2",
            "GNNSERVE_REDIS_PASSWORD_FILE": str(secret),
            "GNNSERVE_REDIS_WAIT_REPLICAS": "1",
        }
    )
    assert config is not None and config.wait_replicas == 1 and config.wait_timeout_ms == 1000
    assert read_password_file(str(secret)) == "pw"
    os.chmod(secret, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_password_file(str(secret))
    with pytest.raises(ValueError, match="redis://host:port/db"):
        RedisLogConfig.from_environment({"GNNSERVE_UPDATE_LOG_URL": "http://x"})
    with pytest.raises(ValueError, match="non-negative integer"):
        RedisLogConfig.from_environment(
            {"GNNSERVE_UPDATE_LOG_URL": "redis://x:1/0", "GNNSERVE_REDIS_WAIT_REPLICAS": "-1"}
        )
    assert shown_url("redis://u:p@h:1/0") == "redis://u:***@h:1/0"
    assert shown_url("redis://h:1/0") == "redis://h:1/0"


def test_entries_say_their_format_and_older_ones_still_read(redis_server):
    log, _ = open_redis_update_log(Lineage(), RedisLogConfig(redis_server.url))
    log.append(ADD, 1, at=0)
    key, client = KEY_PREFIX + "a" * 64, redis_server.client()
    [(_, fields)] = client.xrange(key)
    assert fields[b"format"] == str(LOG_FORMAT).encode()
    client.xadd(key, {"operations": json.dumps(ADD)}, id="2-0")  # format 1: no field
    assert [r.seq for r in log.read_from(0)[0]] == [1, 2]
    client.xadd(key, {"operations": json.dumps(ADD), "format": LOG_FORMAT + 1}, id="3-0")
    with pytest.raises(UpdateLogCorrupt, match="newer than this gnnserve reads"):
        log.read_from(0)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"format": "null"}, "format None"),
        ({"format": "0"}, "format 0"),
        ({"format": "-1"}, "format -1"),
        ({"format": "1.9"}, "format 1.9"),
        ({"format": "two"}, "cannot be read"),
        ({"operations": '"add_node"'}, "not a list of objects"),
        ({"operations": "{not json"}, "cannot be read"),
        ({"operations": None}, "cannot be read"),  # no operations field at all
        ({"undo": "1"}, "unknown field"),
    ],
)
def test_an_entry_that_is_not_a_well_formed_record_stops_replay_and_stays(
    redis_server, fields, reason
):
    log, _ = open_redis_update_log(Lineage(), RedisLogConfig(redis_server.url))
    log.append(ADD, 1, at=0)
    key, client = KEY_PREFIX + "a" * 64, redis_server.client()
    entry = {"operations": json.dumps(ADD), "format": str(LOG_FORMAT), **fields}
    client.xadd(key, {name: value for name, value in entry.items() if value is not None}, id="2-0")
    with pytest.raises(UpdateLogCorrupt, match=f"the record of seq 2 .*{reason}"):
        log.read_from(0)
    assert log.size() == 2
    with pytest.raises(UpdateLogConflict):  # a writer behind it never takes its seq
        log.append(ADD, 2, at=1)
    assert client.xlen(key) == 2
