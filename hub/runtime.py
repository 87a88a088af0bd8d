"""The hub's long-lived state: cache, fan-out, NATS source and metrics, wired together.

Created once per process (the app's lifespan or a test) and passed to whoever needs
it; nothing here is global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from hub.auth import Authenticator
from hub.cache import Rejected, TaskCache
from hub.config import Config
from hub.fanout import Fanout
from hub.limits import PollLimiter, StreamLimiter
from hub.metrics import Metrics
from hub.nats_source import NatsSource

log = logging.getLogger("taskhub")


class Hub:
    def __init__(self, config: Config, nats_url: str) -> None:
        self.config = config
        self.metrics = Metrics()
        self.fanout = Fanout(self.metrics)
        self.cache = TaskCache(
            on_change=self.fanout.publish,
            on_remove=self.fanout.forget,
            on_reject=self._count_rejection,
        )
        self.source = NatsSource(
            nats_url,
            config.bucket,
            self.cache,
            self.metrics,
            replicas=config.replicas,
            nats_options=config.nats_options(),
        )
        self.metrics.cached_tasks.track(lambda: len(self.cache))
        self.authenticator = Authenticator.from_settings(config.auth)
        self.polls = PollLimiter(config.poll_burst, config.default_poll_interval)
        # Without auth every caller is "anonymous": only the total limit means anything.
        per_principal = (
            config.max_streams_per_principal if config.auth_enabled else config.max_streams
        )
        self.streams = StreamLimiter(config.max_streams, per_principal)
        self.closing = False
        self._background: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        return self.source.ready and not self.closing

    async def start(self) -> None:
        await self.source.start()
        self._background = [
            asyncio.create_task(self._sweep_expired()),
            asyncio.create_task(self._tick_streams()),
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
        await self.source.close()

    async def _sweep_expired(self) -> None:
        while True:
            await asyncio.sleep(self.config.expiry_sweep_interval)
            self.cache.sweep()

    async def _tick_streams(self) -> None:
        """Keep-alives and stalled-stream checks for every stream, from one task."""
        keepalive, send_timeout = self.config.keepalive, self.config.send_timeout
        period = min(1.0, keepalive / 2, send_timeout / 2)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            self.fanout.tick(loop.time(), keepalive, send_timeout)

    def _count_rejection(self, reason: Rejected) -> None:
        self.metrics.kv_rejected.inc(1, reason.value)
