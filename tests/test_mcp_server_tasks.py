"""bridge/mcp_server.py, a tools/call that becomes a task on the real mcp 2.3.0 MCPServer:
the CreateTaskResult, durable before the reply, then ended completed / failed by the body.

The harness here (a fleet server on a bridge, the hub reading its bucket, the test tools) is
shared with test_mcp_server_inline.py and test_mcp_server_steering.py. The server is served
by uvicorn on a loopback port and writes through a real bridge to the session's nats-server;
calls go over raw HTTP where the exact wire shape matters, and through the real `mcp` client
where the SDK's own behaviour is the point. Tool bodies wait on events the tests set, never
on time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import mcp_types as types
import nats
import pytest
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from bridge import TaskBridge
from bridge.mcp_server import TaskTools, create_task_result, default_owner
from bridge.task_context import TaskContext
from tests.helpers import TASKS_EXT, HubHarness, Served, eventually, headers_for, rpc, serve_app

pytestmark = pytest.mark.timeout(60)

TTL_MS = 600_000
POLL_MS = 250
CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean"}},
    "required": ["confirm"],
}
# A client that declared tasks and form elicitation on its tools/call.
CAPS: dict[str, Any] = {"extensions": {TASKS_EXT: {}}, "elicitation": {"form": {}}}


# -- harness ------------------------------------------------------------------------------


def serving_lifespan(tasks: TaskTools, bridge: TaskBridge) -> Callable[[MCPServer[Any]], Any]:
    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        async with tasks.serving(bridge):
            yield {}

    return lifespan


async def call_tool(
    url: str,
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    caps: dict[str, Any] | None = None,
    **extra: Any,
) -> httpx.Response:
    """A raw 2026-07-28 tools/call, as a conforming client sends it."""
    body = rpc("tools/call", {"name": name, "arguments": arguments or {}, **extra}, caps=caps)
    headers = headers_for(body) | {"Mcp-Name": name}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, json=body, headers=headers)


async def start_task(url: str, name: str, arguments: dict[str, Any] | None = None) -> str:
    response = await call_tool(url, name, arguments, caps=CAPS)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["resultType"] == "task", result
    return str(result["taskId"])


async def hub_state(hub: HubHarness, task_id: str) -> dict[str, Any]:
    response = await hub.get_task(task_id)
    body = response.json()
    assert "result" in body, body
    return dict(body["result"])


async def until_status(hub: HubHarness, task_id: str, *statuses: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.clear()
        seen.update(await hub_state(hub, task_id))
        return seen["status"] in statuses

    await eventually(reached)
    return seen


@dataclass
class Gates:
    """Events the test tools wait on and set, so tests steer bodies without sleeping."""

    proceed: dict[int, asyncio.Event] = field(default_factory=dict)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def step(self, n: int) -> asyncio.Event:
        return self.proceed.setdefault(n, asyncio.Event())


def build_tools(gates: Gates) -> TaskTools:
    tasks = TaskTools(ttl_ms=TTL_MS, poll_interval_ms=POLL_MS, shutdown_timeout=5)

    @tasks.tool(task_support="optional")
    async def echo(text: str, task: TaskContext) -> str:
        """Say it back."""
        return text

    @tasks.tool()
    async def stepper(steps: int, task: TaskContext) -> str:
        for n in range(1, steps + 1):
            await task.report(f"step {n} of {steps}")
            await gates.step(n).wait()
        return f"{steps} steps done"

    @tasks.tool(task_support="required")
    async def confirm(question: str, task: TaskContext) -> str:
        answer = await task.elicit(question, CONFIRM, status_message="waiting for you")
        confirmed = answer.action == "accept" and (answer.content or {}).get("confirm") is True
        return "confirmed" if confirmed else "declined"

    @tasks.tool(task_support="required")
    async def survey(task: TaskContext) -> str:
        first, second = await asyncio.gather(
            task.elicit("Name?", {"type": "object", "properties": {"name": {"type": "string"}}}),
            task.elicit("Age?", {"type": "object", "properties": {"age": {"type": "integer"}}}),
        )
        assert first.content is not None and second.content is not None
        return f"{first.content['name']} is {second.content['age']}"

    @tasks.tool(task_support="optional")
    async def greet(task: TaskContext) -> str:
        answer = await task.elicit("Name?", {"type": "object", "properties": {}})
        return f"hello {answer.content}"

    @tasks.tool()
    async def refuse(key: str, task: TaskContext) -> str:
        await task.report("looking")
        raise MCPError(-32602, f"No record {key!r}", data={"key": key})

    @tasks.tool()
    async def soft_error(task: TaskContext) -> types.CallToolResult:
        text = types.TextContent(type="text", text="bad input, try again")
        return types.CallToolResult(content=[text], is_error=True)

    @tasks.tool()
    async def tool_error(task: TaskContext) -> str:
        raise ToolError("the widget is jammed")

    @tasks.tool()
    async def crash(task: TaskContext) -> str:
        raise RuntimeError("secret internal detail at /srv/db")

    @tasks.tool()
    async def sleeper(task: TaskContext) -> str:
        await task.report("sleeping")
        gates.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            gates.cancelled.set()
            raise
        return "woke up"

    return tasks


@dataclass
class Fleet:
    """One fleet server (MCPServer + TaskTools) on a bridge, and the hub reading the bucket."""

    url: str
    tasks: TaskTools
    bridge: TaskBridge
    gates: Gates
    hub: HubHarness
    served: Served


@pytest.fixture
async def fleet(
    nc: nats.NATS, bucket: str, server_id: str, hub: HubHarness
) -> AsyncIterator[Fleet]:
    gates = Gates()
    tasks = build_tools(gates)
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket)
    server = MCPServer("test-fleet", extensions=[tasks], lifespan=serving_lifespan(tasks, bridge))
    served = await serve_app(server.streamable_http_app(stateless_http=True))
    yield Fleet(served.url, tasks, bridge, gates, hub, served)
    for event in gates.proceed.values():
        event.set()
    await served.stop()
    await bridge.close()


# -- the CreateTaskResult and durability --------------------------------------------------


async def test_create_task_result_is_flat_and_exact(fleet: Fleet) -> None:
    response = await call_tool(fleet.url, "stepper", {"steps": 1}, caps=CAPS)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    result = body["result"]
    assert set(result) == {
        "resultType",
        "taskId",
        "status",
        "createdAt",
        "lastUpdatedAt",
        "ttlMs",
        "pollIntervalMs",
        "_meta",
    }
    assert result["resultType"] == "task"
    assert result["status"] == "working"
    assert result["ttlMs"] == TTL_MS and result["pollIntervalMs"] == POLL_MS
    assert result["createdAt"] == result["lastUpdatedAt"]
    assert list(result["_meta"]) == ["io.modelcontextprotocol/serverInfo"]
    fleet.gates.step(1).set()
    done = await until_status(fleet.hub, result["taskId"], "completed")
    assert done["createdAt"] == result["createdAt"]


async def test_tasks_get_right_after_the_reply_never_misses(fleet: Fleet) -> None:
    """Durable before reply (H44): the hub resolves the id the moment we have it."""
    for n in range(20):
        response = await call_tool(fleet.url, "echo", {"text": f"#{n}"}, caps=CAPS)
        task_id = response.json()["result"]["taskId"]
        got = (await fleet.hub.get_task(task_id)).json()
        assert "result" in got, got
        assert got["result"]["taskId"] == task_id


async def test_params_task_is_ignored(fleet: Fleet) -> None:
    """H74: the 2025-11-25 `task` param neither creates a task nor sets its ttl."""
    legacy = {"ttl": 5}
    plain = await call_tool(fleet.url, "echo", {"text": "hi"}, caps={}, task=legacy)
    assert plain.json()["result"]["resultType"] == "complete"
    assert plain.json()["result"]["content"] == [{"type": "text", "text": "hi"}]
    declared = await call_tool(fleet.url, "echo", {"text": "hi"}, caps=CAPS, task=legacy)
    assert declared.json()["result"]["resultType"] == "task"
    assert declared.json()["result"]["ttlMs"] == TTL_MS


# -- how a task ends ----------------------------------------------------------------------


async def test_reports_become_status_messages_at_the_hub(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "stepper", {"steps": 3})
    for n in (1, 2, 3):
        await eventually(lambda n=n: _message_is(fleet.hub, task_id, f"step {n} of 3"))
        fleet.gates.step(n).set()
    done = await until_status(fleet.hub, task_id, "completed")
    assert done["result"]["structuredContent"] == {"result": "3 steps done"}
    assert done["result"]["resultType"] == "complete"


async def _message_is(hub: HubHarness, task_id: str, message: str) -> bool:
    state = await hub_state(hub, task_id)
    return state["status"] == "working" and state.get("statusMessage") == message


async def test_json_rpc_error_fails_the_task_with_that_error(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "refuse", {"key": "k-9"})
    failed = await until_status(fleet.hub, task_id, "failed", "completed")
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": -32602, "message": "No record 'k-9'", "data": {"key": "k-9"}}
    assert failed["statusMessage"] == "No record 'k-9'"
    assert "result" not in failed


async def test_is_error_result_is_completed(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "soft_error")
    done = await until_status(fleet.hub, task_id, "completed", "failed")
    assert done["status"] == "completed"
    assert done["result"]["isError"] is True
    assert done["result"]["content"] == [{"type": "text", "text": "bad input, try again"}]


async def test_tool_error_is_an_is_error_result_as_inline(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "tool_error")
    done = await until_status(fleet.hub, task_id, "completed", "failed")
    assert done["status"] == "completed" and done["result"]["isError"] is True
    text = done["result"]["content"][0]["text"]
    assert text == "Error executing tool tool_error: the widget is jammed"


async def test_unexpected_exception_fails_with_32603_and_leaks_nothing(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "crash")
    failed = await until_status(fleet.hub, task_id, "failed", "completed")
    assert failed["error"] == {"code": -32603, "message": "Internal error"}
    assert failed["statusMessage"] == "Internal error"
    assert "secret" not in str(failed)


async def test_shutdown_fails_what_still_runs(fleet: Fleet) -> None:
    task_id = await start_task(fleet.url, "sleeper")
    await fleet.gates.started.wait()
    await fleet.served.stop()  # lifespan exit: TaskTools.serving ends
    failed = await until_status(fleet.hub, task_id, "failed")
    assert failed["error"] == {
        "code": -32603,
        "message": "The server shut down before the task finished",
    }
    assert fleet.tasks.running == 0


async def test_too_many_tasks_is_refused_before_creating_one(
    nc: nats.NATS, bucket: str, server_id: str, hub: HubHarness
) -> None:
    tasks = TaskTools(max_tasks=1)
    release = asyncio.Event()

    @tasks.tool()
    async def hold(task: TaskContext) -> str:
        await release.wait()
        return "released"

    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket)
    server = MCPServer("busy", extensions=[tasks], lifespan=serving_lifespan(tasks, bridge))
    served = await serve_app(server.streamable_http_app())
    try:
        first = await call_tool(served.url, "hold", caps=CAPS)
        assert first.json()["result"]["resultType"] == "task"
        second = await call_tool(served.url, "hold", caps=CAPS)
        assert second.json()["error"]["code"] == -32603
        release.set()
        await until_status(hub, first.json()["result"]["taskId"], "completed")
        await eventually(lambda: tasks.running == 0)
        third = await call_tool(served.url, "hold", caps=CAPS)
        assert third.json()["result"]["resultType"] == "task"
    finally:
        release.set()
        await served.stop()
        await bridge.close()


# -- pure pieces: who owns a task, and the result built from its record --------------


def request_context(
    meta: dict[str, Any] | None, version: str = "2026-07-28", user: Any = None
) -> ServerRequestContext[Any, Any]:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "headers": []}
    if user is not None:
        scope["user"] = user
    return ServerRequestContext(
        session=None,  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version=version,
        method="tools/call",
        meta=meta,  # type: ignore[arg-type]
        request=Request(scope),
    )


def test_default_owner_is_the_token_subject_else_anonymous() -> None:
    def user(subject: str | None) -> AuthenticatedUser:
        token = AccessToken(token="t", client_id="app-7", scopes=[], subject=subject)
        return AuthenticatedUser(token)

    assert default_owner(request_context(None)) == "anonymous"
    assert default_owner(request_context(None, user=user("alice"))) == "alice"
    assert default_owner(request_context(None, user=user(None))) == "app-7"


async def test_create_task_result_from_a_record(
    nc: nats.NATS, bucket: str, server_id: str, js: Any
) -> None:
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket)
    record = await bridge.create(owner="o", ttl_ms=None)
    await bridge.close()
    result = create_task_result(record)
    assert list(result)[:2] == ["resultType", "taskId"]
    assert result["ttlMs"] is None and "pollIntervalMs" not in result
