"""bridge/mcp_server.py, the synchronous path: callers that did not declare the tasks
extension get an inline result or -32021, and tools register under the SDK's own shape."""

from __future__ import annotations

import inspect
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

from bridge.mcp_server import TaskTools, declares_tasks
from bridge.task_context import TaskContext
from tests.helpers import TASKS_EXT
from tests.test_mcp_server_tasks import CAPS, Fleet, call_tool, request_context
from tests.test_mcp_server_tasks import fleet as fleet  # a fixture

pytestmark = pytest.mark.timeout(60)


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


def meta_with(caps: dict[str, Any]) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
    }


def test_declares_tasks_reads_this_requests_meta_only() -> None:
    assert declares_tasks(request_context(meta_with(CAPS)))
    assert not declares_tasks(request_context(meta_with({})))
    assert not declares_tasks(request_context(meta_with({"extensions": {"other/x": {}}})))
    # The same rule as the hub's: the extension's value must be an object.
    tasks_true = {"extensions": {"io.modelcontextprotocol/tasks": True}}
    assert not declares_tasks(request_context(meta_with(tasks_true)))
    assert not declares_tasks(request_context(None))
    # H73: under 2025-11-25 the identifier does not turn modern tasks on.
    assert not declares_tasks(request_context(meta_with(CAPS), version="2025-11-25"))


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
