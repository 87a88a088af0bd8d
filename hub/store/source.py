"""The hub's NATS side: watch the task bucket into the cache, read through on a miss.

The watch is an ordered push consumer over the bucket's stream (last value per key,
then every change), read on a connection of its own (hub/store/bucket_watch.py). Catch-up is
decided from the stream itself, not from the first "no pending" marker alone (nats.py's
KV watcher can signal it early, upstream PR 995): the cache is caught up once it has
applied everything up to the stream's last sequence as seen after the consumer was made,
or the consumer reports nothing pending and nothing undelivered. Only then is the hub
ready.

A miss reads the key from the stream leader (`STREAM.MSG.GET`, not a direct get that
a lagging follower could answer), so a task created anywhere is found everywhere
(invariant 1, H44). An answer is believed only from a leader that still has its quorum
and a store at least as new as anything this hub has seen (bridge/store_reads.py): a
leader cut off from the others answers from its old store until it notices, and that
answer must not become a false -32602 or an old state.

Readiness is vouched for by the same leader: a ready hub's check asks its consumer and
the stream's leader each time, and a leader that has not heard from a quorum of its
replicas lately, or no answer at all, makes the hub re-watch and not ready. Which leader
answers, and through which NATS server: hub/store/leader_choice.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.errors import NotFoundError

from bridge.elections import STREAM_LEADER_ELECTED
from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.store_reads import StoreUnavailable, StoreView, leads_with_quorum, read_last
from bridge.wire import (
    CONTROL_STREAM,
    control_subject,
    is_removal,
    is_task_id,
    kv_stream,
    kv_subject,
)
from hub.metrics import Metrics
from hub.store.bucket_watch import Batch, BucketWatch
from hub.store.cache import TaskCache
from hub.store.checkpointer import Checkpoints
from hub.store.durability import report_durability
from hub.store.first_read.run import read_in_bulk
from hub.store.first_read.worker import SPLIT_FROM, split_at
from hub.store.leader_choice import LeaderChoice
from hub.store.listener import NOBODY, Listener
from hub.store.snapshot import TaskSnapshot

log = logging.getLogger("taskhub.nats")


# The server deletes a watch consumer this long after its hub went away.
INACTIVE_CONSUMER_S = 10.0
# How often a ready hub checks that its watch consumer still delivers, how long it waits
# for the answer, and how many checks in a row may see pending messages not delivered.
WATCH_CHECK_S = 0.5
WATCH_CHECK_TIMEOUT_S = 1.0
WATCH_STUCK_CHECKS = 3
# So a ready hub is at most this far behind its bucket (docs/production.md, the failure model).
WATCH_STALE_BOUND_S = max(
    WATCH_CHECK_S + WATCH_CHECK_TIMEOUT_S, (WATCH_STUCK_CHECKS + 1) * WATCH_CHECK_S
)
# How long the bucket stream must show a sequence behind the hub's before it counts as reset.
CONFIRM_RESET_S = 3.0
# How long a re-watch keeps asking JetStream to delete the consumer it replaced.
FORGET_CONSUMER_S = 60.0
# How long a closing hub waits to delete its watch's consumer (else it expires).
CLOSE_DELETE_S = 1.0


__all__ = ["NatsSource", "StoreUnavailable"]  # StoreUnavailable: the caller answers -32603


def _created(info: api.StreamInfo) -> str:
    """The stream's creation time: a bucket deleted and made anew has another."""
    return info.created.isoformat() if info.created is not None else ""


