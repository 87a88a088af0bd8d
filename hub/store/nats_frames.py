"""Reading JetStream deliveries straight off a connection of their own.

Through nats-py's subscription path each message costs a parse by regular expressions, a
`Msg`, its headers parsed into a dict, a queue and a task wake-up before the hub even
looks at it. The hub's two readers of the task bucket, the first read
(hub/store/first_read/reader.py) and the watch (hub/store/bucket_watch.py), each run on a
connection with one subscription, their inbox, so every MSG and HMSG frame on it is theirs:
`FrameCutter` cuts them in a single pass and hands them over in batches, in order; every other
operation (PING, INFO, -ERR) still goes to nats-py's parser.

Once connected, `attach` makes the cutter the connection's asyncio protocol, so each read
is cut in the loop's own callback as it arrives. Through nats-py's reader, a read is
first copied into its stream reader, then wakes its read-loop task, which reads it out and
hands it to the parser: a future, a task step and a loop turn more per read, which at one
revision per read weighs on the watch (docs/architecture.md#watch-and-catch-up). The lines
that are not frames go on to nats-py's reader, whose read loop parses them as it would
without the cutter. What this needs of nats-py's private parts is in
hub/store/nats_internals.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient

from bridge.wire import is_removal
from hub.store import nats_internals

Frame = tuple[bytes, bytes, bytes | None, bytes]  # subject, reply, headers, payload
# Apply one message: key, stream sequence, whether it removes the key's task, its payload.
Apply = Callable[[str, int, bool, bytes], None]


class FrameCutter(nats_internals.Parser):
    """nats-py's parser, with MSG and HMSG frames cut in one pass and handed to `sink` in
    batches, in order; other operations are given to nats-py's parser a line at a time.

    Bytes come through `parse`, from nats-py's read loop, until `attach`; after it, through
    the connection's protocol (`_Tap`), which hands every line that is not a frame to
    nats-py's reader, and so back to `parse`."""

    def __init__(self, nc: NatsClient, sink: Callable[[list[Frame]], None]) -> None:
        super().__init__(nc)
        self.sink = sink
        # When set, only this subscription's frames are handed over; an earlier one's
        # still in flight after it was replaced are dropped, as nats-py drops them.
        self.sid: bytes | None = None
        self._tap: _Tap | None = None
        self._rest = b""  # the direct path's incomplete frame or line, to be continued

    def attach(self) -> bool:
        """Read the connection's bytes in its protocol from now on; False (nothing changed)
        when its transport is not an asyncio one (nats-py's WebSocket transport)."""
        taken = self.take_reads()
        if taken is None:
            return False
        # The stream goes on where nats-py's reader and this parser left it: what they hold
        # and have not parsed yet is cut first (after `connect`, rarely anything).
        transport, self._rest = taken
        self._tap = _Tap(self, transport.get_protocol())
        transport.set_protocol(self._tap)
        if self._rest:
            self.cut(b"")
        return True

    @property
    def attached(self) -> bool:
        return self._tap is not None

    def cut(self, data: bytes) -> None:
        """The direct path: frames to `sink`, other lines to nats-py's reader, as read."""
        assert self._tap is not None
        chunk = self._rest + data if self._rest else data
        pos = 0
        while True:
            pos, line_end = self.sink_frames(chunk, pos)
            if line_end < 0:
                break
            self._tap.inner.data_received(chunk[pos:line_end])  # PING, INFO, -ERR ...
            pos = line_end
        self._rest = chunk[pos:]

    def sink_frames(self, chunk: bytes, pos: int) -> tuple[int, int]:
        """The frames in `chunk` from `pos` on, to `sink` as one batch, up to the first
        line that is not one or the first incomplete frame; where that stops, and the end
        of that line (-1 when it stopped at an incomplete frame or the end)."""
        frames: list[Frame] = []
        size, sid = len(chunk), self.sid
        line_end = -1
        while pos < size:
            eol = chunk.find(b"\r\n", pos)
            if eol < 0:
                break
            if chunk.startswith(b"HMSG ", pos):  # first: the bridge's writes carry headers
                args = chunk[pos + 5 : eol].split()
                header_size, reply = int(args[-2]), args[2] if len(args) == 5 else b""
            elif chunk.startswith(b"MSG ", pos):
                args = chunk[pos + 4 : eol].split()
                header_size, reply = 0, args[2] if len(args) == 4 else b""
            else:
                line_end = eol + 2
                break
            start = eol + 2
            end = start + int(args[-1])
            if end + 2 > size:
                break  # the rest of this frame is still on its way
            if sid is None or args[1] == sid:
                headers = chunk[start : start + header_size] if header_size else None
                frames.append((args[0], reply, headers, chunk[start + header_size : end]))
            pos = end + 2
        if frames:
            self.sink(frames)
        return pos, line_end


class _Tap(asyncio.Protocol):
    """The connection's protocol once attached: reads go to the cutter; the connection's
    other events to nats-py's own protocol (its stream reader and writer), which sees
    the lost connection, the end of the stream and the write buffer's pauses as it would
    without the cutter."""

    def __init__(self, cutter: FrameCutter, inner: Any) -> None:
        self.cut = cutter.cut
        self.inner = inner

    def data_received(self, data: bytes) -> None:
        self.cut(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def is_delivery(reply: bytes) -> bool:
    """A stored message delivered by a consumer (else a status message: 100, 409, ...)."""
    return reply.startswith(b"$JS.ACK.")


def stream_sequence(reply: bytes) -> int | None:
    """A delivery's stream sequence alone (`delivery_sequences` below names the reply's
    tokens), or None for a status message: the first read's one look at each message."""
    tokens = reply.split(b".")
    if tokens[0] != b"$JS" or tokens[1] != b"ACK":
        return None
    return int(tokens[5 if len(tokens) == 9 else 7])


def delivery_sequences(reply: bytes) -> tuple[int, int, int]:
    """Stream sequence, consumer sequence and messages pending, from a delivery's reply:
    $JS.ACK.<stream>.<consumer>.<n>.<sseq>.<cseq>.<ts>.<pending>, or with <domain>.<account
    hash> before <stream> and a <token> after <pending>."""
    tokens = reply.rsplit(b".", 5 if reply.count(b".") == 11 else 4)
    return int(tokens[1]), int(tokens[2]), int(tokens[4])


def removes(raw: bytes | None) -> bool:
    """True when a frame's headers make it a removal, as `is_removal` reads nats-py's. A
    put's headers, naming neither removal header, are not parsed."""
    # `find`, not `in`: bytes' `in` first tries its operand as an integer, and the TypeError
    # it raises and clears costs more than the search itself.
    if raw is None or (raw.find(b"KV-Operation") < 0 and raw.find(b"Nats-Marker-Reason") < 0):
        return False
    return is_removal(header_fields(raw))


def header_fields(raw: bytes) -> dict[str, str]:
    """A frame's header block as name → value (the status line left out)."""
    fields = {}
    for line in raw.decode(errors="replace").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon:
            fields[name.strip()] = value.strip()
    return fields


def status_line(raw: bytes | None) -> str:
    """A status message's first line, such as 'NATS/1.0 100 Idle Heartbeat'."""
    return (raw or b"").split(b"\r\n", 1)[0].decode(errors="replace")
