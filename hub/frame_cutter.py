"""Reading JetStream deliveries straight off a connection of their own.

Through nats-py's subscription path each message costs a parse by regular expressions, a
`Msg`, its headers parsed into a dict, a queue and a task wake-up before the hub even
looks at it. The hub's two readers of the task bucket, the first read (hub/first_read.py)
and the watch (hub/bucket_watch.py), each run on a connection with one subscription, their
inbox, so every MSG and HMSG frame on it is theirs: `FrameCutter` cuts them in a single
pass and hands them over in batches, in order; every other operation (PING, INFO, -ERR)
still goes through nats-py's parser.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.protocol.parser import Parser

from bridge.wire import is_removal

Frame = tuple[bytes, bytes, bytes | None, bytes]  # subject, reply, headers, payload
# Apply one message: key, stream sequence, whether it removes the key's task, its payload.
Apply = Callable[[str, int, bool, bytes], None]


class FrameCutter(Parser):
    """nats-py's parser, with MSG and HMSG frames cut in one pass and handed to `sink` in
    batches, in order; other operations are given to nats-py's parser a line at a time."""

    def __init__(self, nc: NatsClient, sink: Callable[[list[Frame]], None]) -> None:
        super().__init__(nc)
        self.sink = sink
        # When set, only this subscription's frames are handed over; an earlier one's
        # still in flight after it was replaced are dropped, as nats-py drops them.
        self.sid: bytes | None = None

    async def parse(self, data: bytes = b"") -> None:
        self.buf.extend(data)
        chunk = bytes(self.buf)  # one copy of the chunk; each frame is sliced out once
        frames: list[Frame] = []
        pos, size = 0, len(chunk)
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
                if frames:
                    self.sink(frames)
                    frames = []
                del self.buf[: eol + 2]
                await self._one_line(chunk[pos : eol + 2])
                chunk = bytes(self.buf)
                pos, size = 0, len(chunk)
                continue
            start = eol + 2
            end = start + int(args[-1])
            if end + 2 > size:
                break  # the rest of this frame is still on its way
            if self.sid is None or args[1] == self.sid:
                headers = chunk[start : start + header_size] if header_size else None
                frames.append((args[0], reply, headers, chunk[start + header_size : end]))
            pos = end + 2
        del self.buf[:pos]
        if frames:
            self.sink(frames)

    async def _one_line(self, line: bytes) -> None:
        """One control line (not a message) through nats-py's own parser."""
        rest, self.buf = self.buf, bytearray(line)
        try:
            await super().parse()
        finally:
            self.buf = rest


def is_delivery(reply: bytes) -> bool:
    """A stored message delivered by a consumer (else a status message: 100, 409, ...)."""
    return reply.startswith(b"$JS.ACK.")


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
    # it raises and clears costs more than the search (CPython 3.11: ~200 ns against ~70).
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
