"""bridge/task_context.py through the hub: answers to a task's questions and cancellation
arrive as tasks/update and tasks/cancel at the hub and steer the running tool body."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest

from bridge import TaskBridge
from bridge.task_context import TaskRun, required_capability
from tests.helpers import TASKS_EXT, eventually, rpc
from tests.test_mcp_server_tasks import (
    CAPS,
    CONFIRM,
    TTL_MS,
    Fleet,
    call_tool,
    hub_state,
    start_task,
    until_status,
)
from tests.test_mcp_server_tasks import fleet as fleet  # a fixture

pytestmark = pytest.mark.timeout(60)


# -- input and cancellation ---------------------------------------------------------------


async def test_elicitation_answered_at_the_hub(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "confirm", {"question": "Ship it?"})
    asking = await until_status(fleet.hub, task_id, "input_required")
    assert asking["statusMessage"] == "waiting for you"
    ((key, request),) = asking["inputRequests"].items()
    assert request == {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "Ship it?", "requestedSchema": CONFIRM},
    }
    answer = {key: {"action": "accept", "content": {"confirm": True}}}
    ack = await fleet.hub.call(rpc("tasks/update", {"taskId": task_id, "inputResponses": answer}))
    assert ack.json()["result"] == {
        "resultType": "complete",
        "_meta": ack.json()["result"]["_meta"],
    }
    done = await until_status(fleet.hub, task_id, "completed")
    assert done["result"]["structuredContent"] == {"result": "confirmed"}


async def test_several_outstanding_questions_answered_one_by_one(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "survey")

    async def both_asked() -> bool:
        state = await hub_state(fleet.hub, task_id)
        return len(state.get("inputRequests", {})) == 2

    await eventually(both_asked)
    requests = (await hub_state(fleet.hub, task_id))["inputRequests"]
    keys = {r["params"]["message"]: k for k, r in requests.items()}
    assert len(set(keys.values())) == 2
    name = {keys["Name?"]: {"action": "accept", "content": {"name": "Ada"}}}
    await fleet.hub.call(rpc("tasks/update", {"taskId": task_id, "inputResponses": name}))

    async def one_left() -> bool:
        state = await hub_state(fleet.hub, task_id)
        return state["status"] == "input_required" and list(state["inputRequests"]) == [
            keys["Age?"]
        ]

    await eventually(one_left)
    age = {keys["Age?"]: {"action": "accept", "content": {"age": 36}}}
    await fleet.hub.call(rpc("tasks/update", {"taskId": task_id, "inputResponses": age}))
    done = await until_status(fleet.hub, task_id, "completed")
    assert done["result"]["structuredContent"] == {"result": "Ada is 36"}


async def test_question_the_call_did_not_declare_fails_the_task(fleet: Fleet) -> None:
    """D15: ask only for what the originating tools/call declared."""
    tasks_only: dict[str, Any] = {"extensions": {TASKS_EXT: {}}}
    response = await call_tool(fleet.url, "confirm", {"question": "?"}, caps=tasks_only)
    task_id = response.json()["result"]["taskId"]
    failed = await until_status(fleet.hub, task_id, "failed")
    assert failed["error"]["code"] == -32021
    assert failed["error"]["data"] == {"requiredCapabilities": {"elicitation": {"form": {}}}}


async def test_cancel_at_the_hub_cancels_the_running_tool(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "sleeper")
    await fleet.gates.started.wait()
    ack = await fleet.hub.call(rpc("tasks/cancel", {"taskId": task_id}))
    assert ack.json()["result"]["resultType"] == "complete"
    await asyncio.wait_for(fleet.gates.cancelled.wait(), 10)
    done = await until_status(fleet.hub, task_id, "cancelled")
    assert set(done) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
    assert not {"result", "error", "inputRequests"} & set(done)
    await eventually(lambda: fleet.tasks.running == 0)


async def test_cancel_after_completion_changes_nothing(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "echo", {"text": "done"})
    await until_status(fleet.hub, task_id, "completed")
    await fleet.hub.call(rpc("tasks/cancel", {"taskId": task_id}))
    assert (await hub_state(fleet.hub, task_id))["status"] == "completed"


async def test_orphaned_tasks_end_when_steered(fleet: Fleet) -> None:
    """Tasks of this server id that no body here runs (a restart) end instead of hanging."""
    cancel_me = await fleet.bridge.create(owner="anonymous", ttl_ms=TTL_MS)
    await fleet.hub.call(rpc("tasks/cancel", {"taskId": cancel_me.task_id}))
    await until_status(fleet.hub, cancel_me.task_id, "cancelled")

    answer_me = await fleet.bridge.create(owner="anonymous", ttl_ms=TTL_MS)
    request = {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": {}}}
    await fleet.bridge.require_input(answer_me.task_id, {"q": request})
    responses = {"q": {"action": "cancel"}}
    await fleet.hub.call(
        rpc("tasks/update", {"taskId": answer_me.task_id, "inputResponses": responses})
    )
    failed = await until_status(fleet.hub, answer_me.task_id, "failed")
    assert failed["error"]["code"] == -32603


def test_required_capability_follows_the_client_capabilities() -> None:
    form = {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": {}}}
    url = {"method": "elicitation/create", "params": {"mode": "url", "message": "?", "url": "u"}}
    assert required_capability(form, {"elicitation": {}}) is None
    assert required_capability(form, {"elicitation": {"form": {}}}) is None
    assert required_capability(form, {"elicitation": {"url": {}}}) == {"elicitation": {"form": {}}}
    assert required_capability(form, {}) == {"elicitation": {"form": {}}}
    assert required_capability(url, {"elicitation": {}}) == {"elicitation": {"url": {}}}
    assert required_capability(url, {"elicitation": {"url": {}}}) is None
    sampling = {"method": "sampling/createMessage", "params": {}}
    assert required_capability(sampling, {}) == {"sampling": {}}
    assert required_capability(sampling, {"sampling": {}}) is None
    assert required_capability({"method": "roots/list"}, {}) == {"roots": {}}


async def test_task_run_report_keeps_pending_questions(
    nc: nats.NATS, bucket: str, server_id: str, js: Any
) -> None:
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket)
    record = await bridge.create(owner="o")
    run = TaskRun(bridge, record.task_id, CAPS)
    asking = asyncio.create_task(run.elicit("?", CONFIRM))

    async def asked() -> bool:
        current = await bridge.get(record.task_id)
        return current is not None and current.task.status == "input_required"

    await eventually(asked)
    await run.report("still thinking")
    current = await bridge.get(record.task_id)
    assert current is not None
    assert current.task.status == "input_required"
    assert current.task.statusMessage == "still thinking"
    assert isinstance(current.task.inputRequests, dict)
    (key,) = current.task.inputRequests
    run.deliver({key: {"action": "decline"}, "unknown": {"action": "accept"}})
    answer = await asking
    assert answer.action == "decline"
    run.deliver({key: {"action": "accept"}})  # answered already: ignored
    await bridge.close()
