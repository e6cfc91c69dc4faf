"""The buffered frontend reader decodes exactly what TorchServe's own reader decodes."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ts.protocol import otf_message_handler

from handler import worker_socket

ORIGINAL_READER = otf_message_handler._retrieve_buffer


def _field(value: bytes) -> bytes:
    return struct.pack("!i", len(value)) + value


def inference_frame(requests: list[tuple[bytes, list[tuple[bytes, bytes]], bytes, str]]) -> bytes:
    """One batch as the Java frontend writes it: cmd, then per request its ID, headers and one
    ``body`` parameter, each list ended by -1."""
    end = struct.pack("!i", -1)
    frame = b"I"
    for request_id, headers, body, content_type in requests:
        frame += _field(request_id)
        for name, value in headers:
            frame += _field(name) + _field(value)
        frame += end
        frame += _field(b"body") + _field(content_type.encode()) + _field(body)
        frame += end
    return frame + end


def decode_all(frames: bytes, count: int, chunks: list[int], reader) -> list:
    """Sends ``frames`` in pieces of the given sizes from another thread and decodes ``count``
    messages with ``reader`` installed as TorchServe's field reader."""
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
    previous = otf_message_handler._retrieve_buffer
    otf_message_handler._retrieve_buffer = reader
    try:
        return [otf_message_handler.retrieve_msg(server) for _ in range(count)]
    finally:
        otf_message_handler._retrieve_buffer = previous
        sender.join()
        server.close()
        client.close()


requests_strategy = st.lists(
    st.tuples(
        st.binary(min_size=1, max_size=40),
        st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=60)), max_size=6),
        st.one_of(
            st.binary(max_size=300),
            st.sampled_from([b'{"node_id": 3}', b'{"node_ids": [1, "a"]}', b"{bad json"]),
        ),
        st.sampled_from(["application/json", "application/octet-stream", "text/plain"]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(requests_strategy, min_size=1, max_size=4),
    chunks=st.lists(st.integers(min_value=1, max_value=200), max_size=30),
)
def test_buffered_reads_decode_like_torchserve(batches, chunks) -> None:
    frames = b"".join(inference_frame(batch) for batch in batches)
    expected = decode_all(frames, len(batches), chunks, ORIGINAL_READER)
    assert decode_all(frames, len(batches), chunks, worker_socket.buffered_retrieve) == expected


def test_a_body_larger_than_a_chunk_arrives_whole() -> None:
    body = bytes(range(256)) * (3 * worker_socket.CHUNK_BYTES // 256 + 7)
    frame = inference_frame([(b"r1", [(b"h", b"v")], body, "application/octet-stream")]) * 2
    messages = decode_all(frame, 2, [1000, 5, 70_000], worker_socket.buffered_retrieve)
    for cmd, batch in messages:
        assert cmd == b"I"
        assert batch[0]["parameters"][0]["value"] == body


def test_empty_and_negative_lengths_read_nothing_like_torchserve() -> None:
    server, client = socket.socketpair()
    client.sendall(b"abc")
    for length in (0, -1, -7):
        assert worker_socket.buffered_retrieve(server, length) == ORIGINAL_READER(server, length)
    assert worker_socket.buffered_retrieve(server, 3) == b"abc"
    server.close()
    client.close()


def test_the_worker_exits_when_the_frontend_disconnects() -> None:
    server, client = socket.socketpair()
    client.sendall(b"I" + struct.pack("!i", 10) + b"abc")  # cut off inside a request ID
    client.close()
    assert worker_socket.buffered_retrieve(server, 1) == b"I"
    assert worker_socket.buffered_retrieve(server, 4) == struct.pack("!i", 10)
    with pytest.raises(SystemExit):
        worker_socket.buffered_retrieve(server, 10)
    server.close()


def test_buffer_frontend_reads_installs_the_reader(monkeypatch) -> None:
    monkeypatch.setattr(otf_message_handler, "_retrieve_buffer", ORIGINAL_READER)
    assert worker_socket.buffer_frontend_reads()
    assert otf_message_handler._retrieve_buffer is worker_socket.buffered_retrieve


def test_buffer_frontend_reads_leaves_an_unknown_torchserve_alone(monkeypatch) -> None:
    monkeypatch.delattr(otf_message_handler, "_retrieve_buffer")
    assert not worker_socket.buffer_frontend_reads()
    assert not hasattr(otf_message_handler, "_retrieve_buffer")
