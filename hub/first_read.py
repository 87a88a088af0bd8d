"""The first read of a bucket: every task's latest value, in bulk, before the watch.

A hub that starts with nothing cached (no checkpoint, or the bucket made anew) reads one
message per task: a million at a million tasks. Through nats-py's subscription path each
message costs about 9 µs of the hub's CPU before the hub even looks at it (the protocol
parser's regular expressions, a `Msg`, a queue and a task wake-up per message), which alone
is most of the ten seconds a replica may take to be ready. So the first read runs apart:

- a pull consumer made by the main connection: the last value of every key, in stream
  order, no acknowledgements;
- pulled on a connection of its own (same servers, credentials and TLS), whose parser cuts
  the frames of its one inbox in a single pass and hands them over in batches
  (`FrameCutter`); every other operation (PING, INFO, -ERR) goes through nats-py's parser;
- each message applied to the cache as the watch applies it (`apply`).

It ends when the consumer has nothing pending, or has delivered the stream's last
sequence as of its making. Anything else ends it early, keeping what was applied: a gap in
the consumer sequence, a status message (a leadership change, the consumer gone), a
permissions error, a lost connection, no message for STALL_S. Either way the watch then
resumes after the last sequence applied, as after a checkpoint: every key whose latest
value is older was delivered (last values come in stream order), and every newer value is
still stored. An early end costs speed, never a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.protocol.parser import Parser

from bridge.wire import is_removal

log = logging.getLogger("taskhub.nats")

# Messages per pull request. Two requests are outstanding: at most ~1.5 MB in flight, and
# a PONG waits behind at most a few tens of milliseconds of frames.
BATCH = 2048
# No message for this long (a paused server, a lost request) ends the first read early.
STALL_S = 5.0
# The consumer outlives a hub that died mid-read by this long.
INACTIVE_S = 10.0

Frame = tuple[bytes, bytes, bytes | None, bytes]  # subject, reply, headers, payload
# Apply one message: key, stream sequence, whether it removes the key's task, its payload.
Apply = Callable[[str, int, bool, bytes], None]


class FrameCutter(Parser):
    """nats-py's parser, with MSG and HMSG frames cut in one pass and handed to `sink` in
    batches, in order; other operations are given to nats-py's parser a line at a time."""

    def __init__(self, nc: NatsClient, sink: Callable[[list[Frame]], None]) -> None:
        super().__init__(nc)
        self.sink = sink

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


def removes(raw: bytes | None) -> bool:
    """True when a frame's headers make it a removal, as `is_removal` reads nats-py's. A
    put's headers, naming neither removal header, are not parsed."""
    # `find`, not `in`: bytes' `in` first tries its operand as an integer, and the TypeError
    # it raises and clears costs more than the search (CPython 3.11: ~200 ns against ~70).
    if raw is None or (raw.find(b"KV-Operation") < 0 and raw.find(b"Nats-Marker-Reason") < 0):
        return False
    headers = {}
    for line in raw.decode(errors="replace").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip()] = value.strip()
    return is_removal(headers)


class FirstRead:
    """One first read of `stream`; `applied` is the last stream sequence applied (every
    message before it too), `count` how many messages were, `ended_early` why it stopped
    before the end ("" if it did not), `consumer` the consumer to delete afterwards."""

    def __init__(self, js: Any, stream: str, bucket: str, apply: Apply) -> None:
        self.js = js
        self.stream = stream
        self.bucket = bucket
        self.apply = apply
        self.applied = 0
        self.count = 0
        self.ended_early = ""
        self.consumer = ""
        self._prefix = len(f"$KV.{bucket}.")
        self._delivered = 0  # the consumer sequence of the last message taken
        self._cut_at = 0  # how many tokens of a reply subject follow its stream sequence
        self._stop_seq = 0
        self._done = asyncio.Event()
        self._progress = asyncio.Event()

    async def run(self, servers: list[str], options: dict[str, Any], last_seq: int) -> None:
        """Read until the consumer has nothing pending or has delivered `last_seq`."""
        nc = NatsClient()
        nc._ps = FrameCutter(nc, self._take)  # nats-py has no public hook for its parser
        try:
            await nc.connect(
                servers=servers,
                name="taskhub-first-read",
                allow_reconnect=False,
                error_cb=self._on_error,
                closed_cb=self._on_closed,
                **options,
            )
            inbox = nc.new_inbox()
            await nc.subscribe(inbox)  # the one subscription: every frame is for it
            info = await self.js.add_consumer(
                self.stream,
                api.ConsumerConfig(
                    deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                    ack_policy=api.AckPolicy.NONE,
                    filter_subject=f"$KV.{self.bucket}.>",
                    inactive_threshold=INACTIVE_S,
                    mem_storage=True,
                    num_replicas=1,
                ),
            )
            self.consumer = info.name
            if info.num_pending == 0:
                return
            self._stop_seq = last_seq
            subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{info.name}"
            request = json.dumps({"batch": BATCH}).encode()
            asked = 0
            while not self._done.is_set():
                self._progress.clear()  # before asking: frames may come while we ask
                while asked < self._delivered + 2 * BATCH:
                    await nc.publish(subject, request, reply=inbox)
                    asked += BATCH
                try:
                    await asyncio.wait_for(self._progress.wait(), STALL_S)
                except TimeoutError:
                    self._end(f"no message for {STALL_S:g} s")
        finally:
            self._done.set()
            with contextlib.suppress(Exception):
                await nc.close()

    def _take(self, frames: list[Frame]) -> None:
        """Apply a batch of frames, in order, up to the first that breaks the sequence."""
        if self._done.is_set():
            return
        apply, prefix, stop_seq = self.apply, self._prefix, self._stop_seq
        delivered = first = self._delivered
        applied = self.applied
        try:
            for subject, reply, headers, payload in frames:
                # $JS.ACK.<stream>.<consumer>.<n>.<sseq>.<cseq>.<ts>.<pending>, or with
                # <domain>.<account hash> before <stream> and a <token> after <pending>.
                if not reply.startswith(b"$JS.ACK."):  # a status message: 409 ... or so
                    status = (headers or b"").split(b"\r\n", 1)[0].decode(errors="replace")
                    self._end(f"status {status!r}")
                    return
                if not self._cut_at:
                    self._cut_at = 5 if reply.count(b".") == 11 else 4
                tokens = reply.rsplit(b".", self._cut_at)
                if int(tokens[2]) != delivered + 1:
                    self._end(f"consumer sequence {int(tokens[2])} after {delivered}")
                    return
                seq = int(tokens[1])
                removed = removes(headers)
                apply(subject[prefix:].decode(), seq, removed, payload)
                applied = seq
                delivered += 1
                if seq >= stop_seq or tokens[4] == b"0":  # delivered the last, or no more
                    self._done.set()
                    break
        except Exception as exc:  # a bug: end here, the watch reads the rest
            log.exception("first read failed on a message")
            self._end(f"{type(exc).__name__}: {exc}")
        finally:  # every frame up to the one that ended the read or failed, not it
            self.applied, self.count = applied, self.count + delivered - first
            self._delivered = delivered
        self._progress.set()

    def _end(self, reason: str) -> None:
        if not self._done.is_set():
            self.ended_early = reason
            self._done.set()
        self._progress.set()

    async def _on_error(self, exc: Exception) -> None:
        self._end(f"NATS error: {exc}")

    async def _on_closed(self) -> None:
        self._end("connection closed")
