"""The buffered frontend reader and the one-pass batch decoder decode exactly what
TorchServe's own reader decodes."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ts.protocol import otf_message_handler
from ts.service import Service

from handler import worker_socket
from handler.protocol import body as body_module

from .conftest import started

ORIGINAL_READER = otf_message_handler._retrieve_buffer
ORIGINAL_BATCH = otf_message_handler._retrieve_inference_msg
TORCHSERVE = (ORIGINAL_READER, ORIGINAL_BATCH)
OURS = (worker_socket.buffered_retrieve, worker_socket.buffered_inference_msg)


def _field(value: bytes) -> bytes:
    return struct.pack("!i", len(value)) + value


Parameter = tuple[bytes, str, bytes]  # name, content type, value


def inference_frame(
    requests: list[tuple[bytes, list[tuple[bytes, bytes]], bytes, str]],
    extra: list[Parameter] | None = None,
) -> bytes:
    """One batch as the Java frontend writes it: cmd, then per request its ID, headers and a
    ``body`` parameter (then ``extra`` ones), each list ended by -1."""
    end = struct.pack("!i", -1)
    frame = b"I"
    for request_id, headers, body, content_type in requests:
        frame += _field(request_id)
        for name, value in headers:
            frame += _field(name) + _field(value)
        frame += end
        for name, kind, value in [(b"body", content_type, body), *(extra or [])]:
            frame += _field(name) + _field(kind.encode()) + _field(value)
        frame += end
    return frame + end


def decode_all(frames: bytes, count: int, chunks: list[int], decoders=OURS) -> list:
    """Sends ``frames`` in pieces of the given sizes from another thread and decodes ``count``
    messages with ``decoders`` (a field reader, a batch decoder) installed in TorchServe."""
    server, client = socket.socketpair()

    def send() -> None:
        offset, sizes = 0, iter(chunks)
        while offset < len(frames):
            size = next(sizes, len(frames))
            client.sendall(frames[offset : offset + size])
            offset += size
            time.sleep(0)
        client.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    previous = otf_message_handler._retrieve_buffer, otf_message_handler._retrieve_inference_msg
    otf_message_handler._retrieve_buffer, otf_message_handler._retrieve_inference_msg = decoders
    try:
        return [otf_message_handler.retrieve_msg(server) for _ in range(count)]
    finally:
        otf_message_handler._retrieve_buffer = previous[0]
        otf_message_handler._retrieve_inference_msg = previous[1]
        sender.join()
        server.close()
        client.close()


requests_strategy = st.lists(
    st.tuples(
        st.binary(min_size=1, max_size=40),
        st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=60)), max_size=6),
        st.one_of(
            st.binary(max_size=300),
            st.sampled_from(
                [b'{"node_id": 3}', b'{"node_ids": [1, "a"]}', b"{bad json", b"\xff\xfe", b""]
            ),
        ),
        st.sampled_from(["application/json", "application/octet-stream", "text/plain", ""]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(requests_strategy, min_size=1, max_size=4),
    chunks=st.lists(st.integers(min_value=1, max_value=200), max_size=30),
    extra=st.lists(
        st.tuples(  # the frontend writes names as UTF-8 (TorchServe's decoder requires it)
            st.text(max_size=8).map(str.encode),
            st.sampled_from(["text/csv", "image/png"]),
            st.binary(),
        ),
        max_size=2,
    ),
)
def test_buffered_reads_decode_like_torchserve(batches, chunks, extra) -> None:
    frames = b"".join(inference_frame(batch, extra) for batch in batches)
    expected = decode_all(frames, len(batches), chunks, TORCHSERVE)
    assert decode_all(frames, len(batches), chunks, OURS) == expected
    reader_only = (worker_socket.buffered_retrieve, ORIGINAL_BATCH)
    assert decode_all(frames, len(batches), chunks, reader_only) == expected


def test_undecodable_inputs_are_forwarded_as_bytes_like_torchserve(monkeypatch) -> None:
    too_deep = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError
    frame = inference_frame(
        [(b"r1", [], too_deep, "application/json"), (b"r2", [], b"\xff", "text/plain")]
    )
    expected = decode_all(frame, 1, [], TORCHSERVE)
    assert decode_all(frame, 1, [], OURS) == expected
    assert expected[0][1][0]["parameters"][0]["value"] == too_deep
    monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "false")  # then no value is decoded
    frame = inference_frame([(b"r1", [], b'{"node_id": 3}', "application/json")])
    decoded = decode_all(frame, 1, [], OURS)
    assert decoded == decode_all(frame, 1, [], TORCHSERVE)
    assert decoded[0][1][0]["parameters"][0]["value"] == b'{"node_id": 3}'


def test_a_body_larger_than_a_chunk_arrives_whole() -> None:
    body = bytes(range(256)) * (3 * worker_socket.CHUNK_BYTES // 256 + 7)
    frame = inference_frame([(b"r1", [(b"h", b"v")], body, "application/octet-stream")] * 3) * 2
    messages = decode_all(frame, 2, [1000, 5, 70_000], OURS)
    for cmd, batch in messages:
        assert cmd == b"I"
        assert [request["parameters"][0]["value"] for request in batch] == [body] * 3


def test_empty_and_negative_lengths_read_nothing_like_torchserve() -> None:
    server, client = socket.socketpair()
    client.sendall(b"abc")
    for length in (0, -1, -7):
        assert worker_socket.buffered_retrieve(server, length) == ORIGINAL_READER(server, length)
    assert worker_socket.buffered_retrieve(server, 3) == b"abc"
    server.close()
    client.close()


def count_field_by_field_reads(monkeypatch) -> list[worker_socket.SocketReader]:
    """The readers whose batch was finished field by field, one entry per batch."""
    calls = []
    read = worker_socket.SocketReader._read_field_by_field

    def counted(reader):
        calls.append(reader)
        return read(reader)

    monkeypatch.setattr(worker_socket.SocketReader, "_read_field_by_field", counted)
    return calls


LARGE_BODY = b'{"x": "' + b"7" * 200_000 + b'"}'
LARGE_BATCH = inference_frame(
    [(b"r%d" % i, [(b"h", b"v")], LARGE_BODY, "application/json") for i in range(4)]
)


def test_a_batch_that_arrives_in_many_pieces_is_finished_field_by_field(monkeypatch) -> None:
    calls = count_field_by_field_reads(monkeypatch)
    small = inference_frame([(b"s1", [(b"h", b"v")], b'{"node_id": 3}', "application/json")])
    frames = LARGE_BATCH + small + LARGE_BATCH
    chunks = [50_000] * (2 * len(LARGE_BATCH) // 50_000 + 2)
    assert decode_all(frames, 3, chunks) == decode_all(frames, 3, chunks, TORCHSERVE)
    assert len(calls) == 2  # the two large batches, each after DECODE_ATTEMPTS decodes


def test_the_field_by_field_finish_works_without_our_reader_installed(monkeypatch) -> None:
    calls = count_field_by_field_reads(monkeypatch)
    chunks = [50_000] * (len(LARGE_BATCH) // 50_000 + 1)
    torchserve_reader = (ORIGINAL_READER, worker_socket.buffered_inference_msg)
    expected = decode_all(LARGE_BATCH, 1, chunks, TORCHSERVE)
    assert decode_all(LARGE_BATCH, 1, chunks, torchserve_reader) == expected
    assert len(calls) == 1
    assert [r["parameters"][0]["value"] for r in expected[0][1]] == [{"x": "7" * 200_000}] * 4


class MemoryShortJson:
    """``json`` whose ``loads`` runs out of memory on any text that holds ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def loads(self, text, **kwargs):
        if self.marker in text:
            raise MemoryError
        return json.loads(text, **kwargs)


