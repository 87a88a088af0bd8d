"""A minimal watch of the task bucket, shared by the raw ceiling and the origin baseline.

Both reference servers must see exactly the task states the hub sees, from the same
NATS stream, read the way the hub reads them (hub/store/bucket_watch.py: a push consumer on a
connection of its own, frames cut without nats-py's subscription path); what they skip is
everything the hub adds on top (validation, reader rules, metrics). Ready once every value
stored before the watch began has been applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import nats
from nats.aio.client import Client
from nats.js import api

from bridge.wire import kv_stream
from hub.store.bucket_watch import BucketWatch as Feed

log = logging.getLogger("bench.watch")

PutListener = Callable[[str, bytes], None]
DeleteListener = Callable[[str], None]


class BucketWatch:
    def __init__(self, on_put: PutListener, on_delete: DeleteListener) -> None:
        self.on_put = on_put
        self.on_delete = on_delete
        self.ready = asyncio.Event()
        self.nc: Client | None = None
        self._feed: Feed | None = None
        self._catch_up_seq = 0

    async def start(self, nats_url: str, bucket: str) -> None:
        self.nc = await nats.connect(nats_url)
        js = self.nc.jetstream()
        info = await js.stream_info(kv_stream(bucket))
        self._catch_up_seq = info.state.last_seq if info.state.messages else 0
        if self._catch_up_seq == 0:
            self.ready.set()
        self._feed = Feed(
            js, kv_stream(bucket), bucket, self._apply, self._progressed, _ended, _kept
        )
        await self._feed.start(
            [nats_url], {}, api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
        )

    def _apply(self, key: str, seq: int, removed: bool, data: bytes) -> None:
        if removed:
            self.on_delete(key)
        else:
            self.on_put(key, data)

    def _progressed(self, pending: int) -> None:
        assert self._feed is not None
        if pending == 0 or self._feed.applied >= self._catch_up_seq:
            self.ready.set()

    async def close(self) -> None:
        if self._feed is not None:
            await self._feed.close()
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()


def _ended(feed: Feed) -> None:
    log.error("the bucket watch ended (%s): this server sees no more changes", feed.ended)


def _kept(name: str) -> None:
    """A consumer replaced after a lost delivery: left to expire (a bench's run is short)."""
