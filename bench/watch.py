"""A minimal watch of the task bucket, shared by the raw ceiling and the origin baseline.

Both reference servers must see exactly the task states the hub sees, from the same
NATS stream, at the same cost of the nats-py client; what they skip is everything the
hub adds on top (validation, reader rules, metrics). Ready once every value stored
before the watch began has been applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from bridge.wire import is_removal, kv_stream

PutListener = Callable[[str, bytes], None]
DeleteListener = Callable[[str], None]


class BucketWatch:
    def __init__(self, on_put: PutListener, on_delete: DeleteListener) -> None:
        self.on_put = on_put
        self.on_delete = on_delete
        self.ready = asyncio.Event()
        self.nc: Client | None = None
        self._prefix_len = 0
        self._catch_up_seq = 0

    async def start(self, nats_url: str, bucket: str) -> None:
        self.nc = await nats.connect(nats_url)
        js = self.nc.jetstream()
        info = await js.stream_info(kv_stream(bucket))
        self._catch_up_seq = info.state.last_seq if info.state.messages else 0
        self._prefix_len = len(bucket) + 5  # "$KV.<bucket>."
        if self._catch_up_seq == 0:
            self.ready.set()
        await js.subscribe(
            f"$KV.{bucket}.>",
            stream=kv_stream(bucket),
            cb=self._on_msg,
            ordered_consumer=True,
            config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT),
            pending_msgs_limit=0,
            pending_bytes_limit=0,
        )

    async def _on_msg(self, msg: Msg) -> None:
        key = msg.subject[self._prefix_len :]
        if is_removal(msg.headers):
            self.on_delete(key)
        else:
            self.on_put(key, msg.data)
        if not self.ready.is_set():
            meta = msg.metadata
            if meta.num_pending == 0 or meta.sequence.stream >= self._catch_up_seq:
                self.ready.set()

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()
