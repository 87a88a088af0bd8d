"""The bucket watch on its own connection, against a real nats-server.

Each test runs one `BucketWatch` over a fresh bucket and records what it applies; the
faults are real: a TCP proxy (tests/nats_proxy.py) that loses deliveries or cuts the
connection, and a hub's consumer deleted by another client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.js import api

from bridge.wire import kv_stream, kv_subject
from hub.store.bucket_watch import BucketWatch
from tests.helpers import envelope, eventually, free_port, new_task_id, start_hub
from tests.nats_proxy import NatsProxy

pytestmark = pytest.mark.timeout(60)


@dataclass
class Watched:
    """A watch and what it did: (key, stream sequence, removed) applied, the pending
    counts it reported, the consumers it handed back, whether it ended by itself."""

    watch: BucketWatch
    applied: list[tuple[str, int, bool]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)

    def key_list(self) -> list[str]:
        return [key for key, _, _ in self.applied]


@contextlib.asynccontextmanager
async def watching(
    js: Any, bucket: str, *urls: str, options: dict[str, Any] | None = None
) -> AsyncIterator[Watched]:
    """A watch of `bucket` through `urls` from the last value of every key, closed after."""
    holder: list[Watched] = []

    def apply(key: str, seq: int, removed: bool, data: bytes) -> None:
        holder[0].applied.append((key, seq, removed))

    watch = BucketWatch(
        js,
        kv_stream(bucket),
        bucket,
        apply,
        lambda pending: holder[0].pending.append(pending),
        lambda w: holder[0].ends.append(w.ended),
        lambda name: holder[0].forgotten.append(name),
    )
    holder.append(Watched(watch))
    await watch.start(
        list(urls),
        options or {},
        api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT),
    )
    try:
        yield holder[0]
    finally:
        await watch.close()


async def put(js: Any, bucket: str, key: str, value: bytes = b"{}") -> int:
    return int((await js.publish(kv_subject(bucket, key), value)).seq)


async def test_every_change_arrives_once_in_order_removals_told_apart(
    js: Any, bucket: str, nats_url: str
) -> None:
    kv = await js.key_value(bucket)
    before = [await kv.put("a", b"1"), await kv.put("b", b"1"), await kv.put("a", b"2")]
    async with watching(js, bucket, nats_url) as watched:
        await eventually(lambda: len(watched.applied) == 2)
        assert watched.applied == [("b", before[1], False), ("a", before[2], False)]
        await kv.put("c", b"1")
        await kv.delete("a")
        await kv.purge("b")
        last = (await js.stream_info(kv_stream(bucket))).state.last_seq
        after = [last - 2, last - 1, last]
        await eventually(lambda: len(watched.applied) == 5)
        assert watched.applied[2:] == [
            ("c", after[0], False),
            ("a", after[1], True),
            ("b", after[2], True),
        ]
        assert watched.pending[-1] == 0 and watched.watch.applied == after[2]
        assert watched.ends == [] and watched.forgotten == []
    assert watched.ends == []  # closing is not ending by itself


async def test_a_burst_past_flow_controls_window_arrives_whole(
    js: Any, bucket: str, nats_url: str
) -> None:
    """24 MB at once: the server asks for flow control on the way and, unanswered, stops
    delivering after a few hundred messages."""
    async with watching(js, bucket, nats_url) as watched:
        value = b"x" * 8000
        for start in range(0, 3000, 500):
            await asyncio.gather(
                *(put(js, bucket, f"k{i}", value) for i in range(start, start + 500))
            )
        await eventually(lambda: len(watched.applied) == 3000, timeout=30)
        assert sorted(int(key[1:]) for key in watched.key_list()) == list(range(3000))
        assert watched.ends == []


async def test_a_lost_delivery_is_read_again_in_place_from_the_next_one(
    js: Any, bucket: str, proxy: NatsProxy
) -> None:
    async with watching(js, bucket, proxy.url) as watched:
        first = await put(js, bucket, "k1")
        await eventually(lambda: watched.key_list() == ["k1"])
        consumer = watched.watch.consumer
        proxy.drop_deliveries(1)
        lost = await put(js, bucket, "k2")
        await eventually(lambda: proxy.dropped_deliveries == 1)
        gap = await put(js, bucket, "k3")  # its consumer sequence shows one missing
        await eventually(lambda: len(watched.applied) == 3)
        assert watched.applied == [("k1", first, False), ("k2", lost, False), ("k3", gap, False)]
        # A new consumer from the sequence after k1's; the old one handed back for deletion.
        assert watched.forgotten == [consumer] and watched.watch.consumer != consumer
        assert watched.ends == []


async def test_a_lost_last_delivery_is_read_again_after_the_next_heartbeat(
    js: Any, bucket: str, proxy: NatsProxy
) -> None:
    async with watching(js, bucket, proxy.url) as watched:
        await put(js, bucket, "k1")
        await eventually(lambda: watched.key_list() == ["k1"])
        proxy.drop_deliveries(1)
        lost = await put(js, bucket, "k2")  # nothing follows it but idle heartbeats
        await eventually(lambda: watched.key_list() == ["k1", "k2"], timeout=15)
        assert watched.applied[-1] == ("k2", lost, False)
        assert proxy.dropped_deliveries == 1 and watched.ends == []


async def test_a_server_that_cannot_be_reached_first_does_not_end_the_watch(
    js: Any, bucket: str, nats_url: str
) -> None:
    """nats-py reports each server it cannot reach while connecting, then tries the next:
    a cluster node down as the watch is made must not leave a watch that reads nothing."""
    down = f"nats://127.0.0.1:{free_port()}"
    async with watching(js, bucket, down, nats_url, options={"dont_randomize": True}) as watched:
        await put(js, bucket, "k1")
        await eventually(lambda: watched.key_list() == ["k1"])
        assert watched.ends == [] and watched.watch.ended == ""


async def test_a_lost_connection_ends_the_watch_once(
    js: Any, bucket: str, proxy: NatsProxy
) -> None:
    async with watching(js, bucket, proxy.url) as watched:
        await put(js, bucket, "k1")
        await eventually(lambda: watched.key_list() == ["k1"])
        await proxy.stop()  # the watch's connection is cut; it does not reconnect
        await eventually(lambda: watched.ends != [])
        assert len(watched.ends) == 1 and watched.key_list() == ["k1"]


async def test_a_hub_whose_watch_consumer_is_deleted_watches_anew(
    js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    """No status tells a push subscriber its consumer is gone: heartbeats just stop. The
    hub's watch check finds the consumer missing and makes a new watch."""
    hub = await start_hub(nats_url, bucket, tmp_path / "hub")
    try:
        await eventually(lambda: hub.hub.source.ready)
        feed = hub.hub.source._feed
        assert feed is not None
        await js.delete_consumer(kv_stream(bucket), feed.consumer)
        await eventually(lambda: hub.hub.metrics.rewatches.value() >= 1, timeout=10)
        task_id = new_task_id()
        await put(js, bucket, task_id, envelope(task_id))
        await eventually(lambda: hub.hub.cache.get(task_id) is not None)
        assert hub.hub.source._feed is not feed
    finally:
        await hub.stop()
