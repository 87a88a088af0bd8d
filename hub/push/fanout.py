"""Fan-out: which listen streams follow which tasks, and getting each change to them.

Each stream (hub/push/subscriber.py) keeps a backlog of at most one snapshot per task it
follows, so a stalled client costs memory bounded by the tasks it follows, never by
the update rate (invariant 5).

Delivery is batched per event-loop turn, or per read of the watch (`hold`, `release`):
`publish` marks followers dirty and one flush writes each dirty stream's backlog as one
chunk, straight to its socket (hub/http/connection.py) when the socket takes it. Streams
that follow one task alone and take writes ride its express lane (hub/push/followers.py):
the flush writes them the task's newest revision in one pass, with no backlog. Only a
stream that cannot take a write now (socket buffer full, or no direct channel) wakes its
own writer. One hub-wide tick, not a timer per stream, sends keep-alives and drops
streams whose client stopped reading.

Operator streams (hub/push/viewer.py, docs/dashboard.md) are viewers: they see every
published revision and removal through their own filter. Their flush runs at most every
WATCHER_BATCH_S: a person's screen draws 60 times a second, and changes that arrive
meanwhile go out in one write per dashboard instead of one each.

Fleet change events (docs/fleet-events.md) take the same path: `publish_event` queues the
event's frame on every stream that asked for it at that service's endpoint (coalescing per
event type and URI), and the same per-turn flush writes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from bridge.wire import EVENT_KINDS
from hub.metrics import Metrics
from hub.push.followers import Followers
from hub.push.sse_frames import event_frame
from hub.push.subscriber import EndReason, Subscriber, flush_all, offer_all
from hub.push.viewer import COALESCED, TaskEvents, Viewer
from hub.store.snapshot import TaskSnapshot

# (service, kind, uri): kind "tools", "prompts", "resources" (uri "") or "resource" (a URI).
EventKey = tuple[str, str, str]
_METHODS = {kind: method.encode() for kind, method in EVENT_KINDS.values()}
WATCHER_BATCH_S = 0.01


class Fanout:
    """The registry of subscribers by task id, and the per-turn flush."""

    def __init__(self, metrics: Metrics) -> None:
        self._by_task: dict[str, Followers[Subscriber]] = {}
        self._lanes_due: dict[str, Followers[Subscriber]] = {}  # tasks with a change for their lane
        self._subscribers: set[Subscriber] = set()
        self._dirty: set[Subscriber] = set()
        self._viewers: set[Viewer] = set()
        self._viewers_dirty: set[Viewer] = set()
        self._viewer_flush: asyncio.TimerHandle | None = None
        self._running: asyncio.AbstractEventLoop | None = None  # see `_loop`
        self.task_events = TaskEvents()  # the viewers' frames, once per revision
        # Fleet events: who follows which, with the follower's principal (an audience check).
        self._by_event: dict[EventKey, dict[Subscriber, str]] = {}
        self._events_of: dict[Subscriber, list[EventKey]] = {}
        self._flush_scheduled = False
        self._held = False  # between `hold` and `release`: no turn of its own for the flush
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
            followers = self._by_task.get(task_id)
            if followers is None:
                followers = self._by_task[task_id] = Followers()
            followers.add(subscriber)
        self._metrics.open_streams.set(len(self._subscribers))

    def subscribe_viewer(self, viewer: Viewer) -> None:
        """Register an operator stream: it is offered every revision and removal."""
        self.subscribe(viewer)
        self._viewers.add(viewer)

    @property
    def viewers(self) -> int:
        return len(self._viewers)

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
        if isinstance(subscriber, Viewer):
            self._viewers.discard(subscriber)
            self._viewers_dirty.discard(subscriber)
            if not self._viewers:
                self.task_events.clear()  # nobody to share them with: free the memory
        for task_id in list(subscriber.task_ids):
            self.unfollow(subscriber, task_id)
        for key in self._events_of.pop(subscriber, ()):
            followers = self._by_event[key]
            del followers[subscriber]
            if not followers:
                del self._by_event[key]
        subscriber.backlog.clear()
        subscriber.events.clear()
        self._metrics.open_streams.set(len(self._subscribers))
        if not self._subscribers:
            self._empty.set()

    def publish(self, snapshot: TaskSnapshot) -> None:
        """Hand a new revision to every follower of its task; they are written this turn."""
        if self._viewers:
            self._offer_viewers(snapshot, Viewer.offer_task)
        followers = self._by_task.get(snapshot.task_id)
        if not followers:
            return
        others = followers.others
        coalesced = offer_all(others, snapshot)
        self._dirty |= others
        if followers.express:
            if followers.pending is not None:
                coalesced += len(followers.express)
            followers.pending = snapshot
            self._lanes_due[snapshot.task_id] = followers
        if coalesced:
            self._metrics.coalesced_frames.inc(coalesced)
        if snapshot.terminal:
            # D18: nothing follows a terminal state; stop tracking the task (its lane, if
            # it has one, is written this change and then dissolved).
            del self._by_task[snapshot.task_id]
            for subscriber in followers:
                subscriber.task_ids.discard(snapshot.task_id)
        self._schedule_flush()

    def publish_removal(self, snapshot: TaskSnapshot) -> None:
        """The task left the cache: listen streams stop following it, viewers show it gone."""
        self.forget(snapshot.task_id)
        if self._viewers:
            self.task_events.forget(snapshot.task_id)
            self._offer_viewers(snapshot, Viewer.offer_removal)

    def publish_to_viewers(self, key: str, frame_for: Callable[[Viewer], bytes]) -> None:
        """Queue a frame on every viewer (the fleet view), replacing its unsent one."""
        for viewer in self._viewers:
            viewer.offer_event(key, frame_for(viewer))
        self._viewers_dirty |= self._viewers
        if self._viewers:
            self._schedule_viewer_flush()

    def _offer_viewers(
        self, snapshot: TaskSnapshot, offer: Callable[[Viewer, TaskSnapshot], int]
    ) -> None:
        coalesced = 0
        queued = False
        for viewer in self._viewers:
            outcome = offer(viewer, snapshot)
            if outcome:
                queued = True
                coalesced += outcome == COALESCED
                self._viewers_dirty.add(viewer)
        if coalesced:
            self._metrics.coalesced_frames.inc(coalesced)
        if queued:
            self._schedule_viewer_flush()

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, kept: CPython 3.11 asks the kernel for its pid each time
        `get_running_loop` is called, and a flush runs many times a second."""
        loop = self._running
        if loop is None or loop.is_closed():
            loop = self._running = asyncio.get_running_loop()
        return loop

    def _schedule_viewer_flush(self) -> None:
        if self._viewer_flush is None:
            self._viewer_flush = self._loop().call_later(WATCHER_BATCH_S, self._flush_viewers)

    def _flush_viewers(self) -> None:
        self._viewer_flush = None
        dirty, self._viewers_dirty = self._viewers_dirty, set()
        now = self._loop().time()
        sent = 0
        for viewer in dirty:
            sent += viewer.flush(now)
        if sent:
            self._metrics.notifications_sent.inc(sent)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and not self._held:
            self._flush_scheduled = True
            self._loop().call_soon(self._flush)

    def hold(self) -> None:
        """What is published until `release` is written by it rather than in a loop turn
        of its own: the changes of one read of the watch go out as the last is applied.
        A turn more per read would be an event-loop pass and an `epoll_wait` per revision."""
        self._held = True

    def release(self) -> None:
        self._held = False
        if self._dirty or self._lanes_due:
            self._flush()

    def follow_events(
        self,
        subscriber: Subscriber,
        service: str,
        principal: str,
        kinds: Iterable[str] = (),
        uris: Iterable[str] = (),
    ) -> None:
        """Deliver `service`'s list-changed events of `kinds`, and updates of `uris`."""
        keys = [(service, kind, "") for kind in kinds] + [(service, "resource", u) for u in uris]
        for key in keys:
            self._by_event.setdefault(key, {})[subscriber] = principal
        self._events_of.setdefault(subscriber, []).extend(keys)

    def publish_event(
        self, service: str, kind: str, uri: str = "", principals: Iterable[str] | None = None
    ) -> int:
        """Queue an event for every stream following it (for `principals` only, if given);
        returns how many streams it was queued for."""
        followers = self._by_event.get((service, kind, uri))
        if not followers:
            return 0
        if principals is None:
            return self.deliver_event(followers, kind, uri)
        audience = frozenset(principals)
        return self.deliver_event(
            [subscriber for subscriber, principal in followers.items() if principal in audience],
            kind,
            uri,
        )

    def deliver_event(self, subscribers: Iterable[Subscriber], kind: str, uri: str = "") -> int:
        """Queue an event for these streams (an upstream's own listen, held for them, or
        the followers `publish_event` chose); returns how many."""
        method = _METHODS[kind]
        backlog_key = kind if kind != "resource" else "resource:" + uri
        queued = coalesced = 0
        for subscriber in subscribers:
            frame = event_frame(subscriber.subscription_id, method, uri or None)
            coalesced += subscriber.offer_event(backlog_key, frame)
            self._dirty.add(subscriber)
            queued += 1
        if coalesced:
            self._metrics.coalesced_frames.inc(coalesced)
        if queued:
            self._schedule_flush()
        return queued

    def resend_events(self) -> None:
        """After an event source gap (NATS reconnect): tell every follower "list again".

        Events are not stored, so one published during the gap is gone; a spurious
        list-changed or updated costs a client one refetch, a lost one leaves it stale.
        """
        for service, kind, uri in list(self._by_event):
            self.publish_event(service, kind, uri)

    def _flush(self) -> None:
        self._flush_scheduled = False
        now = self._loop().time()
        sent = 0
        if self._lanes_due:
            lanes, self._lanes_due = self._lanes_due, {}
            for task_id, followers in lanes.items():
                sent += followers.write_pending(now)
                if self._by_task.get(task_id) is not followers:
                    followers.dissolve()  # its task's terminal state was the last change
        dirty, self._dirty = self._dirty, set()
        joiners: list[Subscriber] = []
        sent += flush_all(dirty, now, joiners)
        for subscriber in joiners:
            self._join_lane(subscriber)
        if sent:
            self._metrics.notifications_sent.inc(sent)

    def _join_lane(self, subscriber: Subscriber) -> None:
        """Into its task's express lane: `flush_all` just wrote it a chunk of one state, it
        follows one task on an `express` channel; it must follow no fleet events and be
        still writable (a write can fill its socket buffer)."""
        if subscriber in self._events_of or subscriber.lane is not None:
            return
        channel = subscriber.channel
        if channel is None or not channel.writable or not subscriber.live or subscriber.backlog:
            return
        for task_id in subscriber.task_ids:
            followers = self._by_task.get(task_id)
            if followers is not None and subscriber in followers.others:
                followers.join(subscriber)

    def tick(self, now: float, keepalive: float, send_timeout: float) -> None:
        """Keep-alives for idle streams (H20); drop streams stuck in a write (invariant 5).

        It runs every second over every stream and holds the loop meanwhile, so the pass
        that picks the streams to look at reads two fields of each: a stream written to
        within `keepalive` and not waiting on a write has nothing due, and only the rest
        get the full checks (what each costs: docs/scaling.md#costs-the-code-is-shaped-by)."""
        idle_since = now - keepalive
        for followers in self._by_task.values():
            if followers.express:
                followers.sync_writes()
        due = [
            subscriber
            for subscriber in self._subscribers
            if subscriber.last_write <= idle_since or subscriber.waiting_since is not None
        ]
        for subscriber in due:
            since = subscriber.stalled_since()
            if since is not None:
                if now - since > send_timeout:
                    subscriber.drop_stalled()
            elif subscriber.live and subscriber.last_write <= idle_since:
                subscriber.keepalive(now)

    def forget(self, task_id: str) -> None:
        """The task expired or was deleted: nobody follows it any more."""
        followers = self._by_task.pop(task_id, None)
        if followers is None:
            return
        for subscriber in followers:
            subscriber.task_ids.discard(task_id)
        followers.dissolve()

    def close_all(self) -> None:
        """Shutdown: every stream sends its completion result and ends."""
        for subscriber in list(self._subscribers):
            subscriber.finish(EndReason.SHUTDOWN)

    def unfollow(self, subscriber: Subscriber, task_id: str) -> None:
        """Stop delivering `task_id` to `subscriber` (what is queued still goes out)."""
        subscriber.task_ids.discard(task_id)
        followers = self._by_task.get(task_id)
        if followers is None:
            return
        followers.remove(subscriber)
        if not followers:
            del self._by_task[task_id]
