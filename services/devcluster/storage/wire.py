"""The frames between the store process and its API workers, over a Unix socket.

Each frame is a 4-byte big-endian length and a pickled tuple. Pickle, because both ends are
processes of this devcluster started by the store process itself, on a socket in the data dir
that only its owner may open (mode 0600), and the objects are tuples of str, int and bytes
that the C pickler handles without a JSON round trip of each stored object.

Worker -> store: ``("put", id, key, namespace, name, obj, expect_rv)``, ``("del", id, key,
namespace, name, last_state, expect_rv)``, ``("rv", id)`` (the store's resourceVersion now),
``("ready", pid)`` (serving HTTPS).
Store -> worker: ``("snapshot", rv, oldest_kept, objects, history)`` once, then
``("changes", [Change, ...])`` in revision order, and answers ``("ok", id, rv, raw)``,
``("stale", id, current_rv, current_raw)`` (rv 0: gone), ``("rv", id, rv)``.
"""
from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a snapshot of a large store is one frame


class ProtocolError(Exception):
    """The other end sent something that is not a frame of this protocol."""


class FrameWriter:
    """Frames written once per event-loop iteration: every frame queued in one iteration goes
    out in one ``write`` (one send system call, one wake-up of the other process), in order."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self.flush)
        self._frames.append(frame)

    def flush(self) -> None:
        if self._frames and not self.writer.is_closing():
            self.writer.write(b"".join(self._frames))
        self._frames.clear()

    def close(self) -> None:
        self.flush()
        self.writer.close()


def encode(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def read(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next frame; None at the end of the stream (the other process is gone)."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"a frame of {size} bytes is larger than {MAX_FRAME}")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None
    message = pickle.loads(body)
    if not isinstance(message, tuple) or not message:
        raise ProtocolError("a frame is not a tuple")
    return message
