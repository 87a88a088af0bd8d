"""Fan-out: which listen streams follow which tasks, and getting each change to them.

A subscriber's backlog holds at most one snapshot per task it follows: a newer
revision replaces an unsent older one. Snapshots are full state, so coalescing loses
nothing a client needs, and a stalled client costs memory bounded by the number of
tasks it follows, never by the update rate (invariant 5).

Delivery is batched per event-loop turn: `publish` marks followers dirty and one
flush per turn writes each dirty stream's backlog as one chunk, straight to its socket
(hub/connection.py) when the socket takes it. Only a stream that cannot take a write
now (socket buffer full, or no direct channel) wakes its own task, which awaits the
ASGI `send`. One hub-wide tick, not a timer per stream, sends keep-alives and drops
streams whose client stopped reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from hub.cache import TaskSnapshot
from hub.connection import DirectChannel
from hub.frames import KEEPALIVE_FRAME, notification_prefix, task_frames
from hub.metrics import Metrics


class Subscriber:
    """One `subscriptions/listen` stream: its interest, unsent backlog and write state."""

    __slots__ = (
        "_waiter",
        "backlog",
        "blocked_since",
        "channel",
        "disconnected",
        "end",
        "keepalive_due",
        "last_write",
        "live",
        "prefix",
        "stalled",
        "subscription_id",
        "task",
        "task_ids",
    )

    def __init__(self, subscription_id: bytes, task_ids: Iterable[str]) -> None:
        self.subscription_id = subscription_id  # the listen request id, JSON-encoded
        self.prefix = notification_prefix(subscription_id)
        self.task_ids: set[str] = set(task_ids)
        self.backlog: dict[str, TaskSnapshot] = {}
        self.channel: DirectChannel | None = None
        self.task: asyncio.Task[None] | None = None  # the stream's own writer
        self.live = False  # the ack is out: changes may be written
        self.blocked_since: float | None = None  # the writer awaits `send` since (loop time)
        self.last_write = 0.0  # loop time
        self.keepalive_due = False
        self.end: str | None = None  # the hub ends the stream gracefully, and why (H63)
        self.disconnected = False  # the client went away (H23, H64)
        self.stalled = False  # dropped for not reading
        self._waiter: asyncio.Future[None] | None = None

    @property
    def closing(self) -> bool:
        return self.end is not None

    def offer(self, snapshot: TaskSnapshot) -> bool:
        """Queue a snapshot; returns True if it replaced an unsent one (coalesced)."""
        queued = self.backlog.get(snapshot.task_id)
        if queued is not None and queued.revision >= snapshot.revision:
            return False
        self.backlog[snapshot.task_id] = snapshot
        return queued is not None

    def take(self) -> list[TaskSnapshot]:
        """Everything queued so far, oldest task first."""
        if not self.backlog:
            return []
        batch = list(self.backlog.values())
        self.backlog.clear()
        return batch

    def flush(self, now: float) -> int:
        """Write the backlog straight out if the socket takes it, else wake the writer;
        returns the number of notifications written."""
        if not self.backlog or not self.live or self.blocked_since is not None:
            return 0  # nothing to do, or the writer has it in hand
        channel = self._direct()
        if channel is None:
            self.wake()
            return 0
        batch = self.take()
        channel.write(task_frames(self.prefix, batch))
        self.last_write = now
        return len(batch)

    def keepalive(self, now: float) -> None:
        """H20: an idle stream gets a comment now and then."""
        channel = self._direct()
        if channel is not None:
            channel.write(KEEPALIVE_FRAME)
            self.last_write = now
        else:
            self.keepalive_due = True
            self.wake()

    def _direct(self) -> DirectChannel | None:
        """The channel, if a write now goes straight out ahead of nothing the writer holds."""
        channel = self.channel
        if channel is None or self.blocked_since is not None or not channel.writable:
            return None
        return channel

    def finish(self, reason: str) -> None:
        """End the stream gracefully: the writer sends the completion result (H63)."""
        if self.end is None:
            self.end = reason
        self.wake()

    def drop_stalled(self) -> None:
        """The client stopped reading: free its slot without a goodbye."""
        self.stalled = True
        if self.channel is not None:
            self.channel.abort()  # the writer's pending `send` returns; it sees the loss
        elif self.task is not None:
            self.task.cancel()

    def lose(self) -> None:
        """The connection is gone: send nothing more (H23)."""
        self.disconnected = True
        self.live = False
        self.wake()

    def wake(self) -> None:
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


class Fanout:
    """The registry of subscribers by task id, and the per-turn flush."""

    def __init__(self, metrics: Metrics) -> None:
        self._by_task: dict[str, set[Subscriber]] = {}
        self._subscribers: set[Subscriber] = set()
        self._dirty: set[Subscriber] = set()
        self._flush_scheduled = False
        self._metrics = metrics
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._subscribers)

    def followers(self, task_id: str) -> int:
        return len(self._by_task.get(task_id, ()))

    async def drained(self, timeout: float) -> bool:
        """Wait until no stream is open; False if some are still open after `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                await self._empty.wait()
        except TimeoutError:
            return False
        return True

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.add(subscriber)
        self._empty.clear()
        for task_id in subscriber.task_ids:
            self._by_task.setdefault(task_id, set()).add(subscriber)
        self._metrics.open_streams.set(len(self._subscribers))

    def narrow(self, subscriber: Subscriber, keep: Iterable[str]) -> None:
        """Drop interest in every task but `keep` (the ones the ack grants)."""
        keep = set(keep)
        for task_id in subscriber.task_ids - keep:
            self.unfollow(subscriber, task_id)
            subscriber.backlog.pop(task_id, None)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber not in self._subscribers:
            return
        self._subscribers.discard(subscriber)
        self._dirty.discard(subscriber)
        for task_id in list(subscriber.task_ids):
            self.unfollow(subscriber, task_id)
        subscriber.backlog.clear()
        self._metrics.open_streams.set(len(self._subscribers))
        if not self._subscribers:
            self._empty.set()

    def publish(self, snapshot: TaskSnapshot) -> None:
        """Hand a new revision to every follower of its task; they are written this turn."""
        followers = self._by_task.get(snapshot.task_id)
        if not followers:
            return
        coalesced = 0
        for subscriber in followers:
            coalesced += subscriber.offer(snapshot)
        self._dirty |= followers
        if coalesced:
            self._metrics.coalesced_frames.inc(coalesced)
        if snapshot.terminal:
            # §8 item 18: nothing follows a terminal state; stop tracking the task.
            del self._by_task[snapshot.task_id]
            for subscriber in followers:
                subscriber.task_ids.discard(snapshot.task_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        now = asyncio.get_running_loop().time()
        sent = 0
        for subscriber in dirty:
            sent += subscriber.flush(now)
        if sent:
            self._metrics.notifications_sent.inc(sent)

    def tick(self, now: float, keepalive: float, send_timeout: float) -> None:
        """Keep-alives for idle streams (H20); drop streams stuck in a write (invariant 5)."""
        for subscriber in self._subscribers:
            if subscriber.blocked_since is not None:
                if now - subscriber.blocked_since > send_timeout and not subscriber.stalled:
                    subscriber.drop_stalled()
            elif subscriber.live and now - subscriber.last_write >= keepalive:
                subscriber.keepalive(now)

    def forget(self, task_id: str) -> None:
        """The task expired or was deleted: nobody follows it any more."""
        followers = self._by_task.pop(task_id, None)
        for subscriber in followers or ():
            subscriber.task_ids.discard(task_id)

    def close_all(self) -> None:
        """Shutdown: every stream sends its completion result and ends."""
        for subscriber in list(self._subscribers):
            subscriber.finish("shutdown")

    def unfollow(self, subscriber: Subscriber, task_id: str) -> None:
        """Stop delivering `task_id` to `subscriber` (what is queued still goes out)."""
        subscriber.task_ids.discard(task_id)
        followers = self._by_task.get(task_id)
        if followers is None:
            return
        followers.discard(subscriber)
        if not followers:
            del self._by_task[task_id]
