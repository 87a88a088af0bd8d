"""bridge/mcp_server.py and bridge/task_context.py: task tools on the real mcp 2.3.0 MCPServer.

The server under test is a real MCPServer served by uvicorn on a loopback port, writing
through a real bridge to the session's nats-server; the task is read back at a real hub.
Calls go over raw HTTP where the exact wire shape matters, and through the real `mcp`
client where the SDK's own behaviour is the point. Tool bodies wait on events the tests
set, never on time.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import mcp_types as types
import nats
import pytest
from mcp import Client
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from bridge import TaskBridge
from bridge.mcp_server import TaskTools, create_task_result, declares_tasks, default_owner
from bridge.task_context import TaskContext, TaskRun, required_capability
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
    """Durable before reply (§4.3, H44): the hub resolves the id the moment we have it."""
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


# -- callers that did not declare the extension -------------------------------------------


async def test_non_declaring_sdk_client_gets_sync_result_or_32021(fleet: Fleet) -> None:
    async with Client(fleet.url, mode="auto", read_timeout_seconds=10) as client:
        result = await client.call_tool("echo", {"text": "inline"})
        assert result.content == [types.TextContent(type="text", text="inline")]
        assert not result.is_error
        with pytest.raises(MCPError) as required:
            await client.call_tool("confirm", {"question": "sure?"})
        assert required.value.code == -32021
        assert required.value.data == {"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}}
        # An optional tool that asks for input mid-call cannot do so without a task.
        with pytest.raises(MCPError) as asks:
            await client.call_tool("greet", {})
        assert asks.value.code == -32021
    assert fleet.tasks.running == 0


async def test_required_tool_without_the_extension_is_http_400(fleet: Fleet) -> None:
    response = await call_tool(fleet.url, "confirm", {"question": "?"}, caps={"elicitation": {}})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32021
    assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}}


async def test_inline_reports_are_progress_notifications(fleet: Fleet) -> None:
    fleet.gates.step(1).set()
    fleet.gates.step(2).set()
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    async with Client(fleet.url, mode="auto", read_timeout_seconds=10) as client:
        result = await client.call_tool("stepper", {"steps": 2}, progress_callback=on_progress)
    assert result.structured_content == {"result": "2 steps done"}
    assert messages == ["step 1 of 2", "step 2 of 2"]


async def test_bad_arguments_are_answered_inline_and_create_no_task(fleet: Fleet) -> None:
    response = await call_tool(fleet.url, "stepper", {"steps": "many"}, caps=CAPS)
    result = response.json()["result"]
    assert result["resultType"] == "complete" and result["isError"] is True
    assert fleet.tasks.running == 0


async def test_listing_hides_the_task_context(fleet: Fleet) -> None:
    async with Client(fleet.url, mode="auto", read_timeout_seconds=10) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert listed["echo"].input_schema["properties"] == {
        "text": {"title": "Text", "type": "string"}
    }
    assert listed["echo"].input_schema["required"] == ["text"]
    assert listed["echo"].description == "Say it back."
    assert listed["survey"].input_schema.get("properties", {}) == {}


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
    """MRTR rule (§5, §8 item 15): ask only for what the originating tools/call declared."""
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


# -- pure pieces --------------------------------------------------------------------------


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


def meta_with(caps: dict[str, Any]) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
    }


def test_declares_tasks_reads_this_requests_meta_only() -> None:
    assert declares_tasks(request_context(meta_with(CAPS)))
    assert not declares_tasks(request_context(meta_with({})))
    assert not declares_tasks(request_context(meta_with({"extensions": {"other/x": {}}})))
    assert not declares_tasks(request_context(None))
    # H73: under 2025-11-25 the identifier does not turn modern tasks on.
    assert not declares_tasks(request_context(meta_with(CAPS), version="2025-11-25"))


def test_default_owner_is_the_token_subject_else_anonymous() -> None:
    def user(subject: str | None) -> AuthenticatedUser:
        token = AccessToken(token="t", client_id="app-7", scopes=[], subject=subject)
        return AuthenticatedUser(token)

    assert default_owner(request_context(None)) == "anonymous"
    assert default_owner(request_context(None, user=user("alice"))) == "alice"
    assert default_owner(request_context(None, user=user(None))) == "app-7"


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


def test_registration_checks_the_signature() -> None:
    tasks = TaskTools()

    def not_async(task: TaskContext) -> str:
        return ""

    async def no_context(x: int) -> str:
        return ""

    async def two_contexts(a: TaskContext, b: TaskContext) -> str:
        return ""

    async def sdk_context(task: TaskContext, ctx: Context) -> str:
        return ""

    for fn, error in [
        (not_async, "async def"),
        (no_context, "exactly one"),
        (two_contexts, "exactly one"),
        (sdk_context, "SDK Context"),
    ]:
        with pytest.raises(TypeError, match=error):
            tasks.add_tool(fn)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="task_support"):
        tasks.add_tool(no_context, task_support="always")  # type: ignore[arg-type]

    async def fine(task: TaskContext | None = None) -> str:
        return ""

    tasks.add_tool(fine)
    with pytest.raises(ValueError, match="already registered"):
        tasks.add_tool(fine)
    MCPServer("s", extensions=[tasks])
    with pytest.raises(RuntimeError, match="before constructing"):
        tasks.add_tool(fine, "later")


def test_inline_entry_has_the_sdk_shape() -> None:
    tasks = TaskTools()

    async def tool(a: int, task: TaskContext, b: str = "x") -> str:
        """Doc."""
        return ""

    tasks.add_tool(tool, "renamed")
    (binding,) = tasks.tools()
    signature = inspect.signature(binding.fn)
    assert list(signature.parameters) == ["a", "b", "mcp_request_context"]
    assert binding.fn.__doc__ == "Doc."
    assert binding.kwargs["name"] == "renamed"


async def test_create_task_result_from_a_record(
    nc: nats.NATS, bucket: str, server_id: str, js: Any
) -> None:
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket)
    record = await bridge.create(owner="o", ttl_ms=None)
    await bridge.close()
    result = create_task_result(record)
    assert list(result)[:2] == ["resultType", "taskId"]
    assert result["ttlMs"] is None and "pollIntervalMs" not in result


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
