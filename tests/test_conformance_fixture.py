"""The conformance fixture (conformance/fixture.py) keeps the contract the suite relies on.

The full suite runs from `conformance/run` (Node 22, about 20 s); this is the fast check
that the fixture still offers every tool, prompt and resource the suite's scenarios call,
and that its task tools behave as the tasks-* scenarios expect. The fixture runs on a
loopback port (uvicorn, its own header-whitespace wrapper) with a real bridge to the
session's nats-server; requests are real HTTP. Waits poll the server, never sleep.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge import TaskBridge
from conformance.fixture import build_server
from examples.fleet.common import strip_header_whitespace
from tests.helpers import TASKS_CAPS, eventually, headers_for, rpc, serve_app

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
NO_CAPS: dict[str, Any] = {}
# What the tasks-* scenarios declare: the extension, and the input kinds tasks ask for.
SUITE_CAPS: dict[str, Any] = {**TASKS_CAPS, "elicitation": {}, "sampling": {}}

# What the suite (0.2.0-alpha.12) calls by name (conformance/README.md says where).
SUITE_TOOLS = {
    "greet",
    "slow_compute",
    "failing_job",
    "protocol_error_job",
    "confirm_delete",
    "multi_input",
    "test_tool_with_task",
    "test_simple_text",
    "test_image_content",
    "test_audio_content",
    "test_embedded_resource",
    "test_multiple_content_types",
    "test_tool_with_progress",
    "test_error_handling",
    "test_x_mcp_header",
    "test_missing_capability",
    "test_streaming_elicitation",
    "test_logging_tool",
    "test_trigger_tool_change",
    "test_trigger_prompt_change",
    "json_schema_2020_12_tool",
    "test_input_required_result_elicitation",
    "test_input_required_result_sampling",
    "test_input_required_result_list_roots",
    "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs",
    "test_input_required_result_multi_round",
    "test_input_required_result_tampered_state",
    "test_input_required_result_capabilities",
}
SUITE_PROMPTS = {
    "test_simple_prompt",
    "test_prompt_with_arguments",
    "test_prompt_with_embedded_resource",
    "test_prompt_with_image",
    "test_input_required_result_prompt",
}
SUITE_RESOURCES = {"test://static-text", "test://static-binary", "test://watched-resource"}
SUITE_TEMPLATES = {"test://template/{id}/data"}


@pytest.fixture
async def fixture_url(nats_url: str, bucket: str, server_id: str) -> AsyncIterator[str]:
    def connect() -> Any:
        return TaskBridge.connect(nats_url, server_id=server_id, bucket=bucket)

    app = build_server(connect).streamable_http_app(stateless_http=True, host="127.0.0.1")
    served = await serve_app(strip_header_whitespace(app))
    try:
        yield served.url
    finally:
        await served.stop()


async def call(
    url: str, method: str, params: dict[str, Any], caps: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """One request, as a conforming client sends it: (HTTP status, JSON-RPC message)."""
    body = rpc(method, params, caps=SUITE_CAPS if caps is None else caps)
    headers = headers_for(body)
    if method in ("tools/call", "prompts/get"):
        headers["Mcp-Name"] = params["name"]
    elif method == "resources/read":
        headers["Mcp-Name"] = params["uri"]
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(url, json=body, headers=headers)
    return response.status_code, _message(response)


def _message(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        frames = [
            json.loads(line[5:])
            for line in response.text.splitlines()
            if line.startswith("data:") and line[5:].strip()
        ]
        return next(frame for frame in frames if "id" in frame)
    message: dict[str, Any] = response.json()
    return message


async def result(url: str, method: str, params: dict[str, Any], **kw: Any) -> dict[str, Any]:
    status, message = await call(url, method, params, **kw)
    assert status == 200 and "result" in message, message
    answer: dict[str, Any] = message["result"]
    return answer


async def until_terminal(url: str, task_id: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def terminal() -> bool:
        seen.update(await result(url, "tasks/get", {"taskId": task_id}))
        return seen["status"] in ("completed", "failed", "cancelled")

    await eventually(terminal, timeout=20)
    return seen


async def test_it_offers_everything_the_suite_calls(fixture_url: str) -> None:
    tools = await result(fixture_url, "tools/list", {})
    assert {tool["name"] for tool in tools["tools"]} >= SUITE_TOOLS
    assert {"ttlMs", "cacheScope"} <= tools.keys()  # caching
    prompts = await result(fixture_url, "prompts/list", {})
    assert {prompt["name"] for prompt in prompts["prompts"]} >= SUITE_PROMPTS
    resources = await result(fixture_url, "resources/list", {})
    assert {resource["uri"] for resource in resources["resources"]} >= SUITE_RESOURCES
    templates = await result(fixture_url, "resources/templates/list", {})
    listed = {template["uriTemplate"] for template in templates["resourceTemplates"]}
    assert listed >= SUITE_TEMPLATES
    discover = await result(fixture_url, "server/discover", {})
    assert discover["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}


async def test_task_tools_answer_as_the_tasks_scenarios_expect(fixture_url: str) -> None:
    created = await result(
        fixture_url, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}}
    )
    assert created["resultType"] == "task" and "result" not in created
    assert (await result(fixture_url, "tasks/get", {"taskId": created["taskId"]}))["taskId"]
    done = await until_terminal(fixture_url, created["taskId"])
    assert done["status"] == "completed" and done["result"]["content"]

    crashed = await result(fixture_url, "tools/call", {"name": "protocol_error_job"})
    failed = await until_terminal(fixture_url, crashed["taskId"])
    assert failed["status"] == "failed" and isinstance(failed["error"]["code"], int)

    # Without the tasks extension: optional tools run inline, required ones are -32021.
    inline = await result(
        fixture_url,
        "tools/call",
        {"name": "slow_compute", "arguments": {"seconds": 0}},
        caps=NO_CAPS,
    )
    assert inline["resultType"] == "complete" and "taskId" not in inline
    status, refused = await call(fixture_url, "tools/call", {"name": "failing_job"}, caps=NO_CAPS)
    assert status == 400 and refused["error"]["code"] == -32021
    required = refused["error"]["data"]["requiredCapabilities"]
    assert required == {"extensions": {"io.modelcontextprotocol/tasks": {}}}

    sync = await result(fixture_url, "tools/call", {"name": "greet", "arguments": {"name": "W"}})
    assert sync["content"][0]["text"] == "Hello, W!" and "taskId" not in sync


async def test_multi_input_has_two_questions_outstanding_at_once(fixture_url: str) -> None:
    created = await result(fixture_url, "tools/call", {"name": "multi_input"})
    seen: dict[str, Any] = {}

    async def asking() -> bool:
        seen.update(await result(fixture_url, "tasks/get", {"taskId": created["taskId"]}))
        return seen["status"] == "input_required"

    await eventually(asking)
    assert len(seen["inputRequests"]) == 2
    await result(fixture_url, "tasks/cancel", {"taskId": created["taskId"]})
    assert (await until_terminal(fixture_url, created["taskId"]))["status"] == "cancelled"


async def test_an_mrtr_round_then_a_task_that_remembers_the_answer(fixture_url: str) -> None:
    params: dict[str, Any] = {"name": "test_tool_with_task", "arguments": {}}
    first = await result(fixture_url, "tools/call", params)
    assert first["resultType"] == "input_required" and "taskId" not in first
    (key,) = first["inputRequests"]
    answer = {"action": "accept", "content": {"name": "Alice"}}
    retry = {**params, "inputResponses": {key: answer}}
    if "requestState" in first:
        retry["requestState"] = first["requestState"]
    created = await result(fixture_url, "tools/call", retry)
    assert created["resultType"] == "task" and "requestState" not in created
    done = await until_terminal(fixture_url, created["taskId"])
    assert "Alice" in done["result"]["content"][0]["text"]


async def test_whitespace_around_a_header_value_is_not_part_of_it(fixture_url: str) -> None:
    """RFC 9110 OWS: uvicorn's httptools keeps a trailing one; the fixture drops it."""
    port = int(fixture_url.split(":")[2].split("/")[0])
    body = json.dumps(rpc("tools/call", {"name": "greet", "arguments": {"name": "x"}})).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
        f"Mcp-Method: tools/call\r\nMcp-Name:  greet \t\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + body)
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert response.startswith(b"HTTP/1.1 200"), response[:300]
    assert b"Hello, x!" in response


def test_the_command_line_serves_and_stops_on_sigterm(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> None:
    ready = tmp_path / "url"
    argv = [sys.executable, "-m", "conformance.fixture", "--nats-url", nats_url, "--port", "0"]
    argv += ["--bucket", bucket, "--server-id", server_id, "--ready-file", str(ready)]
    process = subprocess.Popen(argv, cwd=REPO)
    try:
        asyncio.run(eventually(lambda: ready.is_file() or process.poll() is not None, 30))
        assert process.poll() is None, "the fixture exited"
        url = ready.read_text().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        status, message = asyncio.run(call(url, "tools/call", {"name": "test_simple_text"}))
        assert status == 200 and message["result"]["content"][0]["type"] == "text"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
