"""tasks/update and tasks/cancel at the hub: forwarded durably to the owning server's subject."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge import TaskBridge
from bridge.wire import CONTROL_STREAM, control_subject, kv_subject
from tests.helpers import HubHarness, envelope, new_task_id, rpc, start_hub

ANSWER = {"q1": {"action": "accept", "content": {"ok": True}}}
# No server consumes the control stream here, so no answer is ever taken and each
# tasks/update is acked when --update-wait runs out (D24): kept short.
SHORT_WAIT = 0.2


@pytest.fixture
async def hub(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_hub(nats_url, bucket, tmp_path, update_wait=SHORT_WAIT)
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()


async def queued(js: Any, server: str) -> list[dict[str, Any]]:
    """The control messages waiting for `server`, oldest first (read without consuming)."""
    subject = control_subject(server)
    info = await js.stream_info(CONTROL_STREAM, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    messages: list[dict[str, Any]] = []
    seq = 0
    for _ in range(count):
        msg = await js.get_msg(CONTROL_STREAM, seq=seq + 1, subject=subject, next=True)
        messages.append(json.loads(msg.data))
        seq = msg.seq
    return messages


async def seed(js: Any, bucket: str, server: str, status: str, owner: str = "anonymous") -> str:
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, status, server=server, owner=owner))
    return tid


def acked(response: Any, request_id: Any) -> None:
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == request_id
    assert body["result"]["resultType"] == "complete"
    assert set(body["result"]) == {"resultType", "_meta"}


async def test_update_is_stored_for_the_owner(
    hub: HubHarness, js: Any, bucket: str, server_id: str
) -> None:
    tid = await seed(js, bucket, server_id, "input_required")
    response = await hub.call(rpc("tasks/update", {"taskId": tid, "inputResponses": ANSWER}, id=6))
    acked(response, 6)
    assert await queued(js, server_id) == [
        {"op": "update", "taskId": tid, "inputResponses": ANSWER, "principal": "anonymous"}
    ]


async def test_a_retried_request_is_stored_once(
    hub: HubHarness, js: Any, bucket: str, server_id: str
) -> None:
    tid = await seed(js, bucket, server_id, "input_required")
    body = rpc("tasks/update", {"taskId": tid, "inputResponses": ANSWER}, id="retry")
    for _ in range(3):
        acked(await hub.call(body), "retry")
    assert len(await queued(js, server_id)) == 1
    # A new request (new id) is a new message; the server ignores keys already answered.
    acked(await hub.call({**body, "id": "again"}), "again")
    assert len(await queued(js, server_id)) == 2


async def test_cancel_is_stored_for_the_owner(
    hub: HubHarness, js: Any, bucket: str, server_id: str
) -> None:
    tid = await seed(js, bucket, server_id, "working")
    acked(await hub.call(rpc("tasks/cancel", {"taskId": tid}, id=9)), 9)
    assert await queued(js, server_id) == [
        {"op": "cancel", "taskId": tid, "principal": "anonymous"}
    ]


@pytest.mark.parametrize("method", ["tasks/update", "tasks/cancel"])
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
async def test_terminal_tasks_are_acked_and_nothing_is_sent(
    hub: HubHarness, js: Any, bucket: str, server_id: str, method: str, status: str
) -> None:
    tid = await seed(js, bucket, server_id, status)
    params: dict[str, Any] = {"taskId": tid}
    if method == "tasks/update":
        params["inputResponses"] = ANSWER
    acked(await hub.call(rpc(method, params, id=1)), 1)
    assert await queued(js, server_id) == []


@pytest.mark.parametrize("method", ["tasks/update", "tasks/cancel"])
async def test_unknown_and_foreign_tasks_are_not_found(
    hub: HubHarness, js: Any, bucket: str, server_id: str, method: str
) -> None:
    foreign = await seed(js, bucket, server_id, "input_required", owner="mallory")
    for tid in (foreign, new_task_id(), "bogus"):
        params: dict[str, Any] = {"taskId": tid}
        if method == "tasks/update":
            params["inputResponses"] = ANSWER
        response = await hub.call(rpc(method, params, id=2))
        assert response.status_code == 200
        assert response.json()["error"] == {
            "code": -32602,
            "message": "Failed to retrieve task: Task not found",
        }
    assert await queued(js, server_id) == []


async def test_update_on_a_working_task_is_still_forwarded(
    hub: HubHarness, js: Any, bucket: str, server_id: str
) -> None:
    # The hub's view may lag the server's: the owner decides what is outstanding (H49).
    tid = await seed(js, bucket, server_id, "working")
    acked(await hub.call(rpc("tasks/update", {"taskId": tid, "inputResponses": {}}, id=1)), 1)
    assert [m["op"] for m in await queued(js, server_id)] == ["update"]


async def test_the_ack_of_an_update_comes_once_the_owner_took_the_answers(
    nats_url: str, bucket: str, tmp_path: Path, server_id: str
) -> None:
    """D24: right after the ack, tasks/get shows the answered key gone, the other still asked."""
    harness = await start_hub(nats_url, bucket, tmp_path)  # the default wait, 2 s
    questions = {
        key: {
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": key,
                "requestedSchema": {"type": "object", "properties": {}},
            },
        }
        for key in ("first", "second")
    }
    try:
        async with await TaskBridge.connect(nats_url, server_id, bucket=bucket) as bridge:
            taken: list[dict[str, Any]] = []

            async def on_input(task_id: str, responses: dict[str, Any]) -> None:
                taken.append(responses)

            bridge.on_input(on_input)
            task = await bridge.create(owner="anonymous", ttl_ms=600_000)
            await bridge.require_input(task.task_id, questions)
            await harness.hub.source.wait_caught_up(10)
            update = rpc(
                "tasks/update",
                {"taskId": task.task_id, "inputResponses": {"first": {"action": "decline"}}},
                id="u",
            )
            acked(await harness.call(update), "u")
            state = (await harness.get_task(task.task_id)).json()["result"]
            assert state["status"] == "input_required"
            assert set(state["inputRequests"]) == {"second"}  # read-your-update
            assert taken == [{"first": {"action": "decline"}}]
    finally:
        await harness.stop()