def test_a_body_whose_decoding_runs_out_of_memory_is_413_and_its_batch_is_answered(
    model_dir, monkeypatch
) -> None:
    short = MemoryShortJson("huge")
    for module in (worker_socket, otf_message_handler, body_module):  # memory stays short
        monkeypatch.setattr(module, "json", short)
    huge = b'{"node_ids": [1, 2], "huge": 1}'
    frame = inference_frame(
        [
            (b"r1", [], b'{"node_id": 0}', "application/json"),
            (b"r2", [], huge, "application/json"),
            (b"r3", [], b'{"node_id": 3}', "application/json"),
        ]
    )
    ((cmd, batch),) = decode_all(frame, 1, [], OURS)
    assert [(cmd, batch)] == decode_all(frame, 1, [], TORCHSERVE)  # the bytes passed on
    assert [r["parameters"][0]["value"] for r in batch] == [{"node_id": 0}, huge, {"node_id": 3}]
    handler, context = started(model_dir, 3, fanouts=[-1, -1])
    _, data, _ = Service.retrieve_data_for_inference(batch)
    output = handler.handle(data, context)
    assert [context.get_response_status(i)[0] for i in range(3)] == [200, 413, 200]
    message = (
        "the body is too large to parse in this worker's memory; send fewer IDs, pairs or a "
        "smaller graph per request"
    )
    assert json.loads(output[1]) == {
        "code": 413,
        "type": "TooLarge",
        "message": message,
        "error": message,
    }
    assert [json.loads(output[i])["node_id"] for i in (0, 2)] == [0, 3]


