"""The hub end to end: values written to NATS by any writer, read over real HTTP and SSE.

Every test runs twice: with the hub's connection protocol, where the fan-out writes
frames straight to the socket and cached answers leave without an ASGI task, and on
uvicorn's own, where everything goes through the ASGI app (hub/http/connection.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bridge.wire import kv_subject
from tests.helpers import (
    SUB_KEY,
    HubHarness,
    envelope,
    eventually,
    new_task_id,
    start_hub,
)

STATUSES = ["working", "input_required", "completed", "failed", "cancelled"]


@pytest.fixture
def hub(hub_on_both: HubHarness) -> HubHarness:
    return hub_on_both


async def put(js: Any, bucket: str, task_id: str, data: bytes) -> int:
    ack = await js.publish(kv_subject(bucket, task_id), data)
    return int(ack.seq)


def task_of(data: bytes) -> dict[str, Any]:
    return dict(json.loads(data)["task"])


def served(result: dict[str, Any]) -> dict[str, Any]:
    """A tasks/get result without the parts that are not the task."""
    assert result.pop("resultType") == "complete"
    meta = result.pop("_meta")
    assert meta["io.modelcontextprotocol/serverInfo"]["name"] == "taskhub"
    return result


async def test_line_separators_in_a_task_survive_line_splitting_clients(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    # SseStream reads with httpx's aiter_lines, which splits at U+0085, U+2028, U+2029.
    tid = new_task_id()
    message = "one\u2028two\x85three\u2029four"
    await put(js, bucket, tid, envelope(tid, statusMessage=message))
    assert (await hub.get_task(tid)).json()["result"]["statusMessage"] == message
    async with hub.listen([tid], id="id\u2028with separator") as stream:
        ack = await stream.next()
        assert ack["params"]["_meta"][SUB_KEY] == "id\u2028with separator"
        assert (await stream.next())["params"]["statusMessage"] == message


async def test_get_right_after_a_write_is_found(hub: HubHarness, js: Any, bucket: str) -> None:
    tid = new_task_id()
    data = envelope(
        tid,
        statusMessage="starting",
        pollIntervalMs=1000,
        ttl_ms=3_600_000,
        created_at="2099-01-01T00:00:00Z",
    )
    await put(js, bucket, tid, data)
    response = await hub.get_task(tid, id="g1")  # no waiting: read-through on a miss
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == "g1"
    assert served(body["result"]) == task_of(data)


@pytest.mark.parametrize("status", STATUSES)
async def test_every_status_round_trips_through_get_and_listen(
    hub: HubHarness, js: Any, bucket: str, status: str
) -> None:
    tid = new_task_id()
    first = envelope(tid, statusMessage="first")
    await put(js, bucket, tid, first)
    async with hub.listen([tid], id=42) as stream:
        ack = await stream.next()
        assert ack == {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUB_KEY: 42}, "notifications": {"taskIds": [tid]}},
        }
        initial = await stream.next()
        assert initial["method"] == "notifications/tasks"
        assert initial["params"].pop("_meta") == {SUB_KEY: 42}
        assert initial["params"] == task_of(first)

        data = envelope(tid, status, statusMessage="second", lastUpdatedAt="2026-01-01T00:00:01Z")
        await put(js, bucket, tid, data)
        changed = await stream.until(lambda m: m["params"].get("statusMessage") == "second")
        assert changed["params"].pop("_meta") == {SUB_KEY: 42}
        assert changed["params"] == task_of(data)
        got = (await hub.get_task(tid)).json()["result"]
        assert served(got) == task_of(data)  # H60: identical to tasks/get


async def test_unknown_expired_foreign_and_invalid_ids_look_the_same(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    foreign, expired = new_task_id(), new_task_id()
    await put(js, bucket, foreign, envelope(foreign, owner="someone-else"))
    await put(js, bucket, expired, envelope(expired, ttl_ms=1000))  # created 2026-01-01
    answers = []
    for tid in [new_task_id(), foreign, expired, "not-a-valid-id", "x" * 200]:
        response = await hub.get_task(tid, id=9)
        answers.append((response.status_code, response.json()))
    assert all(answer == answers[0] for answer in answers), answers
    status, body = answers[0]
    assert status == 200
    assert body == {
        "jsonrpc": "2.0",
        "id": 9,
        "error": {"code": -32602, "message": "Failed to retrieve task: Task not found"},
    }


async def test_listen_grants_only_existing_owned_tasks(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    mine, foreign, missing = new_task_id(), new_task_id(), new_task_id()
    await put(js, bucket, mine, envelope(mine))
    await put(js, bucket, foreign, envelope(foreign, owner="bob"))
    async with hub.listen([missing, foreign, mine, mine]) as stream:
        ack = await stream.next()
        assert ack["params"]["notifications"] == {"taskIds": [mine]}
        first = await stream.next()
        assert first["params"]["taskId"] == mine
        # A change to the foreign task never shows up; ours still does.
        await put(js, bucket, foreign, envelope(foreign, "completed", owner="bob"))
        await put(js, bucket, mine, envelope(mine, "completed"))
        last = await stream.next()
        assert last["params"]["taskId"] == mine and last["params"]["status"] == "completed"


async def test_listen_without_task_ids_is_acked_with_nothing(hub: HubHarness) -> None:
    async with hub.listen(None, id="l", toolsListChanged=True) as stream:
        ack = await stream.next()
        assert ack["params"] == {"_meta": {SUB_KEY: "l"}, "notifications": {}}


async def test_keepalive_comments_flow_on_an_idle_stream(
    nats_url: str, bucket: str, tmp_path: Path, js: Any, asgi_only: bool
) -> None:
    harness = await start_hub(nats_url, bucket, tmp_path, keepalive=0.05, asgi_only=asgi_only)
    try:
        tid = new_task_id()
        async with harness.listen([tid]) as stream:
            await stream.next()
            await put(js, bucket, tid, envelope(tid))
            # the task did not exist at ack time, so nothing but keep-alives may follow
            with pytest.raises(TimeoutError):
                await stream.next(timeout=0.5)
            assert stream.comments >= 3
    finally:
        await harness.stop()


async def test_closing_the_stream_releases_the_subscription(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    tid = new_task_id()
    await put(js, bucket, tid, envelope(tid))
    async with hub.listen([tid]) as stream:
        await stream.next()
        assert len(hub.hub.fanout) == 1 and hub.hub.fanout.followers(tid) == 1
    await eventually(lambda: len(hub.hub.fanout) == 0)  # H64
    assert hub.hub.fanout.followers(tid) == 0
    assert hub.hub.metrics.streams_closed.value("client") == 1


async def test_bad_kv_values_never_change_state(hub: HubHarness, js: Any, bucket: str) -> None:
    tid = new_task_id()
    done = envelope(tid, "completed")
    await put(js, bucket, tid, done)
    async with hub.listen([tid]) as stream:
        await stream.next()
        assert (await stream.next())["params"]["status"] == "completed"
        bad_values = [
            b"garbage",
            b"{}",
            envelope(tid, "working"),
            envelope(new_task_id()),
            envelope(tid, "failed"),
        ]
        for count, bad in enumerate(bad_values, 1):
            await put(js, bucket, tid, bad)
            # One at a time: with history 1, a value overwritten before the watch read it
            # (say, after a consumer reset on a loaded machine) would be coalesced away.
            await eventually(lambda n=count: sum(hub.hub.metrics.kv_rejected.values.values()) >= n)
        assert served((await hub.get_task(tid)).json()["result"]) == task_of(done)
        with pytest.raises(TimeoutError):
            await stream.next(timeout=0.3)
    metrics = (await hub.client.get(hub.url + "/metrics")).text
    assert 'taskhub_kv_rejected_total{reason="terminal_change"} 2' in metrics
    assert 'taskhub_kv_rejected_total{reason="malformed"} 2' in metrics
    assert 'taskhub_kv_rejected_total{reason="key_mismatch"} 1' in metrics


async def test_deleted_and_purged_tasks_are_gone(
    hub: HubHarness, nc: Any, bucket: str, js: Any
) -> None:
    kv = await js.key_value(bucket)
    a, b = new_task_id(), new_task_id()
    await put(js, bucket, a, envelope(a))
    await put(js, bucket, b, envelope(b))
    assert (await hub.get_task(a)).json()["result"]["taskId"] == a
    await kv.delete(a)
    await kv.purge(b)

    async def both_gone() -> bool:
        answers = [(await hub.get_task(t)).json() for t in (a, b)]
        return all("error" in answer for answer in answers)

    await eventually(both_gone)
    assert len(hub.hub.cache) == 0


async def test_a_second_replica_reads_through(
    hub: HubHarness, js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    other = await start_hub(nats_url, bucket, tmp_path / "b")
    try:
        for _ in range(20):
            tid = new_task_id()
            await put(js, bucket, tid, envelope(tid))
            for replica in (other, hub):
                assert (await replica.get_task(tid)).json()["result"]["taskId"] == tid
    finally:
        await other.stop()


async def test_start_up_catches_up_with_every_stored_task(
    js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    ids = [new_task_id() for _ in range(300)]
    for tid in ids:
        await put(js, bucket, tid, envelope(tid, statusMessage="v1"))
    for tid in ids[:100]:
        await put(js, bucket, tid, envelope(tid, "completed"))
    harness = await start_hub(nats_url, bucket, tmp_path)
    try:
        await eventually(lambda: harness.hub.ready)
        # Ready means caught up: every task is in memory without any read-through.
        assert len(harness.hub.cache) == 300
        assert harness.hub.metrics.read_through.values == {}
        assert sum(harness.hub.cache.get(t).status == "completed" for t in ids) == 100  # type: ignore[union-attr]
        assert (await harness.client.get(harness.url + "/readyz")).status_code == 200
    finally:
        await harness.stop()


async def test_readyz_is_503_once_shutting_down(hub: HubHarness) -> None:
    assert (await hub.client.get(hub.url + "/readyz")).status_code == 200
    hub.hub.begin_shutdown()
    assert (await hub.client.get(hub.url + "/readyz")).status_code == 503


async def test_shutdown_sends_every_stream_its_completion_result(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    tid = new_task_id()
    await put(js, bucket, tid, envelope(tid))
    async with hub.listen([tid], id=5) as s1, hub.listen([tid], id="s2") as s2:
        for stream in (s1, s2):
            await stream.next()
            await stream.next()
        hub.hub.begin_shutdown()
        for stream, sid in ((s1, 5), (s2, "s2")):
            assert await stream.next() == {
                "jsonrpc": "2.0",
                "id": sid,
                "result": {"resultType": "complete", "_meta": {SUB_KEY: sid}},
            }
            with pytest.raises(EOFError):
                await stream.next()
