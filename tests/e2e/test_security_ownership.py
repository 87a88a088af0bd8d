"""Security end to end, ownership: another principal's task is an unknown task, on tasks/get,
tasks/update, tasks/cancel and listen alike, and nothing of it is forwarded or delivered."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from bridge.wire import kv_subject
from tests.e2e.test_security_auth import ANSWER, Secured, bearer, queued
from tests.e2e.test_security_auth import secured as secured  # the module's hub, a fixture
from tests.helpers import envelope, eventually, listening, new_task_id, rpc

NOT_FOUND = {"code": -32602, "message": "Failed to retrieve task: Task not found"}


# --- ownership: another principal's task is an unknown task --------------------------------


async def test_tasks_get_serves_only_the_owner(secured: Secured) -> None:
    mine = await secured.task("alice", statusMessage="alice's")
    response = await secured.call(rpc("tasks/get", {"taskId": mine}, id=1), **bearer("alice"))
    assert response.status_code == 200
    assert response.json()["result"]["statusMessage"] == "alice's"

    def as_bob(task_id: str) -> Any:
        return secured.call(rpc("tasks/get", {"taskId": task_id}, id=1), **bearer("bob"))

    foreign, unknown = await as_bob(mine), await as_bob(new_task_id())
    assert (foreign.status_code, foreign.json()) == (unknown.status_code, unknown.json())
    assert foreign.status_code == 200
    assert foreign.json() == {"jsonrpc": "2.0", "id": 1, "error": NOT_FOUND}
    assert foreign.headers.get("content-type") == unknown.headers.get("content-type")


async def test_a_foreign_task_costs_one_store_read_like_an_unknown_one(
    secured: Secured,
) -> None:
    """The timing class of H46: one store read for an unknown task, and one for a foreign
    task whether the hub had it cached or had to read it through."""
    source = secured.harness.hub.source
    reads: list[str] = []
    real_read = source.read_store

    async def counting_read(task_id: str) -> Any:
        reads.append(task_id)
        return await real_read(task_id)

    source.read_store = counting_read  # type: ignore[method-assign]
    try:
        cached = await secured.task("alice")
        await eventually(lambda: secured.harness.hub.cache.get(cached) is not None)
        uncached = new_task_id()
        # Stored, but not in this hub's cache: a hub whose watch has not applied it yet.
        await secured.put(uncached, owner="alice")
        await eventually(lambda: secured.harness.hub.cache.get(uncached) is not None)
        cache = secured.harness.hub.cache
        del cache._tasks[uncached]
        cache._recent.pop(uncached, None)  # the snapshot unpacked for the get above
        for task_id in (new_task_id(), cached, uncached):
            reads.clear()
            body = rpc("tasks/get", {"taskId": task_id}, id=1)
            answer = await secured.call(body, **bearer("bob"))
            assert answer.json()["error"] == NOT_FOUND
            assert reads == [task_id], task_id
    finally:
        del source.read_store


@pytest.mark.parametrize("method", ["tasks/update", "tasks/cancel"])
async def test_update_and_cancel_reach_the_server_only_for_the_owner(
    secured: Secured, method: str
) -> None:
    server = f"srv-{uuid.uuid4().hex[:8]}"
    tid = new_task_id()
    await secured.js.publish(
        kv_subject(secured.bucket, tid),
        envelope(tid, "input_required", owner="alice", server=server),
    )
    params: dict[str, Any] = {"inputResponses": ANSWER} if method == "tasks/update" else {}

    async def as_(who: str, task_id: str, id: Any) -> httpx.Response:
        return await secured.call(rpc(method, {"taskId": task_id, **params}, id=id), **bearer(who))

    foreign, unknown = await as_("bob", tid, 3), await as_("bob", new_task_id(), 3)
    assert (foreign.status_code, foreign.json()) == (unknown.status_code, unknown.json())
    assert foreign.json() == {"jsonrpc": "2.0", "id": 3, "error": NOT_FOUND}
    assert await queued(secured.js, server) == []  # bob's request was not forwarded

    owned = await as_("alice", tid, 4)
    assert owned.status_code == 200 and owned.json()["result"]["resultType"] == "complete"
    op = "update" if method == "tasks/update" else "cancel"
    assert await queued(secured.js, server) == [
        {"op": op, "taskId": tid, **params, "principal": "alice"}
    ]


async def test_listen_never_grants_nor_carries_another_principals_task(secured: Secured) -> None:
    alices, bobs = await secured.task("alice"), await secured.task("bob")
    unknown = new_task_id()
    h = secured.harness
    async with (
        listening(h, [alices], id="a", **bearer("alice")) as (_, alice),
        listening(h, [alices, bobs], id="b", **bearer("bob")) as (_, bob),
        listening(h, [alices], id="x", **bearer("bob")) as (_, bob_foreign),
        listening(h, [unknown], id="x", **bearer("bob")) as (_, bob_unknown),
    ):
        assert (await alice.next())["params"]["notifications"] == {"taskIds": [alices]}
        assert (await bob.next())["params"]["notifications"] == {"taskIds": [bobs]}
        # Asking for alice's task and for no task at all look exactly the same to bob.
        assert await bob_foreign.next() == await bob_unknown.next()
        assert (await alice.next())["params"]["taskId"] == alices
        assert (await bob.next())["params"]["taskId"] == bobs

        await secured.put(alices, owner="alice", statusMessage="alice moved")
        changed = await alice.next()
        assert changed["params"]["taskId"] == alices
        assert changed["params"]["statusMessage"] == "alice moved"
        # The watch delivers in bucket order: bob's next frame is his own later change,
        # so alice's change, written first, was never queued for him.
        await secured.put(bobs, owner="bob", statusMessage="bob moved")
        frame = await bob.next()
        assert frame["params"]["taskId"] == bobs
        assert frame["params"]["statusMessage"] == "bob moved"
        assert secured.harness.hub.fanout.followers(alices) == 1  # alice's stream only
