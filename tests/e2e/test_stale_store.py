"""Read-your-create when a deposed leader answers (issue 12, item 1).

A KV stream leader that was paused (SIGSTOP) and deposed meanwhile answers the reads
queued for it from its old store until it learns of the new term: "no such key", for a
task the new leader has just acknowledged. Here the hub reaches the session's nats-server
through a real TCP proxy (tests/nats_proxy.py) that plays that old store: it answers the
hub's KV reads as of the sequence just before the last task the hub saw, and holds the
watch's deliveries back, so the new task is not in the cache and must be read through.

Before: `tasks/get` answered `-32602 Task not found` and a listen ack left the task out.
Now a miss counts only from a store at least as new as the hub's view; else the hub asks
again for a moment, then answers the retryable `-32603`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bridge import TaskBridge
from bridge.wire import kv_stream
from tests.helpers import HubHarness, eventually, rpc, start_hub
from tests.nats_proxy import NatsProxy, Rewrite

pytestmark = pytest.mark.timeout(60)

NO_MESSAGE = json.dumps(
    {
        "type": "io.nats.jetstream.api.v1.stream_msg_get_response",
        "error": {"code": 404, "err_code": 10037, "description": "no message found"},
    }
).encode()


def old_store(last_seq: int) -> Rewrite:
    """A reply rewrite: the KV stream as a store that stopped at `last_seq` would see it."""

    def rewrite(subject: bytes, reply: bytes) -> bytes:
        if b".MSG.GET." in subject:
            return NO_MESSAGE
        info = json.loads(reply)
        info["state"].pop("subjects", None)  # the key is not there yet
        info["state"]["last_seq"] = last_seq
        return json.dumps(info).encode()

    return rewrite


@pytest.fixture
async def proxied(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> AsyncIterator[tuple[NatsProxy, HubHarness, TaskBridge]]:
    parts = urlsplit(nats_url)
    assert parts.hostname is not None and parts.port is not None
    proxy = NatsProxy(parts.hostname, parts.port)
    await proxy.start()
    harness = await start_hub(proxy.url, bucket, tmp_path / "hub")
    bridge = await TaskBridge.connect(nats_url, server_id, bucket=bucket)
    try:
        await eventually(lambda: harness.hub.source.ready)
        yield proxy, harness, bridge
    finally:
        await bridge.close()
        await harness.stop()
        await proxy.stop()


async def deposed_leader_answers(
    proxy: NatsProxy, harness: HubHarness, bridge: TaskBridge, bucket: str
) -> str:
    """The hub saw task `seen` through its watch; from here its KV reads are answered as
    of just before `seen`, and its watch runs behind. Returns a task created after that."""
    seen = await bridge.create(owner="anonymous")
    await eventually(lambda: harness.hub.cache.get(seen.task_id) is not None)
    proxy.hold_deliveries()
    proxy.rewrite_replies(b"$JS.API.STREAM.", _only_kv(bucket, old_store(seen.revision - 1)))
    created = await bridge.create(owner="anonymous")
    assert harness.hub.cache.get(created.task_id) is None
    return created.task_id


def _only_kv(bucket: str, rewrite: Rewrite) -> Rewrite:
    stream = kv_stream(bucket).encode()

    def apply(subject: bytes, reply: bytes) -> bytes:
        return rewrite(subject, reply) if subject.endswith(b"." + stream) else reply

    return apply


async def test_a_deposed_leaders_miss_is_not_a_task_not_found(
    proxied: tuple[NatsProxy, HubHarness, TaskBridge], bucket: str
) -> None:
    proxy, harness, bridge = proxied
    task_id = await deposed_leader_answers(proxy, harness, bridge, bucket)

    answer = (await harness.get_task(task_id)).json()
    assert "error" in answer, answer
    assert answer["error"]["code"] == -32603, answer  # retryable, never -32602
    assert "behind" in answer["error"]["message"]
    assert proxy.rewritten >= 2

    # A listen ack never leaves the task out: the stream is refused, retryably.
    listen = rpc("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, id="L")
    refused = (await harness.call(listen)).json()
    assert refused["error"]["code"] == -32603, refused

    # The deposed leader learns of the new term: the same read finds the task.
    proxy.rewrite_replies(b"$JS.API.STREAM.", None)
    answer = (await harness.get_task(task_id, id=2)).json()
    assert answer["result"]["taskId"] == task_id, answer
    await proxy.release_deliveries()


async def test_a_read_waiting_on_a_stale_answer_finds_the_task_once_the_store_catches_up(
    proxied: tuple[NatsProxy, HubHarness, TaskBridge], bucket: str
) -> None:
    proxy, harness, bridge = proxied
    task_id = await deposed_leader_answers(proxy, harness, bridge, bucket)
    stale = harness.hub.metrics.stale_reads

    reading = asyncio.create_task(harness.get_task(task_id))
    await eventually(lambda: sum(stale.values.values()) >= 1)
    proxy.rewrite_replies(b"$JS.API.STREAM.", None)  # within the hub's confirm window
    answer = (await reading).json()
    assert answer["result"]["taskId"] == task_id, answer
    await proxy.release_deliveries()


async def test_a_truly_unknown_task_is_still_not_found_at_once(
    proxied: tuple[NatsProxy, HubHarness, TaskBridge],
) -> None:
    _, harness, bridge = proxied
    await bridge.create(owner="anonymous")
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = (await harness.get_task("00000000-0000-4000-8000-000000000000")).json()
    assert answer["error"]["code"] == -32602, answer
    assert loop.time() - started < 1.0  # confirmed by the first, current answer
    assert sum(harness.hub.metrics.stale_reads.values.values()) == 0


async def test_a_stream_answering_from_behind_is_not_taken_for_a_reset(
    proxied: tuple[NatsProxy, HubHarness, TaskBridge], bucket: str
) -> None:
    """Issue 41, D: a replica behind the hub (same stream, lower last sequence) answers a
    re-watch. Before, the hub took it for a bucket made anew: it emptied its cache and
    its open listen streams stopped delivering those tasks. Now it asks again."""
    proxy, harness, bridge = proxied
    task = await bridge.create(owner="anonymous", status_message="before")
    await eventually(lambda: harness.hub.cache.get(task.task_id) is not None)
    async with harness.listen([task.task_id]) as stream:
        await stream.next()  # the ack, with the task
        proxy.rewrite_replies(b"$JS.API.STREAM.", _only_kv(bucket, old_store(task.revision - 1)))
        stale = harness.hub.metrics.stale_reads
        before = sum(stale.values.values())
        harness.hub.source._restart_watch()  # as after a reconnect
        await eventually(lambda: sum(stale.values.values()) >= before + 2)
        assert harness.hub.cache.get(task.task_id) is not None
        assert not harness.hub.source.ready

        proxy.rewrite_replies(b"$JS.API.STREAM.", None)  # the replica caught up
        await eventually(lambda: harness.hub.source.ready)
        await bridge.working(task.task_id, status_message="after")
        async with asyncio.timeout(10):
            while "after" not in json.dumps(await stream.next()):
                pass
