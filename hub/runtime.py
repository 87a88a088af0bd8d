"""The hub's long-lived state: cache, fan-out, NATS source and metrics, wired together.

Created once per process (the app's lifespan or a test) and passed to whoever needs
it; nothing here is global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from hub.admission.auth import Authenticator
from hub.admission.limits import PollLimiter, StreamLimiter
from hub.config import Config
from hub.front_door.upstream_events import UpstreamEvents
from hub.front_door.upstream_tasks import UpstreamTasks
from hub.metrics import Metrics
from hub.push.fanout import Fanout
from hub.push.fleet_events import EventSource
from hub.push.viewer import Viewer, sse_event
from hub.settings import load_resource_rule
from hub.store.cache import TaskCache
from hub.store.fleet_view import FLEET_EVERY_S, FleetView
from hub.store.snapshot import Rejected, TaskSnapshot
from hub.store.source import NatsSource

log = logging.getLogger("taskhub")


class Hub:
    def __init__(self, config: Config, nats_url: str) -> None:
        self.config = config
        self.metrics = Metrics()
        self.fanout = Fanout(self.metrics)
        self.cache = TaskCache(self)  # the hub is the store's listener (hub/store/listener.py)
        # Requests waiting for a task's next revision (tasks/update, read-your-update).
        self._waiters: dict[str, set[asyncio.Future[TaskSnapshot | None]]] = {}
        # Whoever follows every task of one owner (the legacy door's notification streams).
        self._owner_followers: dict[str, set[Callable[[TaskSnapshot], None]]] = {}
        self.source = NatsSource(
            nats_url,
            config.bucket,
            self.cache,
            self.metrics,
            listener=self,
            replicas=config.replicas,
            nats_options=config.nats_options(),
            plain_options=config.nats_plain_options(),
            monitor_url=config.nats_monitor_url,
            checkpoint_path=config.checkpoint,
            checkpoint_every=config.checkpoint_every,
        )
        self.fleet = FleetView(self.cache, config.silent_after)
        self._fleet_frames = (b"", b"")  # the latest `fleet` event: without, with servers
        self.events = EventSource(self.fanout, self.metrics)
        self.resource_rule = load_resource_rule(config.resource_rule)
        self.metrics.cached_tasks.track(lambda: len(self.cache))
        self.metrics.operator_streams.track(lambda: self.fanout.viewers)
        self.authenticator = Authenticator.from_settings(config.auth)
        self.polls = PollLimiter(config.poll_burst, config.default_poll_interval)
        # Without auth every caller is "anonymous": only the total limit means anything.
        per_principal = (
            config.max_streams_per_principal if config.auth_enabled else config.max_streams
        )
        self.streams = StreamLimiter(config.max_streams, per_principal)
        # Tasks upstreams keep themselves (the front door's; hub/front_door/upstream_tasks.py).
        self.upstream_tasks = UpstreamTasks(
            auth=config.auth_enabled,
            retention=config.upstream_task_retention,
            limit=config.max_upstream_tasks,
            default_interval=config.default_poll_interval,
            bucket=config.bucket,
            replicas=config.replicas,
            publish=self._kept_changed,
            remove=self.removed,
            in_snapshot=self._in_store,
        )
        # An upstream's own listen, held for list changes it does not announce on NATS.
        self.upstream_events = UpstreamEvents(self.fanout, self.events.announcing)
        self.events.on_announcing = self.upstream_events.announced
        self.closing = False
        self._background: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        return self.source.ready and not self.closing

    async def start(self) -> None:
        await self.source.start()
        await self.events.start(self.source.nc)
        if self.config.upstreams:
            await self.upstream_tasks.start(self.source.js)
        self._background = [
            asyncio.create_task(self._sweep_expired()),
            asyncio.create_task(self._tick_streams()),
            asyncio.create_task(self._tick_fleet()),
        ]

    def begin_shutdown(self) -> None:
        """End every listen stream gracefully (H63); a listen request still arriving gets its
        ack and current states, then its completion result at once."""
        if not self.closing:
            log.info("shutting down: closing %d listen streams", len(self.fanout))
        self.closing = True
        self.fanout.close_all()

    async def stop(self) -> None:
        self.begin_shutdown()
        if not await self.fanout.drained(self.config.shutdown_grace):
            log.warning("%d listen streams did not close in time", len(self.fanout))
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.events.stop()
        await self.upstream_tasks.stop()
        await self.upstream_events.stop()
        await self.source.close()

    async def _sweep_expired(self) -> None:
        while True:
            await asyncio.sleep(self.config.expiry_sweep_interval)
            self.cache.sweep()
            self.upstream_tasks.kept.sweep()

    async def _tick_streams(self) -> None:
        """Keep-alives and stalled-stream checks for every stream, from one task."""
        keepalive, send_timeout = self.config.keepalive, self.config.send_timeout
        period = min(1.0, keepalive / 2, send_timeout / 2)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            self.fanout.tick(loop.time(), keepalive, send_timeout)

    async def _tick_fleet(self) -> None:
        """The operator streams' `fleet` events, every FLEET_EVERY_S while any is open."""
        await self.source.wait_caught_up()
        self.fleet.start_counting()
        while True:
            await asyncio.sleep(FLEET_EVERY_S)
            if self.fanout.viewers:
                await self.fleet.refresh_control(self.source.js)
                self._fleet_frames = self._build_fleet_frames()
                self.fanout.publish_to_viewers("fleet", self._fleet_frame_for)

    def fleet_frame(self, servers: bool) -> bytes:
        """A `fleet` event as of now, for a new operator stream (with the servers or not)."""
        return self._build_fleet_frames()[servers]

    def _fleet_frame_for(self, viewer: Viewer) -> bytes:
        return self._fleet_frames[viewer.fleet]

    def _build_fleet_frames(self) -> tuple[bytes, bytes]:
        state = {"ready": self.ready, "at": round(time.time() * 1000)}
        return (
            sse_event("fleet", {**state, "servers": []}),
            sse_event("fleet", {**state, "servers": self.fleet.servers()}),
        )

    def next_change(self, task_id: str) -> asyncio.Future[TaskSnapshot | None]:
        """Resolves with the task's next accepted revision, or None when it is removed.

        The caller cancels it when it stops waiting; a cancelled waiter is dropped."""
        waiter: asyncio.Future[TaskSnapshot | None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(task_id, set())
        waiters.add(waiter)

        def forget(done: asyncio.Future[TaskSnapshot | None]) -> None:
            waiters.discard(done)
            if not waiters and self._waiters.get(task_id) is waiters:
                del self._waiters[task_id]

        waiter.add_done_callback(forget)
        return waiter

    def follow_owner(
        self, owner: str, callback: Callable[[TaskSnapshot], None]
    ) -> Callable[[], None]:
        """Call `callback` with each accepted revision of `owner`'s tasks; returns the
        function that stops it."""
        viewers = self._owner_followers.setdefault(owner, set())
        viewers.add(callback)

        def unfollow() -> None:
            viewers.discard(callback)
            if not viewers and self._owner_followers.get(owner) is viewers:
                del self._owner_followers[owner]

        return unfollow

    # -- the store's listener (hub/store/listener.py) ----------------------------------------

    def changed(self, snapshot: TaskSnapshot) -> None:
        self.fanout.publish(snapshot)
        self.fleet.wrote(snapshot)
        if self._waiters:
            self._wake(snapshot.task_id, snapshot)
        if self._owner_followers:
            for callback in list(self._owner_followers.get(snapshot.owner, ())):
                callback(snapshot)

    async def _in_store(self, task_id: str) -> bool:
        """Whether the bucket holds the task (cached, or read through; raises
        StoreUnavailable)."""
        return await self.source.read_through(task_id) is not None

    def current(self, task_id: str) -> TaskSnapshot | None:
        """The task's state, the snapshot's or, if an upstream keeps it, the last observed."""
        snapshot = self.cache.get(task_id)
        if snapshot is None:
            kept = self.upstream_tasks.kept.get(task_id)
            snapshot = None if kept is None else kept.snapshot
        return snapshot

    def _kept_changed(self, snapshot: TaskSnapshot) -> None:
        """A new state of a task an upstream keeps: its streams and waiters hear of it (not
        the owner's legacy notification streams, whose owner may be anyone without auth)."""
        self.fanout.publish(snapshot)
        if self._waiters:
            self._wake(snapshot.task_id, snapshot)

    def removed(self, snapshot: TaskSnapshot) -> None:
        self.fanout.publish_removal(snapshot)
        if self._waiters:
            self._wake(snapshot.task_id, None)

    def rejected(self, reason: Rejected) -> None:
        self.metrics.kv_rejected.inc(1, reason.value)

    def hold(self) -> None:
        self.fanout.hold()

    def release(self) -> None:
        self.fanout.release()

    def reconnected(self) -> None:
        self.events.reconnected()

    def _wake(self, task_id: str, snapshot: TaskSnapshot | None) -> None:
        for waiter in list(self._waiters.get(task_id, ())):
            if not waiter.done():
                waiter.set_result(snapshot)
