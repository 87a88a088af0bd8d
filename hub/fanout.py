"""Fan-out: which listen streams follow which tasks, and what each has yet to send.

A subscriber's backlog holds at most one snapshot per task it follows: a newer
revision replaces an unsent older one. Snapshots are full state, so coalescing loses
nothing a client needs, and a stalled client costs memory bounded by the number of
tasks it follows, never by the update rate (invariant 5).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from hub.cache import TaskSnapshot
from hub.metrics import Metrics


class Subscriber:
    """One `subscriptions/listen` stream's interest and unsent backlog."""

    __slots__ = ("_wakeup", "backlog", "closing", "disconnected", "subscription_id", "task_ids")

    def __init__(self, subscription_id: bytes, task_ids: Iterable[str]) -> None:
        self.subscription_id = subscription_id  # the listen request id, JSON-encoded
        self.task_ids: set[str] = set(task_ids)
        self.backlog: dict[str, TaskSnapshot] = {}
        self.closing = False  # the hub ends the stream gracefully (H63)
        self.disconnected = False  # the client went away (H23, H64)
        self._wakeup = asyncio.Event()

    def offer(self, snapshot: TaskSnapshot) -> bool:
        """Queue a snapshot; returns True if it replaced an unsent one (coalesced)."""
        queued = self.backlog.get(snapshot.task_id)
        if queued is not None and queued.revision >= snapshot.revision:
            return False
        self.backlog[snapshot.task_id] = snapshot
        self._wakeup.set()
        return queued is not None

    def take(self) -> list[TaskSnapshot]:
        """Everything queued so far, oldest task first."""
        if not self.backlog:
            return []
        batch = list(self.backlog.values())
        self.backlog.clear()
        return batch

    def close(self, *, disconnected: bool = False) -> None:
        if disconnected:
            self.disconnected = True
        else:
            self.closing = True
        self._wakeup.set()

    async def wait(self, timeout: float) -> bool:
        """Wait for news up to `timeout` seconds; False on time-out (time for a keep-alive)."""
        if not self._wakeup.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                return False
        self._wakeup.clear()
        return True


class Fanout:
    """The registry of subscribers by task id."""

    def __init__(self, metrics: Metrics) -> None:
        self._by_task: dict[str, set[Subscriber]] = {}
        self._subscribers: set[Subscriber] = set()
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
        for task_id in list(subscriber.task_ids):
            self.unfollow(subscriber, task_id)
        subscriber.backlog.clear()
        self._metrics.open_streams.set(len(self._subscribers))
        if not self._subscribers:
            self._empty.set()

    def publish(self, snapshot: TaskSnapshot) -> None:
        """Hand a new revision to every follower of its task."""
        followers = self._by_task.get(snapshot.task_id)
        if not followers:
            return
        coalesced = sum(subscriber.offer(snapshot) for subscriber in followers)
        if coalesced:
            self._metrics.coalesced_frames.inc(coalesced)
        if snapshot.terminal:
            # §8 item 18: nothing follows a terminal state; stop tracking the task.
            del self._by_task[snapshot.task_id]
            for subscriber in followers:
                subscriber.task_ids.discard(snapshot.task_id)

    def forget(self, task_id: str) -> None:
        """The task expired or was deleted: nobody follows it any more."""
        followers = self._by_task.pop(task_id, None)
        for subscriber in followers or ():
            subscriber.task_ids.discard(task_id)

    def close_all(self) -> None:
        """Shutdown: every stream sends its completion result and ends."""
        for subscriber in list(self._subscribers):
            subscriber.close()

    def unfollow(self, subscriber: Subscriber, task_id: str) -> None:
        """Stop delivering `task_id` to `subscriber` (what is queued still goes out)."""
        subscriber.task_ids.discard(task_id)
        followers = self._by_task.get(task_id)
        if followers is None:
            return
        followers.discard(subscriber)
        if not followers:
            del self._by_task[task_id]
