"""`GET /operator/stream` (docs/dashboard.md): who sees which tasks, filters, refusals, the
fleet view, the cookie rule for `EventSource` and the goodbye on shutdown.

On the module's authenticated hub (tests/e2e/test_security_auth.py): an operator (scope
`taskhub:operator`) sees every task with its owner; alice sees hers only; on an open hub
the anonymous caller sees the anonymous tasks only.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from bridge.wire import CONTROL_STREAM, control_subject, kv_subject
from tests.e2e.test_security_auth import PUBLIC_URL, Secured, bearer, token
from tests.e2e.test_security_auth import secured as secured  # the module's hub, a fixture
from tests.helpers import HubHarness, envelope, eventually, new_task_id, rpc, start_served_hub

pytestmark = pytest.mark.timeout(60)
OPERATOR = {"scope": "openid taskhub:operator"}


def has(task_id: str, status: str | None = None) -> Any:
    return lambda data: (
        data["task"]["taskId"] == task_id and (status is None or data["task"]["status"] == status)
    )


async def test_an_operator_sees_every_task_then_each_change(secured: Secured) -> None:
    harness = secured.harness
    alices = await secured.task("alice", statusMessage="step 1 of 4")
    bobs = await secured.task("bob", "input_required")
    await eventually(lambda: harness.hub.cache.get(bobs) is not None)
    async with harness.operator_stream(
        f"server={secured.server}", **bearer("ops", **OPERATOR)
    ) as events:
        hello, tasks = await events.opening()
        assert hello["principal"] == "ops" and hello["operator"] is True
        assert hello["filters"] == {"server": [secured.server]}
        assert {alices, bobs} <= tasks.keys()
        assert tasks[alices]["owner"] == "alice" and tasks[bobs]["owner"] == "bob"
        assert tasks[alices]["server"] == secured.server
        assert tasks[bobs]["task"]["inputRequests"]  # the whole DetailedTask
        fleet = await events.until("fleet")
        assert fleet["ready"] is True
        assert any(s["server"] == secured.server and s["active"] >= 2 for s in fleet["servers"])

        await secured.put(bobs, "completed", owner="bob")
        done = await events.until("task", has(bobs, "completed"))
        assert done["task"]["result"] == {"resultType": "complete", "content": []}
        await secured.js.publish(
            kv_subject(secured.bucket, alices), b"", headers={"KV-Operation": "DEL"}
        )
        assert await events.until("removed") == {"taskId": alices}


async def test_a_caller_sees_only_their_own_tasks(secured: Secured) -> None:
    harness = secured.harness
    mine = await secured.task("alice")
    theirs = await secured.task("bob")
    await eventually(lambda: harness.hub.cache.get(theirs) is not None)
    async with harness.operator_stream(**bearer("alice")) as events:
        hello, tasks = await events.opening()
        assert hello["operator"] is False and hello["filters"] == {"owner": ["alice"]}
        assert mine in tasks and theirs not in tasks
        assert {data["owner"] for data in tasks.values()} == {"alice"}
        assert (await events.until("fleet"))["servers"] == []  # the fleet is for operators
        # bob's change comes first; alice's stream shows only her own.
        await secured.put(theirs, "completed", owner="bob")
        await secured.put(mine, "completed", owner="alice")
        name, data = await events.next()
        while name == "fleet":
            name, data = await events.next()
        assert name == "task" and data["task"]["taskId"] == mine

    async with harness.operator_stream("owner=alice", **bearer("alice")) as events:
        _, tasks = await events.opening()
        assert mine in tasks
    foreign = await harness.client.get(
        f"{harness.url}/operator/stream?owner=bob", headers=bearer("alice")
    )
    assert foreign.status_code == 403
    assert "operator claim" in foreign.json()["error"]["message"]
    async with harness.operator_stream("owner=bob", **bearer("ops", **OPERATOR)) as events:
        _, tasks = await events.opening()
        assert theirs in tasks and mine not in tasks


async def test_anonymous_on_an_open_hub_sees_the_anonymous_tasks(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    anonymous, alices = new_task_id(), new_task_id()
    await js.publish(kv_subject(bucket, anonymous), envelope(anonymous, statusMessage="40%"))
    await js.publish(kv_subject(bucket, alices), envelope(alices, owner="alice"))
    await eventually(lambda: hub.hub.cache.get(alices) is not None)
    async with hub.operator_stream() as events:
        hello, tasks = await events.opening()
        assert hello["principal"] == "anonymous" and hello["operator"] is False
        assert anonymous in tasks and alices not in tasks
        # An open hub has no operators: the servers' health is everyone's there.
        fleet = await events.until("fleet")
        assert any(entry["server"] == "srv-1" for entry in fleet["servers"])


async def test_a_status_filter_says_when_a_task_leaves_it(secured: Secured) -> None:
    harness = secured.harness
    task_id = await secured.task("alice")
    await eventually(lambda: harness.hub.cache.get(task_id) is not None)
    async with harness.operator_stream(
        "status=working,input_required", **bearer("ops", **OPERATOR)
    ) as events:
        _, tasks = await events.opening()
        assert task_id in tasks
        await secured.put(task_id, "input_required", owner="alice")
        await events.until("task", has(task_id, "input_required"))
        await secured.put(task_id, "failed", owner="alice")
        assert await events.until("removed") == {"taskId": task_id}


async def test_the_page_cookie_counts_on_same_origin_gets_only(secured: Secured) -> None:
    harness = secured.harness
    task_id = await secured.task("alice")
    await eventually(lambda: harness.hub.cache.get(task_id) is not None)
    cookie = {"Cookie": f"taskhub_token={token('alice')}"}
    async with harness.operator_stream(**cookie, **{"Sec-Fetch-Site": "same-origin"}) as events:
        hello, tasks = await events.opening()
        assert hello["principal"] == "alice" and task_id in tasks
    async with harness.operator_stream(**cookie, Origin=PUBLIC_URL) as events:
        assert (await events.opening())[0]["principal"] == "alice"
    read = await harness.client.get(
        f"{harness.url}/tasks/{task_id}", headers={**cookie, "Sec-Fetch-Site": "same-origin"}
    )
    assert read.status_code == 200 and read.json()["taskId"] == task_id

    url = f"{harness.url}/operator/stream"
    cross_site = await harness.client.get(url, headers={**cookie, "Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 400
    assert "Sec-Fetch-Site" in cross_site.json()["error"]["message"]
    foreign = await harness.client.get(url, headers={**cookie, "Origin": "https://evil.example"})
    assert foreign.status_code == 403
    # The same cookie still never counts on a POST that is not JSON (the CSRF rule of /mcp).
    body = rpc("tasks/get", {"taskId": task_id})
    form = await harness.client.post(
        f"{harness.url}/mcp",
        content=b"x",
        headers={**cookie, "Origin": PUBLIC_URL, "Content-Type": "text/plain"},
    )
    assert form.status_code == 400, body


async def test_refusals_are_clear_json_errors(secured: Secured) -> None:
    harness = secured.harness
    url = f"{harness.url}/operator/stream"
    missing = await harness.client.get(url)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="taskhub"'
    for query, phrase in [
        ("status=done", "unknown status 'done'"),
        ("server=", "empty value in 'server'"),
        ("colour=red", "unknown query parameter 'colour'"),
    ]:
        answer = await harness.client.get(f"{url}?{query}", headers=bearer("ops", **OPERATOR))
        assert answer.status_code == 400, query
        assert phrase in answer.json()["error"]["message"]
    posted = await harness.client.post(url, headers=bearer("alice"))
    assert posted.status_code == 405 and posted.headers["allow"] == "GET"
    expired = await harness.client.get(url, headers=bearer("alice", exp=1))
    assert expired.status_code == 401 and "expired" in expired.headers["www-authenticate"]


async def test_the_fleet_view_counts_control_messages_a_server_has_not_taken(
    secured: Secured,
) -> None:
    """A server that never consumes its control subject: the cancel waits, and shows."""
    harness = secured.harness
    gone = f"srv-gone-{uuid.uuid4().hex[:8]}"
    task_id = new_task_id()
    await secured.js.publish(
        kv_subject(secured.bucket, task_id), envelope(task_id, owner="alice", server=gone)
    )
    await eventually(lambda: harness.hub.cache.get(task_id) is not None)
    try:
        cancelled = await secured.call(rpc("tasks/cancel", {"taskId": task_id}), **bearer("alice"))
        assert "result" in cancelled.json(), cancelled.text
        async with harness.operator_stream(f"server={gone}", **bearer("ops", **OPERATOR)) as events:
            await events.opening()

            def waiting(data: Any) -> bool:
                entry = next((s for s in data["servers"] if s["server"] == gone), None)
                return entry is not None and entry["controlWaiting"] == 1

            fleet = await events.until("fleet", waiting)
            entry = next(s for s in fleet["servers"] if s["server"] == gone)
            assert entry["tasks"] == entry["active"] == 1
            assert entry["waitingSince"] is not None and entry["lastWriteAt"] is not None
    finally:
        await secured.js.purge_stream(CONTROL_STREAM, subject=control_subject(gone))


async def test_shutdown_ends_the_stream_with_a_goodbye(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    try:
        async with harness.operator_stream() as events:
            await events.opening()
            harness.hub.begin_shutdown()
            assert await events.until("bye") == {"reason": "shutdown"}
            with pytest.raises(EOFError):
                await events.next()
    finally:
        await harness.stop()
