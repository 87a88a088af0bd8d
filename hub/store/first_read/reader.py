"""The first read of a bucket: every task's latest value, in bulk, before the watch.

A hub that starts with nothing cached (no checkpoint, or the bucket made anew) reads one
message per task: a million at a million tasks. Through nats-py's subscription path each
message costs the hub CPU before the hub even looks at it (the protocol parser's regular
expressions, a `Msg`, a queue and a task wake-up per message), a million times over before
a replica is ready (docs/scaling.md#costs-the-code-is-shaped-by). So the first read runs apart:

- a pull consumer made by the main connection: the last value of every key, in stream
  order, no acknowledgements;
- pulled on a connection of its own (same servers, credentials and TLS), whose parser cuts
  the frames of its one inbox in a single pass and hands them over in batches
  (`FrameCutter`, hub/store/nats_frames.py), as the watch's does (hub/store/bucket_watch.py);
- each message applied to the cache as the watch applies it (`apply`).

It ends when the consumer has nothing pending, or has delivered the stream's last
sequence as of its making (a message after it ends the read unapplied). At SPLIT_FROM
messages and more, the hub reads up to a middle sequence this way and a worker process
reads the rest (`start_seq`: every message from there on) on the second core
(hub/store/first_read/worker.py). Anything else ends it early, keeping what was applied: a gap in
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
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js import api

from hub.store.nats_frames import (
    Apply,
    Frame,
    FrameCutter,
    delivery_sequences,
    removes,
    status_line,
    stream_sequence,
)

log = logging.getLogger("taskhub.nats")

# Messages per pull request. Two requests are outstanding, so what is in flight stays
# bounded and a PONG waits behind at most two batches of frames.
BATCH = 2048
# No message for this long (a paused server, a lost request) ends the first read early.
STALL_S = 5.0
# The consumer outlives a hub that died mid-read by this long.
INACTIVE_S = 10.0


class FirstRead:
    """One first read of `stream`; `applied` is the last stream sequence applied (every
    message before it too), `count` how many messages were, `ended_early` why it stopped
    before the end ("" if it did not), `consumer` the consumer to delete afterwards."""

    def __init__(
        self, js: Any, stream: str, bucket: str, apply: Apply, *, start_seq: int = 0
    ) -> None:
        self.js = js
        self.start_seq = start_seq  # 0: the last value of every key; else every message on
        self.stream = stream
        self.bucket = bucket
        self.apply = apply
        self.applied = 0
        self.count = 0
        self.ended_early = ""
        self.consumer = ""
        self._prefix = len(f"$KV.{bucket}.")
        self._delivered = 0  # the consumer sequence of the last message taken
        self._stop_seq = 0
        self._done = asyncio.Event()
        self._progress = asyncio.Event()
        self._connected = False

    async def run(self, servers: list[str], options: dict[str, Any], last_seq: int) -> None:
        """Read until the consumer has nothing pending or has delivered `last_seq`; a
        message after `last_seq` ends the read unapplied."""
        nc = NatsClient()
        cutter = FrameCutter(nc, self._take)
        cutter.install()
        try:
            await nc.connect(
                servers=servers,
                name="taskhub-first-read",
                allow_reconnect=False,
                error_cb=self._on_error,
                closed_cb=self._on_closed,
                **options,
            )
            self._connected = True
            cutter.attach()
            inbox = nc.new_inbox()
            await nc.subscribe(inbox)  # the one subscription: every frame is for it
            info = await self.js.add_consumer(
                self.stream,
                api.ConsumerConfig(
                    deliver_policy=(
                        api.DeliverPolicy.BY_START_SEQUENCE
                        if self.start_seq
                        else api.DeliverPolicy.LAST_PER_SUBJECT
                    ),
                    opt_start_seq=self.start_seq or None,
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
        applied = before = self.applied
        last_reply = b""
        try:
            for subject, reply, headers, payload in frames:
                # The stream sequence alone: the consumer's sequence and what is pending
                # are read from the batch's last delivery, below.
                seq = stream_sequence(reply)
                if seq is None:  # a status message: 409 ...
                    self._end(f"status {status_line(headers)!r}")
                    break
                if seq > stop_seq:  # another reader's (a split read), or written since
                    self._done.set()
                    break
                apply(subject[prefix:].decode(), seq, removes(headers), payload)
                applied, last_reply = seq, reply
                delivered += 1
                if seq == stop_seq:  # delivered the last
                    self._done.set()
                    break
            if last_reply:
                # Consumer sequences only rise: the last one taken is the count taken only
                # if none was lost on the way.
                _, consumer_seq, pending = delivery_sequences(last_reply)
                if consumer_seq != delivered:
                    delivered, applied, after = self._before_gap(frames, first, before)
                    self._end(f"consumer sequence {after} after {delivered}")
                elif pending == 0:  # no more
                    self._done.set()
        except Exception as exc:  # a bug: end here, the watch reads the rest
            log.exception("first read failed on a message")
            self._end(f"{type(exc).__name__}: {exc}")
        finally:  # every frame up to the one that ended the read or failed, not it
            self.applied, self.count = applied, self.count + delivered - first
            self._delivered = delivered
        self._progress.set()

    @staticmethod
    def _before_gap(frames: list[Frame], delivered: int, applied: int) -> tuple[int, int, int]:
        """The consumer and stream sequences of the last delivery in `frames` before the
        first lost one, where the read counts as stopped, and the consumer sequence that
        came next. (What was applied after the gap the watch reads again: the same
        revision twice changes nothing.)"""
        for _, reply, _, _ in frames:
            seq, consumer_seq, _ = delivery_sequences(reply)
            if consumer_seq != delivered + 1:
                return delivered, applied, consumer_seq
            delivered, applied = consumer_seq, seq
        raise AssertionError("no gap in the consumer sequence")

    def _end(self, reason: str) -> None:
        if not self._done.is_set():
            self.ended_early = reason
            self._done.set()
        self._progress.set()

    async def _on_error(self, exc: Exception) -> None:
        # While connecting, nats-py reports each server it could not reach, then tries the
        # next; `connect` raises if none answers.
        if self._connected:
            self._end(f"NATS error: {exc}")

    async def _on_closed(self) -> None:
        self._end("connection closed")
