"""One `subscriptions/listen` stream's life: what it follows, what it owes, what state it is in.

A stream moves through explicit states, and only the methods here move it:

    OPENING ──opened()──▶ LIVE ◀──unblocked()── BLOCKED
       │                   │  └───blocking()────▶  │
       │                   ▼                       │
       └──finish(reason)─▶ ENDING ◀────────────────┘
                             │ closed()
       any state ──lose()/drop_stalled()/closed()──▶ ENDED (with an `EndReason`)

- OPENING: subscribed, its ack not yet written; changes queue in the backlog.
- LIVE: the ack is out; the fan-out's flush writes changes straight to the socket.
- BLOCKED: the stream's own writer awaits the ASGI `send` (socket buffer full, or no
  direct channel); the flush leaves the backlog to it.
- ENDING: the hub ends the stream (shutdown, token expiry): the writer sends what is
  queued and the completion result (H63), then closes.
- ENDED: nothing more is written; `end_reason` says why.

The backlog holds at most one snapshot per followed task: a newer revision replaces an
unsent older one. Snapshots are full state, so coalescing loses nothing a client needs,
and a stalled client costs memory bounded by the tasks it follows (invariant 5).

Fleet change events (docs/fleet-events.md) have a backlog of their own with the same rule:
at most one unsent frame per event type and resource URI. They are signals ("list again",
"read again"), so two unsent ones say no more than one. A write sends the queued task
states first, then the queued events.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from hub.http.connection import Channel
from hub.push.sse_frames import (
    KEEPALIVE_FRAME,
    chunk_head,
    chunk_tail,
    completion_frame,
    notification_prefix,
    task_frames,
)
from hub.store.snapshot import TaskSnapshot

if TYPE_CHECKING:
    from hub.push.followers import Followers


class StreamState(enum.Enum):
    OPENING = "opening"
    LIVE = "live"
    BLOCKED = "blocked"
    ENDING = "ending"
    ENDED = "ended"


class EndReason(enum.Enum):
    """Why a stream ended; the value labels `taskhub_streams_closed_total`."""

    CLIENT = "client"  # the client closed the connection (H64)
    SHUTDOWN = "shutdown"  # the hub is stopping (H63)
    TOKEN_EXPIRED = "token_expired"  # the caller's token expired (H63)
    SEND_TIMEOUT = "send_timeout"  # the client stopped reading: dropped, no goodbye


# The members as module constants: on CPython 3.11 `StreamState.LIVE` goes through
# enum's class-level lookup, and the flush compares once per stream and frame.
_OPENING, _LIVE, _BLOCKED, _ENDING, _ENDED = (
    StreamState.OPENING,
    StreamState.LIVE,
    StreamState.BLOCKED,
    StreamState.ENDING,
    StreamState.ENDED,
)
_WRITING = (_OPENING, _BLOCKED, _ENDING)


class Subscriber:
    """One listen stream: its interest, unsent backlog, state and write bookkeeping."""

    __slots__ = (
        "_waiter",
        "backlog",
        "channel",
        "end_reason",
        "events",
        "keepalive_due",
        "lane",
        "last_write",
        "on_wake",
        "prefix",
        "state",
        "subscription_id",
        "task",
        "task_ids",
        "waiting_since",
    )

    def __init__(self, subscription_id: bytes, task_ids: Iterable[str]) -> None:
        self.subscription_id = subscription_id  # the listen request id, JSON-encoded
        self.prefix = notification_prefix(subscription_id)
        self.task_ids: set[str] = set(task_ids)
        self.backlog: dict[str, TaskSnapshot] = {}
        self.events: dict[str, bytes] = {}  # event key → its unsent frame
        self.state = _OPENING
        self.end_reason: EndReason | None = None  # set on finish() or on the way to ENDED
        self.channel: Channel | None = None
        self.task: asyncio.Task[None] | None = None  # the stream's own writer
        self.waiting_since: float | None = None  # the writer awaits `send` since (loop time)
        self.last_write = 0.0  # loop time
        self.keepalive_due = False  # a keep-alive only the writer can send
        self._waiter: asyncio.Future[None] | None = None
        # A writer with no task of its own (hub/push/detached.py) is woken by this call instead.
        self.on_wake: Callable[[], None] | None = None
        # The followers of its one task whose express lane it rides, if it does
        # (hub/push/followers.py): it is live and writable, and its backlog stays empty.
        self.lane: Followers[Subscriber] | None = None

    # -- the backlog ----------------------------------------------------------------------

    def offer(self, snapshot: TaskSnapshot) -> bool:
        """Queue a snapshot; returns True if it replaced an unsent one (coalesced)."""
        queued = self.backlog.get(snapshot.task_id)
        if queued is not None and queued.revision >= snapshot.revision:
            return False
        self.backlog[snapshot.task_id] = snapshot
        return queued is not None

    def offer_event(self, key: str, frame: bytes) -> bool:
        """Queue a fleet event's frame; True if it replaced an unsent one of the same key."""
        replaced = key in self.events
        self.events[key] = frame
        return replaced

    @property
    def pending(self) -> bool:
        return bool(self.backlog or self.events)

    def take_frames(self) -> tuple[bytes, int]:
        """Everything queued as one chunk: task states, then events; and how many."""
        backlog = self.backlog
        batch = list(backlog.values())  # oldest task first
        backlog.clear()
        data = self.frame_states(batch) if batch else b""
        if not self.events:
            return data, len(batch)
        events = list(self.events.values())
        self.events.clear()
        return data + b"".join(events), len(batch) + len(events)

    def frame_states(self, batch: list[TaskSnapshot]) -> bytes:
        """Task states as this stream writes them: `notifications/tasks` frames."""
        return task_frames(self.prefix, batch)

    def goodbye(self) -> bytes:
        """The last frame when the hub ends the stream: the listen request's result (H63)."""
        return completion_frame(self.subscription_id)

    # -- writes from the fan-out (hub/push/fanout.py) --------------------------------------------

    def flush(self, now: float) -> int:
        """Write the backlog straight out if the socket takes it, else wake the writer;
        returns the number of notifications written."""
        if not (self.backlog or self.events) or self.state is not _LIVE:
            return 0  # nothing to do, or the writer has it in hand
        channel = self._writable_channel()
        if channel is None:
            self.wake()
            return 0
        data, count = self.take_frames()
        channel.write(data)
        self.last_write = now
        return count

    def keepalive(self, now: float) -> None:
        """H20: an idle live stream gets a comment now and then (only while `live`)."""
        channel = self._writable_channel()
        if channel is not None:
            channel.write(KEEPALIVE_FRAME)
            self.last_write = now
        else:
            self.keepalive_due = True
            self.wake()

    def stalled_since(self) -> float | None:
        """Loop time since which the writer is stuck in `send`, if it is."""
        return self.waiting_since if self.state in _WRITING else None

    def _writable_channel(self) -> Channel | None:
        """The channel, if a write now goes straight out; callers hold LIVE, so nothing
        the writer holds is ahead of it."""
        channel = self.channel
        return channel if channel is not None and channel.writable else None

    # -- transitions ------------------------------------------------------------------------

    def opened(self) -> None:
        """The ack and the current states are out: OPENING → LIVE."""
        if self.state is _OPENING:
            self.state = _LIVE

    def blocking(self, now: float) -> None:
        """The writer starts awaiting `send`: LIVE → BLOCKED (other states stay)."""
        self.leave_lane()
        self.waiting_since = now
        if self.state is _LIVE:
            self.state = _BLOCKED

    def unblocked(self, now: float) -> None:
        """`send` returned: BLOCKED → LIVE."""
        self.waiting_since = None
        self.last_write = now
        if self.state is _BLOCKED:
            self.state = _LIVE

    def finish(self, reason: EndReason) -> None:
        """End the stream gracefully: the writer sends the completion result (H63)."""
        if self.state in (_ENDING, _ENDED):
            return
        self.leave_lane()  # what the lane has pending goes before the goodbye
        self.state = _ENDING
        self.end_reason = reason
        self.wake()

    def finish_at(self, ends_at: float | None) -> asyncio.TimerHandle | None:
        """End the stream gracefully at epoch `ends_at` (its caller's token expires, H63);
        the timer, for the writer to cancel when the stream ends first."""
        if ends_at is None:
            return None
        delay = max(0.0, ends_at - time.time())
        loop = asyncio.get_running_loop()
        return loop.call_later(delay, self.finish, EndReason.TOKEN_EXPIRED)

    def lose(self) -> None:
        """The connection is gone: send nothing more (H23, H64)."""
        self._end(EndReason.CLIENT)

    def drop_stalled(self) -> None:
        """The client stopped reading: free its slot without a goodbye (invariant 5)."""
        if self.state is _ENDED:
            return
        self._end(EndReason.SEND_TIMEOUT)
        if self.channel is not None:
            self.channel.abort()  # the writer's pending `send` returns; it sees the end
        elif self.task is not None:
            self.task.cancel()

    def closed(self) -> EndReason:
        """The writer is done (after the completion result, or on a failed write);
        returns why the stream ended."""
        self._end(self.end_reason or EndReason.CLIENT)
        assert self.end_reason is not None
        return self.end_reason

    def _end(self, reason: EndReason) -> None:
        if self.state is _ENDED:
            return
        self.leave_lane()
        if self.state is not _ENDING or reason is EndReason.SEND_TIMEOUT:
            # The first cause is the reason: a graceful end already under way keeps its
            # own when the client goes before the goodbye, but not when the client
            # stopped reading and had to be dropped.
            self.end_reason = reason
        self.state = _ENDED
        self.wake()

    def leave_lane(self) -> None:
        """Back to the backlog from the express lane, if it rides one: its channel stops
        taking writes, or the stream stops being live."""
        if self.lane is not None:
            self.lane.leave(self)

    @property
    def live(self) -> bool:
        return self.state is _LIVE

    @property
    def ending(self) -> bool:
        return self.state is _ENDING

    @property
    def ended(self) -> bool:
        return self.state is _ENDED

    # -- the writer's wait ------------------------------------------------------------------

    def wake(self) -> None:
        if self.on_wake is not None:
            self.on_wake()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def park(self) -> None:
        """Wait for `wake`. The writer checks its state first, with no await between."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


# -- the fan-out's loops: these run once per delivered frame ------------------------------


def offer_all(followers: Iterable[Subscriber], snapshot: TaskSnapshot) -> int:
    """`offer(snapshot)` to each of `followers`, written out; returns how many coalesced."""
    task_id, revision = snapshot.task_id, snapshot.revision
    coalesced = 0
    for subscriber in followers:
        backlog = subscriber.backlog
        queued = backlog.get(task_id)
        if queued is None:
            backlog[task_id] = snapshot
        elif queued.revision < revision:
            backlog[task_id] = snapshot
            coalesced += 1
    return coalesced


def flush_all(
    subscribers: Iterable[Subscriber], now: float, joiners: list[Subscriber] | None = None
) -> int:
    """`flush(now)` for each of `subscribers`; returns the notifications written.

    The usual case is written out: a live stream of plain `notifications/tasks` frames
    owing one task state and nothing else, its socket taking writes. Its chunk is
    `chunk(task_frames(prefix, [snapshot]))` in one join, with the parts every follower of
    the same revision shares (the frame's tail, the chunk head for a prefix of one length)
    made once: a flush usually writes one revision to all its followers. Of those streams,
    the ones following one task on an `express` channel are added to `joiners`: they may
    ride that task's express lane from now on (hub/push/followers.py).
    """
    sent = 0
    body = tail = head = b""
    prefix_len = -1
    for subscriber in subscribers:
        backlog = subscriber.backlog
        channel = subscriber.channel
        if (
            len(backlog) == 1
            and subscriber.state is _LIVE
            and not subscriber.events
            and type(subscriber) is Subscriber  # a subclass may frame states its own way
            and channel is not None
            and channel.writable
        ):
            snapshot = backlog.popitem()[1]  # keeps the dict's table, unlike clear()
            if snapshot.body is not body:
                body = snapshot.body
                tail = chunk_tail(snapshot)
                prefix_len = -1
            prefix = subscriber.prefix
            if len(prefix) != prefix_len:
                prefix_len = len(prefix)
                head = chunk_head(prefix_len, len(tail))
            channel.write_chunks(b"".join((head, prefix, tail)))
            subscriber.last_write = now
            sent += 1
            if joiners is not None and channel.express and len(subscriber.task_ids) == 1:
                joiners.append(subscriber)
        else:
            sent += subscriber.flush(now)
    return sent
