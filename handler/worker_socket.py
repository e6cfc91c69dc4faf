"""Buffered reads of the frontend's socket in a TorchServe worker.

TorchServe 0.12's worker decodes every message from the Java frontend field by field, each
field with its own ``recv`` (``ts.protocol.otf_message_handler._retrieve_buffer``): about 25
system calls per request of a batch, 15-18% of a busy gnnserve worker's CPU (py-spy). Reading
the socket in large chunks and serving the fields from memory keeps the protocol byte for byte
and cuts those calls to one or two per batch.
"""

from __future__ import annotations

import logging
import socket
import sys
import weakref

from ts.protocol import otf_message_handler

CHUNK_BYTES = 1 << 16


class SocketReader:
    """The bytes read from one socket and not yet consumed."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = bytearray()
        self.position = 0

    def read(self, length: int) -> bytearray:
        """Exactly ``length`` bytes; like TorchServe's reader, exits the worker when the
        frontend has closed the connection. A length below 1 reads nothing, as there."""
        if length <= 0:
            return bytearray()
        while len(self.buffer) - self.position < length:
            if self.position:
                del self.buffer[: self.position]
                self.position = 0
            chunk = self.conn.recv(max(CHUNK_BYTES, length - len(self.buffer)))
            if not chunk:
                logging.info("Frontend disconnected.")
                sys.exit(0)
            self.buffer += chunk
        start = self.position
        self.position += length
        return self.buffer[start : self.position]


_readers: weakref.WeakKeyDictionary[socket.socket, SocketReader] = weakref.WeakKeyDictionary()
_last_reader: SocketReader | None = None  # a worker reads one socket: skip the dictionary


def buffered_retrieve(conn: socket.socket, length: int) -> bytearray:
    """Drop-in for TorchServe's ``_retrieve_buffer``: same arguments, same result."""
    global _last_reader
    reader = _last_reader
    if reader is None or reader.conn is not conn:
        reader = _readers.get(conn)
        if reader is None:
            reader = _readers[conn] = SocketReader(conn)
        _last_reader = reader
    return reader.read(length)


def buffer_frontend_reads() -> bool:
    """Makes this worker's message decoding read through ``buffered_retrieve``; False (and
    nothing changed) where TorchServe has no such reader, as a later release may not.

    Safe to call between two messages only (TorchServe's own reader never reads past the
    message it decodes, so nothing is left behind): the handler calls it while the model loads.
    """
    if not callable(getattr(otf_message_handler, "_retrieve_buffer", None)):
        return False
    otf_message_handler._retrieve_buffer = buffered_retrieve
    return True
