"""Every private part of nats-py the hub relies on, and nothing else, in one place.

The first read and the bucket watch (hub/store/first_read/reader.py, hub/store/bucket_watch.py) cut
their connection's message frames themselves (hub/store/nats_frames.py), for which nats-py has no
public API: no hook for a parser of one's own, no way to take its transport's reads over,
and a subscription's id, which every frame for it names, only as a private attribute.
This module is the only one that touches them: `Parser` makes nats-py's protocol parser a
base with one seam, its methods install it and hand a connection's reads over, and
`sid_of` names a subscription as its frames do. `tests/test_nats_internals.py` pins every
name used here against the installed nats-py, on a real nats-server, so an upgrade that
changes one fails there, by name, rather than as a watch whose frames never arrive or
that reads quietly through nats-py's slow path.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client
from nats.protocol.parser import Parser as NatsParser

# What this module reads or writes, for the contract test.
CLIENT_ATTRIBUTES = ("_ps", "_transport")  # the parser its read loop feeds; its transport
TRANSPORT_ATTRIBUTES = ("_io_reader", "_io_writer")  # nats-py's TCP (and TLS) transport's
STREAM_READER_ATTRIBUTES = ("_buffer",)  # asyncio's StreamReader: what it holds unread
SUBSCRIPTION_ATTRIBUTES = ("_id",)  # the sid its frames carry
PARSER_ATTRIBUTES = ("nc", "buf")  # nats-py's parser: its client, the bytes it holds


class Parser(NatsParser):
    """nats-py's protocol parser, with the message frames taken out by a subclass.

    - `sink_frames(chunk, pos)`: handle the MSG and HMSG frames in `chunk` from `pos` on,
      up to the first line that is not one or the first incomplete frame; return where
      that is and the end of that line (-1 when it stopped at an incomplete frame or the
      end).

    `parse` is what nats-py's read loop calls with each read once `install`ed; the lines
    between frames (PING, PONG, INFO, -ERR ...) go through nats-py's own parser, one at a
    time, so nats-py answers and acts on them as it would without this parser.
    """

    def __init__(self, nc: Client | None) -> None:
        super().__init__(nc)

    def sink_frames(self, chunk: bytes, pos: int) -> tuple[int, int]:
        raise NotImplementedError

    def install(self) -> None:
        """Be the parser nats-py's read loop feeds: before `connect`, as nats-py has no
        hook for its parser."""
        self.nc._ps = self

    async def parse(self, data: bytes = b"") -> None:
        self.buf.extend(data)
        chunk = bytes(self.buf)  # one copy of the chunk; each frame is sliced out once
        pos = 0
        while True:
            pos, line_end = self.sink_frames(chunk, pos)
            if line_end < 0:
                break
            del self.buf[:line_end]
            await self._one_line(chunk[pos:line_end])
            chunk = bytes(self.buf)
            pos = 0
        del self.buf[:pos]

    async def _one_line(self, line: bytes) -> None:
        """One control line (not a message) through nats-py's own parser."""
        rest, self.buf = self.buf, bytearray(line)
        try:
            await super().parse()
        finally:
            self.buf = rest

    def unparsed(self) -> bytes:
        """What `parse` was given and holds unparsed (an incomplete frame or line)."""
        return bytes(self.buf)

    def take_reads(self) -> tuple[Any, bytes] | None:
        """The asyncio transport the connected client reads from, and every byte read from
        it that nats-py has not parsed (what this parser holds, then what nats-py's stream
        reader holds), taken out of both: whoever becomes the transport's protocol reads on
        from there. None, taking nothing, when the transport is not an asyncio one
        (nats-py's WebSocket transport)."""
        tcp = self.nc._transport
        writer = getattr(tcp, "_io_writer", None)
        reader = getattr(tcp, "_io_reader", None)
        transport: Any = getattr(writer, "transport", None)  # uvloop's: no asyncio subclass
        if transport is None or not hasattr(transport, "set_protocol") or reader is None:
            return None
        unread = bytes(self.buf) + bytes(reader._buffer)
        self.buf.clear()
        reader._buffer.clear()
        return transport, unread


def sid_of(subscription: Any) -> bytes:
    """The id a subscription's MSG and HMSG frames carry, as they carry it."""
    return str(subscription._id).encode()
