"""`TaskBridge.create` never orphans a task (issue 12, item 2).

Between the bridge and the session's nats-server sits a real TCP proxy (tests/nats_proxy.py)
that loses the publish's ack and the reply to the read-back after it: the write landed,
and the bridge cannot see it. The bridge must write the same id again and learn the
outcome, or, when it cannot, raise `CreateOutcomeUnknown` naming the id.
"""

from __future__ import annotations

import msgspec
import nats
import pytest

from bridge import CreateOutcomeUnknown, TaskBridge
from tests.nats_proxy import NatsProxy

pytestmark = pytest.mark.timeout(60)


async def tasks_of(nats_url: str, bucket: str, server_id: str) -> set[str]:
    """The ids of every task stored by `server_id`, read past the proxy."""
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        found = set()
        for key in await kv.keys():
            entry = await kv.get(key)
            if entry.value and msgspec.json.decode(entry.value)["server"] == server_id:
                found.add(key)
        return found
    finally:
        await nc.close()


async def test_a_create_whose_ack_and_read_back_are_lost_returns_the_one_task(
    proxy: NatsProxy, nats_url: str, bucket: str
) -> None:
    async with await TaskBridge.connect(proxy.url, "creator-1", bucket=bucket) as bridge:
        proxy.lose_replies(after=b"HPUB $KV.", count=2)  # the ack, then the read-back
        record = await bridge.create(owner="alice", ttl_ms=600_000)
        assert proxy.lost.is_set()
        assert (await bridge.get(record.task_id)) == record
    assert await tasks_of(nats_url, bucket, "creator-1") == {record.task_id}


async def test_when_the_outcome_cannot_be_known_the_error_names_the_task(
    proxy: NatsProxy, nats_url: str, bucket: str
) -> None:
    async with await TaskBridge.connect(proxy.url, "creator-2", bucket=bucket) as bridge:
        proxy.lose_replies(after=b"HPUB $KV.", count=1_000)  # no answer gets through
        with pytest.raises(CreateOutcomeUnknown) as caught:
            await bridge.create(owner="alice", ttl_ms=600_000, deadline_s=1.0)
        proxy.plan = None
    # It did land: the caller holds its id and can resolve it, not orphan it.
    assert await tasks_of(nats_url, bucket, "creator-2") == {caught.value.task_id}
    assert caught.value.task_id in str(caught.value)