class NatsSource:
    def __init__(
        self,
        nats_url: str,
        bucket: str,
        cache: TaskCache,
        metrics: Metrics,
        *,
        listener: Listener = NOBODY,
        replicas: int = 1,
        request_timeout: float = 2.0,
        nats_options: dict[str, Any] | None = None,
        monitor_url: str | None = None,
        checkpoint_path: Path | None = None,
        checkpoint_every: float = 0.0,
        plain_options: dict[str, Any] | None = None,
        split_from: int = SPLIT_FROM,
    ) -> None:
        self.nats_options = nats_options or {}
        # The options as JSON carries them, for the first read's worker (TLS as its files):
        # without them, and with a TLS context in `nats_options`, one process reads.
        if plain_options is None and "tls" not in self.nats_options:
            plain_options = self.nats_options
        self.plain_options = plain_options
        self.split_from = split_from  # messages from which two processes read the first time
        self.monitor_url = monitor_url  # NATS monitoring, for the sync policy
        self.nats_url = nats_url
        self._servers = [url.strip() for url in nats_url.split(",") if url.strip()]
        self.bucket = bucket
        self.stream = kv_stream(bucket)
        self.cache = cache
        self.metrics = metrics
        self.replicas = replicas
        self.request_timeout = request_timeout
        self.nc: NatsClient | None = None
        self.js: Any = None
        self._feed: BucketWatch | None = None
        self._caught_up = asyncio.Event()
        self._catch_up_seq = 0  # stream sequence the cache must reach to be current
        self._applied_seq = 0  # highest stream sequence applied from the watch
        self._view = StoreView()  # highest stream sequence any store answer showed
        self._stream_created = ""  # the bucket stream's creation time, as of the last watch
        self._behind_since = 0.0  # when the stream first showed a sequence behind ours
        self._leader = LeaderChoice(self._servers, self.stream)
        self._catch_up_task: asyncio.Task[None] | None = None
        self._first_read_task: asyncio.Task[None] | None = None
        self._first_read_tried = False  # once per bucket stream: if it fails, the watch reads
        self._closing = False
        self._rewatch_task: asyncio.Task[None] | None = None
        self._check_task: asyncio.Task[None] | None = None
        self.checkpoints = (
            None
            if checkpoint_path is None
            else Checkpoints(
                checkpoint_path,
                checkpoint_every,
                bucket=bucket,
                cache=cache,
                metrics=metrics,
                watched=self,
            )
        )
        self._cleanups: set[asyncio.Task[None]] = set()
        self._listener = listener  # the cache's too: told of every change
        # Around each batch of changes the watch read at once: delivered together.
        self._batch: Batch = (listener.hold, listener.release)

    @property
    def ready(self) -> bool:
        return self.nc is not None and self.nc.is_connected and self._caught_up.is_set()

    async def start(self) -> None:
        self.nc = await nats.connect(
            servers=self._servers,
            name="taskhub",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            error_cb=self._on_error,
            **self.nats_options,
        )
        self.js = self.nc.jetstream(timeout=self.request_timeout)
        self._leader.attach(self.nc, self.js)
        # Re-watch on a new leader the moment it is elected, not a request timeout later.
        await self.nc.subscribe(STREAM_LEADER_ELECTED + self.stream, cb=self._leader.on_elected)
        await ensure_bucket(self.js, self.bucket, self.replicas)
        await ensure_control_stream(self.js, self.replicas)
        await report_durability(
            self.js, self.stream, self.metrics, self.monitor_url, self.request_timeout
        )
        if self.checkpoints is not None:
            await self._restore(self.checkpoints)
        try:
            await self._watch()
        except StoreUnavailable as exc:  # a leader without its quorum: not ready yet
            log.warning("cannot watch the bucket yet (%s); retrying", exc)
            self._restart_watch(counted=False)
        self._check_task = asyncio.create_task(self._check_watch())
        if self.checkpoints is not None:
            self.checkpoints.start()

    async def _restore(self, checkpoints: Checkpoints) -> None:
        """Fill the cache from a checkpoint of this stream, so the watch resumes after it."""
        info = await self.js.stream_info(self.stream)
        created = _created(info)
        seq = checkpoints.restore(created, info.state.last_seq)
        if seq is not None:
            self._applied_seq = seq
            self._view.saw(seq)
            self._stream_created = created  # the stream the file was checked against

    @property
    def applied_seq(self) -> int:
        return self._applied_seq

    @property
    def stream_created(self) -> str:
        return self._stream_created

    async def _check_watch(self) -> None:
        """Re-make a watch that stopped delivering while the connection lived.

        The watch consumer lives on one NATS node, not necessarily the one we are
        connected to: if that node dies, nothing disconnects and nothing arrives. Ready
        means caught up, so a consumer that cannot be asked within WATCH_CHECK_TIMEOUT_S,
        or that has messages pending but delivered none for WATCH_STUCK_CHECKS checks
        running, is replaced, not trusted; so is a watch whose stream leader cannot be
        asked or has lost touch with its quorum (cut off with our node, it sees nothing
        pending while the majority writes on). A ready hub is at most WATCH_STALE_BOUND_S
        behind its bucket, and `/readyz` is 503 until the new watch has caught up.
        """
        stuck, last_delivered = 0, -1
        while not self._closing:
            await asyncio.sleep(WATCH_CHECK_S)
            feed = self._feed
            if not self.ready or feed is None:
                stuck, last_delivered = 0, -1
                continue
            try:
                async with asyncio.timeout(WATCH_CHECK_TIMEOUT_S):
                    info, stream = await asyncio.gather(
                        self.js.consumer_info(self.stream, feed.consumer),
                        self.js.stream_info(self.stream),
                    )
            except Exception as exc:
                if feed is self._feed and self.ready:
                    log.warning("bucket watch consumer unreachable (%s); re-watching", exc)
                    stuck, last_delivered = 0, -1
                    self._restart_watch()
                continue
            if not leads_with_quorum(stream):
                if feed is self._feed and self.ready:
                    log.warning(
                        "bucket stream leader %s lost touch with its replicas; re-watching",
                        stream.cluster.leader if stream.cluster else "?",
                    )
                    stuck, last_delivered = 0, -1
                    self._restart_watch()
                continue
            delivered = info.delivered.stream_seq
            stuck = stuck + 1 if info.num_pending > 0 and delivered == last_delivered else 0
            last_delivered = delivered
            if stuck >= WATCH_STUCK_CHECKS:
                log.warning("bucket watch stopped delivering; re-watching")
                stuck, last_delivered = 0, -1
                self._restart_watch()

    async def wait_caught_up(self, timeout: float | None = None) -> None:
        async with asyncio.timeout(timeout):
            await self._caught_up.wait()

    async def _watch(self, info: api.StreamInfo | None = None) -> None:
        """Start (or resume) the watch and the catch-up check that gates readiness."""
        if info is None:
            info = await self.js.stream_info(self.stream)
        if not leads_with_quorum(info):
            raise StoreUnavailable("the bucket stream's leader has lost touch with its quorum")
        created = _created(info)
        # The bucket deleted and made anew: another creation time, even when the new
        # stream's sequence has passed ours; or, where the server gives none, a sequence
        # that went backwards. The same stream behind what we applied is first taken for
        # a replica answering from behind and asked again; only when it stays behind for
        # CONFIRM_RESET_S (writes lost to a crash of every node) is it a reset.
        made_anew = bool(self._stream_created and created) and created != self._stream_created
        behind = bool(self._applied_seq and created) and info.state.last_seq < self._applied_seq
        if behind and not made_anew:
            now = time.monotonic()
            self._behind_since = self._behind_since or now
            if now - self._behind_since < CONFIRM_RESET_S:
                self.metrics.stale_reads.inc()
                raise StoreUnavailable("the bucket stream answered from behind this hub")
        self._behind_since = 0.0
        self._stream_created = created
        last_seq = info.state.last_seq if info.state.messages else 0
        if self._applied_seq and not made_anew and info.state.last_seq >= self._applied_seq:
            # Resume: with history 1, what is still stored from here on is the latest
            # value (or delete marker) of every key that changed while we were away.
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self._applied_seq + 1,
                inactive_threshold=INACTIVE_CONSUMER_S,
            )
        else:
            if self._applied_seq:
                # The bucket was deleted and made anew: what we hold describes nothing.
                log.warning("bucket stream was reset; re-reading every task")
                if self.checkpoints is not None:
                    self.checkpoints.made_anew()
                self.cache.reset()
                self._applied_seq = 0
                self._view = StoreView()
                self._first_read_tried = False
            if last_seq and not self._first_read_tried:
                # Nothing cached: read every task in bulk first, then watch from there.
                self._first_read_tried = True
                mid = 0
                if self.plain_options is not None:
                    mid = split_at(
                        info.state.first_seq, last_seq, info.state.messages, self.split_from
                    )
                self._first_read_task = asyncio.create_task(self._read_first(last_seq, mid))
                return
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                inactive_threshold=INACTIVE_CONSUMER_S,
            )
        self._catch_up_seq = last_seq
        self._view.saw(last_seq)
        feed = BucketWatch(
            self.js,
            self.stream,
            self.bucket,
            self._apply,
            self._progressed,
            self._feed_ended,
            self._forget_consumer,
            self._batch,
        )
        await feed.start(self._leader.here(), self.nats_options, config)
        self._feed = feed
        if self._catch_up_seq <= self._applied_seq:
            self._mark_caught_up()
        else:
            self._catch_up_task = asyncio.create_task(self._confirm_catch_up())

    async def _read_first(self, last_seq: int, mid: int) -> None:
        """Every task in bulk (hub/store/first_read/run.py), the messages after `mid` (if not 0) in
        a worker process; then the watch, from where the read stopped."""
        started = time.perf_counter()
        read = await read_in_bulk(
            self.js,
            self.stream,
            self.bucket,
            self.cache,
            self._apply,
            self._forget_consumer,
            (self._servers, self.nats_options),
            last_seq,
            self._worker_job(),
            mid,
        )
        self.metrics.kv_updates.inc(read.merged)
        self._applied_seq = max(self._applied_seq, read.applied)
        seconds = time.perf_counter() - started
        if read.ended_early:
            log.warning(
                "first read ended early after %d messages in %.2f s (%s); the watch reads the rest",
                read.count,
                seconds,
                read.ended_early,
            )
        elif read.apart:
            log.info(
                "first read: %d messages in %.2f s, %d of them in a worker process%s",
                read.count,
                seconds,
                read.apart,
                read.phases,
            )
        else:
            log.info("first read: %d messages in %.2f s", read.count, seconds)
        self._restart_watch(counted=False)

    def _worker_job(self) -> dict[str, Any]:
        """What a first read's worker process is told, but for its sequences."""
        options, stream, bucket = self.plain_options, self.stream, self.bucket
        return {"servers": self._servers, "options": options, "stream": stream, "bucket": bucket}

    def _apply(self, key: str, seq: int, removed: bool, data: bytes) -> None:
        if removed:
            self.cache.apply_delete(key, seq)
        elif self.cache.apply_put(key, seq, data) is not None:
            self.metrics.kv_updates.inc()
        if seq > self._applied_seq:
            self._applied_seq = seq

    async def _rewatch(self, counted: bool = True) -> None:
        """After a reconnect: drop the old consumer and resume from the last applied value."""
        while not self._closing:
            old, self._feed = self._feed, None
            for task in (self._catch_up_task, self._first_read_task):
                if task is not None:
                    task.cancel()
            try:
                if old is not None:
                    await self._discard(old)
                await self._watch(await self._leader.leader_info())
                if counted:
                    self.metrics.rewatches.inc()
                return
            except Exception as exc:
                log.warning("re-watch failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(0.5)

    async def _confirm_catch_up(self) -> None:
        """The last message may have expired before delivery: ask the consumer too."""
        feed = self._feed
        while not self._caught_up.is_set() and feed is self._feed and feed is not None:
            try:
                info = await self.js.consumer_info(self.stream, feed.consumer)
                if info.num_pending == 0 and info.delivered.stream_seq <= self._applied_seq:
                    self._mark_caught_up()
                    return
            except Exception as exc:  # retried below; NATS may be reconnecting
                log.debug("consumer info failed during catch-up: %s", exc)
            await asyncio.sleep(0.1)

    def _mark_caught_up(self) -> None:
        if not self._caught_up.is_set():
            log.info("snapshot cache caught up: %d tasks", len(self.cache))
            self._caught_up.set()
            self.metrics.ready.set(1)

    def _progressed(self, pending: int) -> None:
        """The watch applied a batch; `pending` is what its consumer had left to send."""
        if not self._caught_up.is_set() and (
            pending == 0 or self._applied_seq >= self._catch_up_seq
        ):
            self._mark_caught_up()

    async def read_store(self, task_id: str) -> Any:
        """The key's raw last message from the stream leader, or None once the elected
        leader, with a store at least as new as this hub's view (its watch, earlier
        answers), shows it is not there (bridge/store_reads.py); StoreUnavailable when no
        believable answer came within its deadline, to be retried by the client."""
        self._view.saw(self._applied_seq)
        subject = kv_subject(self.bucket, task_id)
        return await read_last(
            self.js, self.stream, subject, self._view, doubted=self.metrics.stale_reads.inc
        )

    async def read_through(self, task_id: str) -> TaskSnapshot | None:
        """The task's current snapshot, from the cache or else from the KV leader."""
        snapshot = self.cache.get(task_id)
        if snapshot is not None or not is_task_id(task_id):
            return snapshot
        raw = await self.read_store(task_id)
        self.metrics.read_through.inc(1, "false" if raw is None else "true")
        if raw is None or raw.seq is None:
            return None
        if is_removal(raw.headers):
            self.cache.apply_delete(task_id, raw.seq)
            return None
        self.cache.apply_put(task_id, raw.seq, raw.data or b"")
        return self.cache.get(task_id)

    async def publish_control(self, server: str, data: bytes, msg_id: str) -> None:
        """Queue a control message for `server`; returns once JetStream has stored it."""
        try:
            await self.js.publish(
                control_subject(server),
                data,
                stream=CONTROL_STREAM,
                headers={"Nats-Msg-Id": msg_id},  # a retried request is stored once
            )
        except Exception as exc:
            raise StoreUnavailable(f"control stream unavailable: {type(exc).__name__}") from exc

    async def close(self) -> None:
        self._closing = self._leader.closing = True
        for task in (
            self._catch_up_task,
            self._first_read_task,
            self._rewatch_task,
            self._check_task,
        ):
            if task is not None:
                task.cancel()
        if self._first_read_task is not None:  # its worker process stopped and reaped
            await asyncio.wait({self._first_read_task})
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.close()  # nothing is applied after this
            if feed.consumer and self.nc is not None and self.nc.is_connected:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CLOSE_DELETE_S):
                        await self.js.delete_consumer(self.stream, feed.consumer)
        if self.checkpoints is not None:
            await self.checkpoints.close()
        if self.nc is not None and not self.nc.is_closed:
            try:
                await self.nc.drain()
            except Exception as exc:
                log.warning("NATS drain failed: %s", exc)
        self.metrics.ready.set(0)
        if self.checkpoints is not None:
            self.checkpoints.save()

    def _feed_ended(self, feed: BucketWatch) -> None:
        """The watch ended by itself (a gap, a status, its connection lost): make another."""
        if feed is self._feed and not self._closing:
            log.warning("bucket watch ended (%s); re-watching", feed.ended)
            self._restart_watch()

    async def _discard(self, feed: BucketWatch) -> None:
        """Stop a watch now; delete its consumer in the background, since its node may be
        dead and a re-watch must not wait for that request to time out."""
        await feed.close()
        if feed.consumer:
            self._forget_consumer(feed.consumer)

    def _forget_consumer(self, name: str) -> None:
        """Delete a consumer in the background."""
        task = asyncio.create_task(self._delete_consumer(name))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _delete_consumer(self, name: str) -> None:
        """Asked again until JetStream has it gone: one left to its inactivity expiry can
        outlive a partition for a minute (its assignment "not cleaned up, retrying")."""
        deadline = time.monotonic() + FORGET_CONSUMER_S
        while not self._closing:
            try:
                await self.js.delete_consumer(self.stream, name)
                return
            except NotFoundError:
                return
            except Exception as exc:  # no leader, a timeout, a reconnect
                if time.monotonic() > deadline:
                    log.warning("consumer %s not deleted (%s); left to expire", name, exc)
                    return
            await asyncio.sleep(1.0)

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("NATS disconnected")
        self.metrics.ready.set(0)

    async def _on_reconnected(self) -> None:
        log.info("NATS reconnected")
        self._leader.reconnected()
        self._restart_watch()
        self._listener.reconnected()

    def _restart_watch(self, counted: bool = True) -> None:
        """Not ready until the cache has caught up with what changed meanwhile."""
        self._caught_up.clear()
        self.metrics.ready.set(0)
        if self._rewatch_task is None or self._rewatch_task.done():
            self._rewatch_task = asyncio.create_task(self._rewatch(counted))

    async def _on_error(self, exc: Exception) -> None:
        log.warning("NATS error: %s", exc)
