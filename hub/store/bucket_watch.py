"""The bucket watch: every change of the task bucket, read on a connection of its own.

The cache follows the bucket through an ephemeral push consumer that behaves as nats-py's
ordered consumer: no acknowledgements, one delivery per message, flow control and idle
heartbeats, and any sign of a lost message ends it, so the hub makes a new one from the
last stream sequence it applied (hub/store/source.py).

The consumer delivers to the one inbox of a connection of its own, whose parser cuts each
frame and hands it here as it is read (hub/store/nats_frames.py), as the first read does. On
nats-py's subscription path every message also costs a `Msg`, its headers parsed into a
dict, a queue and a task wake-up, between the fan-out's writes (docs/architecture.md,
"Watch and catch-up"; the cost in docs/scaling.md, "Costs the code is shaped by").

What arrives on the inbox:

- a delivery (reply `$JS.ACK.…`): applied when its consumer sequence follows the last
  one's; a gap ends the watch before it;
- `NATS/1.0 100 FlowControl Request`, with a reply: answered at once, every delivery
  before it having been applied (frames are applied in the order they are read);
- `NATS/1.0 100 Idle Heartbeat`: its `Nats-Consumer-Stalled` subject, if any, is answered
  as a flow control request; a `Nats-Last-Consumer` other than the last consumer sequence
  applied shows a lost delivery and ends the watch;
- anything else (409 Consumer Deleted, a message on another subject) ends the watch.

The watch ends, too, when its connection is lost: it does not reconnect, since what was
sent meanwhile is gone; the hub makes a new watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js import api

from hub.store.nats_frames import (
    Apply,
    Frame,
    FrameCutter,
    delivery_sequences,
    header_fields,
    is_delivery,
    removes,
    status_line,
)
from hub.store.nats_internals import sid_of

log = logging.getLogger("taskhub.nats")

# The server sends a heartbeat after this long without a delivery.
IDLE_HEARTBEAT_S = 2.0


def _nothing() -> None:
    return None


# Called before and after each batch of frames is applied (the fan-out's hold and release).
Batch = tuple[Callable[[], None], Callable[[], None]]
NO_BATCH: Batch = (_nothing, _nothing)


class BucketWatch:
    """One watch of `stream`'s keys under `$KV.<bucket>.`, from `config`'s deliver policy.

    `consumer` is its consumer's name once started, `applied` the stream sequence of the
    last delivery applied, `ended` why it ended ("" while it runs). `progressed(pending)`
    follows every batch of deliveries with what the consumer had left to send after the
    last. A lost delivery replaces the consumer in place, as nats-py's ordered consumer
    does: a new inbox and a consumer from the stream sequence after `applied`, the old
    one handed to `forget`. `on_end(watch)` is called once, when the watch ends by itself
    (its connection lost, any other status), not when it is closed.
    """

    def __init__(
        self,
        js: Any,
        stream: str,
        bucket: str,
        apply: Apply,
        progressed: Callable[[int], None],
        on_end: Callable[[BucketWatch], None],
        forget: Callable[[str], None],
        batch: Batch = NO_BATCH,
    ) -> None:
        self.js = js
        self.stream = stream
        self.apply = apply
        self.progressed = progressed
        self.on_end = on_end
        self.forget = forget
        self.batch = batch
        self.consumer = ""
        self.applied = 0
        self.ended = ""
        self._delivered = 0  # the consumer sequence of the last delivery applied
        self._subject_prefix = f"$KV.{bucket}.".encode()
        self._filter = f"$KV.{bucket}.>"
        self._nc: NatsClient | None = None
        self._cutter: FrameCutter | None = None
        self._sub: Any = None
        self._config: api.ConsumerConfig | None = None
        self._resuming: asyncio.Task[None] | None = None
        self._replies: set[asyncio.Task[None]] = set()
        self._started = False  # errors before this are connection attempts nats-py retries

    async def start(
        self, servers: list[str], options: dict[str, Any], config: api.ConsumerConfig
    ) -> None:
        """Connect, subscribe an inbox and make the consumer; raises, leaving nothing
        behind, when any of it fails."""
        nc = NatsClient()
        self._cutter = FrameCutter(nc, self._take)
        self._cutter.install()
        self._nc = nc
        self._config = dataclasses.replace(
            config,
            filter_subject=self._filter,
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=IDLE_HEARTBEAT_S,
            num_replicas=1,
            mem_storage=True,
        )
        try:
            await nc.connect(
                servers=servers,
                name="taskhub-watch",
                allow_reconnect=False,
                error_cb=self._on_error,
                closed_cb=self._on_closed,
                **options,
            )
            self._cutter.attach()
            await self._follow(self._config)
            if self.ended:  # the connection was lost while the consumer was being made
                raise ConnectionError(f"the watch ended as it started: {self.ended}")
            self._started = True
        except BaseException:
            await self.close()
            raise

    async def _follow(self, config: api.ConsumerConfig) -> None:
        """Deliveries from a new inbox, of a new consumer made from `config`."""
        assert self._nc is not None and self._cutter is not None
        old = self._sub
        inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(inbox)
        self._cutter.sid = sid_of(self._sub)  # the old inbox's frames are dropped
        self._delivered = 0
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        await self._nc.flush()  # the server knows the inbox before the consumer delivers to it
        # Named here, so one whose creation timed out (made all the same, or not) is
        # deleted by name rather than left to an expiry a partition can stall.
        name = f"taskhub-watch-{uuid.uuid4().hex[:16]}"
        try:
            info = await self.js.add_consumer(
                self.stream, dataclasses.replace(config, deliver_subject=inbox, name=name)
            )
        except BaseException:
            self.forget(name)
            raise
        replaced, self.consumer = self.consumer, info.name
        if replaced:
            self.forget(replaced)

    async def close(self) -> None:
        """Stop reading (the caller deletes the consumer); `on_end` is not called."""
        self.ended = self.ended or "closed"
        if self._resuming is not None:
            self._resuming.cancel()
        for task in self._replies:
            task.cancel()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.close()

    def _take(self, frames: list[Frame]) -> None:
        """Apply a batch of frames in order, up to the first that shows a lost delivery,
        between the two calls of `batch`."""
        if self.ended:
            return
        begin, end = self.batch
        begin()
        try:
            self._apply_all(frames)
        finally:
            end()

    def _apply_all(self, frames: list[Frame]) -> None:
        apply, prefix = self.apply, self._subject_prefix
        cut = len(prefix)
        pending = -1
        for subject, reply, headers, payload in frames:
            if not is_delivery(reply):
                if not self._status(subject, reply, headers):
                    return
                continue
            seq, consumer_seq, pending = delivery_sequences(reply)
            if consumer_seq != self._delivered + 1 or not subject.startswith(prefix):
                self._resume(f"delivery {consumer_seq} after {self._delivered}")
                return
            self._delivered = consumer_seq
            self.applied = seq
            try:
                apply(subject[cut:].decode(), seq, removes(headers), payload)
            except Exception:  # a bug: the next revision of the task brings it up to date
                log.exception("the bucket watch failed to apply stream sequence %d", seq)
        if pending >= 0:
            self.progressed(pending)

    def _status(self, subject: bytes, reply: bytes, headers: bytes | None) -> bool:
        """Act on a status message; False when the frames after it are not to be read."""
        line = status_line(headers)
        if line.startswith("NATS/1.0 100 FlowControl"):
            if reply:
                self._reply(reply)
            return True
        if line.startswith("NATS/1.0 100 Idle Heartbeat"):
            fields = header_fields(headers or b"")
            stalled = fields.get("Nats-Consumer-Stalled")
            if stalled:
                self._reply(stalled.encode())
            last = fields.get("Nats-Last-Consumer")
            if last is not None and last != str(self._delivered):
                self._resume(f"a heartbeat after delivery {last}, applied {self._delivered}")
                return False
            return True
        self._end(f"status {line!r} on {subject.decode(errors='replace')!r}")
        return False

    def _resume(self, why: str) -> None:
        """A delivery was lost: the same watch, from the stream sequence after the last
        applied (or as first asked, when nothing was)."""
        assert self._config is not None and self._cutter is not None
        self._cutter.sid = b""  # nothing more from this inbox
        if self._resuming is not None:
            return
        config = self._config
        if self.applied:
            config = dataclasses.replace(
                config,
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self.applied + 1,
            )
        log.warning("bucket watch lost a delivery (%s); resuming after %d", why, self.applied)
        self._resuming = asyncio.ensure_future(self._resume_with(config))

    async def _resume_with(self, config: api.ConsumerConfig) -> None:
        try:
            await self._follow(config)
        except Exception as exc:
            self._end(f"resuming failed: {type(exc).__name__}: {exc}")
        finally:
            self._resuming = None

    def _reply(self, subject: bytes) -> None:
        """An empty message to `subject`: flow control's answer."""
        if self._nc is None:
            return
        task = asyncio.ensure_future(self._nc.publish(subject.decode(), b""))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    def _end(self, reason: str) -> None:
        if not self.ended:
            self.ended = reason
            self.on_end(self)

    async def _on_error(self, exc: Exception) -> None:
        # While connecting, nats-py reports each server it could not reach, then tries the
        # next; `start` raises if none answers.
        if self._started:
            self._end(f"NATS error: {exc}")

    async def _on_closed(self) -> None:
        self._end("connection closed")
