"""The example fleet end to end, driven by the real mcp 2.3.0 Python client.

Servers alpha and beta (examples/fleet) run in this process on their own loopback ports,
each with its own server id, writing through the bridge to the session's nats-server; a
real hub reads the same bucket. The client calls each tool on its fleet server, then
deals with the hub only: it follows the task there by listening or by polling, and
answers the confirmation with tasks/update there (issue 3, first acceptance point).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import nats
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from bridge import TaskBridge
from examples.fleet import alpha, beta
from examples.fleet.client import answer_elicitation, demo
from examples.fleet.common import Connect
from examples.fleet.tasks_client import CreateTaskResult, HubTasks, TaskCalls
from tests.helpers import HubHarness, Served, eventually, serve_app

pytestmark = pytest.mark.timeout(60)


@dataclass
class Fleet:
    alpha: str
    beta: str
    hub: str


def connector(nc: nats.NATS, server_id: str, bucket: str) -> Connect:
    async def connect() -> TaskBridge:
        return await TaskBridge.attach(nc, server_id, bucket=bucket)

    return connect


@pytest.fixture
async def fleet(
    nc: nats.NATS, bucket: str, server_id: str, hub: HubHarness
) -> AsyncIterator[Fleet]:
    served: list[Served] = []
    try:
        for module in (alpha, beta):
            # One server id per process: the control subject names where the body waits.
            connect = connector(nc, f"{server_id}-{module.__name__.rsplit('.', 1)[1]}", bucket)
            server = module.build_server(connect, poll_interval_ms=100)
            served.append(await serve_app(server.streamable_http_app(stateless_http=True)))
        yield Fleet(served[0].url, served[1].url, hub.url + "/mcp")
    finally:
        for one in served:
            await one.stop()


def alpha_client(fleet: Fleet, tasks: TaskCalls | None = None) -> Client:
    """A client that declares tasks and form elicitation on every request."""
    return Client(
        fleet.alpha,
        mode="auto",
        extensions=[tasks or TaskCalls()],
        elicitation_callback=answer_elicitation,
        read_timeout_seconds=10,
    )


async def call_for_task(client: Client, tool: str, arguments: dict[str, Any]) -> CreateTaskResult:
    created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(created, CreateTaskResult), created
    assert created.status == "working"
    return created


async def test_listen_sees_input_required_answers_and_completes(fleet: Fleet) -> None:
    hub = HubTasks()
    async with alpha_client(fleet) as client, hub.connect(fleet.hub):
        created = await call_for_task(client, "deploy", {"service": "billing"})
        seen: list[dict[str, Any]] = []
        async for state in hub.follow(created.task_id):
            seen.append(state)
            if state["status"] == "input_required":
                ((key, request),) = state["inputRequests"].items()
                assert request["method"] == "elicitation/create"
                assert request["params"]["message"] == "Deploy billing to production?"
                assert state["statusMessage"] == "billing: waiting for confirmation"
                answer = {"action": "accept", "content": {"confirm": True}}
                await hub.update(created.task_id, {key: answer})
        statuses = [state["status"] for state in seen]
        assert "input_required" in statuses
        final = seen[-1]
        assert final["status"] == "completed"
        assert final["result"]["content"] == [
            {"type": "text", "text": "billing deployed to production"}
        ]
        assert final["result"]["isError"] is False
        assert final["taskId"] == created.task_id
        assert final["createdAt"] == created.created_at


async def test_polling_tasks_get_only(fleet: Fleet) -> None:
    hub = HubTasks()
    async with alpha_client(fleet) as client, hub.connect(fleet.hub):
        created = await call_for_task(client, "deploy", {"service": "search"})
        state: dict[str, Any] = {}

        async def reached(status: str) -> bool:
            state.clear()
            state.update(await hub.get(created.task_id))
            return bool(state["status"] == status)

        await eventually(lambda: reached("input_required"))
        ((key, _),) = state["inputRequests"].items()
        await hub.update(
            created.task_id, {key: {"action": "accept", "content": {"confirm": False}}}
        )
        await eventually(lambda: reached("completed"))
        assert state["result"]["isError"] is True  # "no" is a tool outcome, still completed
        assert state["result"]["content"][0]["text"] == (
            "search not deployed: the user did not confirm"
        )
        assert "inputRequests" not in state


async def test_call_tool_follows_the_task_to_its_result(fleet: Fleet) -> None:
    """With a resolver, the SDK's plain call_tool returns the finished task's outcome."""
    hub = HubTasks()
    async with hub.connect(fleet.hub):
        calls = TaskCalls(finish=hub.finish)
        async with alpha_client(fleet, calls) as client:
            arguments = {"topic": "q3", "steps": 3, "step_seconds": 0}
            result = await client.call_tool("slow_report", arguments)
        assert result.content == [
            types.TextContent(type="text", text="Report on q3: 3 sections compiled")
        ]
        async with Client(fleet.beta, extensions=[TaskCalls(finish=hub.finish)]) as client:
            with pytest.raises(MCPError) as failed:
                await client.call_tool("lookup", {"key": "nope"})
        assert failed.value.code == -32602
        assert failed.value.message == "No archive record 'nope'"
        assert failed.value.data == {"key": "nope"}


async def test_slow_report_reports_progress_at_the_hub(fleet: Fleet) -> None:
    hub = HubTasks()
    async with alpha_client(fleet) as client, hub.connect(fleet.hub):
        arguments = {"topic": "ops", "steps": 2, "step_seconds": 0}
        created = await call_for_task(client, "slow_report", arguments)
        messages = [state.get("statusMessage") async for state in hub.follow(created.task_id)]
    assert set(messages) <= {None, "step 1 of 2: ops", "step 2 of 2: ops"}
    final = await _final(fleet, created.task_id)
    assert final["result"]["structuredContent"] == {"result": "Report on ops: 2 sections compiled"}


async def test_beta_failure_is_a_failed_task_with_the_error(fleet: Fleet) -> None:
    async with Client(fleet.beta, extensions=[TaskCalls()]) as client:
        created = await call_for_task(client, "lookup", {"key": "invoice-0"})
    final = await _final(fleet, created.task_id)
    assert final["status"] == "failed"
    assert final["error"] == {
        "code": -32602,
        "message": "No archive record 'invoice-0'",
        "data": {"key": "invoice-0"},
    }
    assert final["statusMessage"] == "No archive record 'invoice-0'"


async def test_the_demo_client_runs_all_three_flows(fleet: Fleet) -> None:
    lines: list[str] = []
    finals = await demo(
        fleet.alpha, fleet.beta, hub_url=fleet.hub, say=lines.append, step_seconds=0
    )
    assert {name: state["status"] for name, state in finals.items()} == {
        "slow_report": "completed",
        "deploy": "completed",
        "lookup": "failed",
    }
    assert finals["deploy"]["result"]["isError"] is False
    assert any("question: Deploy billing to production?" in line for line in lines)


async def _final(fleet: Fleet, task_id: str) -> dict[str, Any]:
    hub = HubTasks()
    async with hub.connect(fleet.hub):
        async for state in hub.follow(task_id):
            if state["status"] in ("completed", "failed", "cancelled"):
                return state
    raise AssertionError("the task never ended")