def test_the_worker_exits_when_the_frontend_disconnects() -> None:
    server, client = socket.socketpair()
    client.sendall(b"I" + struct.pack("!i", 10) + b"abc")  # cut off inside a request ID
    client.close()
    assert worker_socket.buffered_retrieve(server, 1) == b"I"
    assert worker_socket.buffered_retrieve(server, 4) == struct.pack("!i", 10)
    with pytest.raises(SystemExit):
        worker_socket.buffered_retrieve(server, 10)
    server.close()


def test_the_worker_exits_when_the_frontend_disconnects_inside_a_batch() -> None:
    server, client = socket.socketpair()
    frame = inference_frame([(b"r1", [(b"h", b"v")], b"{}", "application/json")])
    client.sendall(frame[:-9])  # cut off inside the body
    client.close()
    assert worker_socket.buffered_retrieve(server, 1) == b"I"
    with pytest.raises(SystemExit):
        worker_socket.buffered_inference_msg(server)
    server.close()


def test_buffer_frontend_reads_installs_the_reader_and_the_decoder(monkeypatch) -> None:
    monkeypatch.setattr(otf_message_handler, "_retrieve_buffer", ORIGINAL_READER)
    monkeypatch.setattr(otf_message_handler, "_retrieve_inference_msg", ORIGINAL_BATCH)
    assert worker_socket.buffer_frontend_reads()
    assert otf_message_handler._retrieve_buffer is worker_socket.buffered_retrieve
    assert otf_message_handler._retrieve_inference_msg is worker_socket.buffered_inference_msg


@pytest.mark.parametrize("missing", ["_retrieve_buffer", "_retrieve_inference_msg"])
def test_buffer_frontend_reads_leaves_an_unknown_torchserve_alone(monkeypatch, missing) -> None:
    monkeypatch.setattr(otf_message_handler, "_retrieve_buffer", ORIGINAL_READER)
    monkeypatch.setattr(otf_message_handler, "_retrieve_inference_msg", ORIGINAL_BATCH)
    monkeypatch.delattr(otf_message_handler, missing)
    assert not worker_socket.buffer_frontend_reads()
    assert otf_message_handler.__dict__.get("_retrieve_buffer") in (ORIGINAL_READER, None)
    assert otf_message_handler.__dict__.get("_retrieve_inference_msg") in (ORIGINAL_BATCH, None)
