"""examples/own_store/server.py over real HTTP: the poll-only server the hub fronts.

Each test starts the server in this event loop on a loopback port (one process test runs it
as `python -m`) and speaks raw JSON-RPC to it with httpx2, so the wire is what is checked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import msgspec
import pytest

from bridge.vocabulary import TASK_NOT_FOUND
from bridge.wire import DetailedTask, check_task, parse_timestamp
from examples.own_store.server import OwnStoreServer
from examples.own_store.tasks import TerminalTask
from tests.helpers import eventually, free_port, headers_for, rpc, serve_app

ROOT = Path(__file__).resolve().parent.parent
TASK_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")
NOT_FOUND = {"code": -32602, "message": TASK_NOT_FOUND}


class Client:
    """One caller of the server: well-formed requests, with its bearer token if it has one."""

    def __init__(self, http: httpx.AsyncClient, base: str, token: str | None = None) -> None:
        self.http = http
        self.base = base
        self.token = token

    async def post(
        self, body: dict[str, Any], *, accept: str | None = None, **headers: str
    ) -> httpx.Response:
        sent = headers_for(body)
        if body["method"] == "tools/call":
            sent["Mcp-Name"] = body["params"]["name"]
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        if accept is not None:
            sent["Accept"] = accept
        return await self.http.post(f"{self.base}/mcp", json=body, headers={**sent, **headers})

    async def result(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        response = await self.post(rpc(method, params, **kw))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        return response.json()["result"]

    async def error(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        response = await self.post(rpc(method, params, **kw))
        assert response.status_code == 200, response.text
        return response.json()["error"]

    async def start(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return await self.result("tools/call", {"name": tool, "arguments": arguments})  # type: ignore[no-any-return]

    async def get(self, task_id: str) -> dict[str, Any]:
        return await self.result("tasks/get", {"taskId": task_id})  # type: ignore[no-any-return]

    async def until(
        self, task_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Poll tasks/get until `done` holds for a state; every state seen, in order."""
        seen: list[dict[str, Any]] = []

        async def check() -> bool:
            seen.append(await self.get(task_id))
            return done(seen[-1])

        await eventually(check, timeout=timeout, interval=0.02)
        return seen


def status_is(*statuses: str) -> Callable[[dict[str, Any]], bool]:
    return lambda task: task["status"] in statuses


def detailed(result: dict[str, Any]) -> DetailedTask:
    """The DetailedTask inside a flat task result, checked as the hub checks what it reads."""
    fields = {key: value for key, value in result.items() if key not in ("resultType", "_meta")}
    task = msgspec.convert(fields, DetailedTask)
    check_task(task)
    return task


@contextlib.asynccontextmanager
async def running(**options: Any) -> AsyncIterator[tuple[OwnStoreServer, str]]:
    """An OwnStoreServer on a free loopback port: the server and its base URL."""
    server = OwnStoreServer(**options)
    served = await serve_app(server)
    try:
        yield server, served.url.removesuffix("/mcp")
    finally:
        await served.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


@pytest.fixture
async def open_server(http: httpx.AsyncClient) -> AsyncIterator[tuple[OwnStoreServer, Client]]:
    async with running(poll_interval_ms=50) as (server, base):
        yield server, Client(http, base)


async def test_discover_and_tools(open_server: tuple[OwnStoreServer, Client]) -> None:
    _, client = open_server
    discovered = await client.result("server/discover")
    assert discovered["resultType"] == "complete"
    assert discovered["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert "tasks" not in discovered["capabilities"]  # H28: no legacy capability
    assert discovered["supportedVersions"] == ["2026-07-28"]
    listed = await client.result("tools/list")
    assert listed["resultType"] == "complete"
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert set(tools) == {"slow", "ask", "fail"}
    assert tools["slow"]["inputSchema"]["properties"]["ms"]["type"] == "integer"


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_the_mcp_sdk_client_calls_its_tools(sse: bool) -> None:
    """A real 2026-07-28 client reads discovery, the listing and an inline call, either answer."""
    from mcp.client.client import Client as SdkClient

    async with running(sse=sse) as (_, base), SdkClient(f"{base}/mcp") as sdk:
        assert {tool.name for tool in (await sdk.list_tools()).tools} == {"slow", "ask", "fail"}
        result = await sdk.call_tool("slow", {"ms": 10, "value": "via the SDK"})
        assert result.content[0].model_dump()["text"] == "via the SDK"


async def test_slow_task_reports_steps_then_completes(
    open_server: tuple[OwnStoreServer, Client],
) -> None:
    _, client = open_server
    created = await client.start("slow", ms=600, value="hello")
    assert created["resultType"] == "task"
    task = detailed(created)
    assert TASK_ID.fullmatch(task.taskId)
    assert (task.status, task.ttlMs, task.pollIntervalMs) == ("working", 60_000, 50)
    assert parse_timestamp(task.createdAt) == parse_timestamp(task.lastUpdatedAt)

    seen = await client.until(task.taskId, status_is("completed"))
    for state in seen:
        assert state["resultType"] == "complete"
        detailed(state)
    messages = [state.get("statusMessage") for state in seen if state["status"] == "working"]
    assert len(set(messages)) >= 2, messages  # a follower sees several changes
    final = seen[-1]
    assert final["result"]["content"] == [{"type": "text", "text": "hello"}]
    assert parse_timestamp(final["lastUpdatedAt"]) > parse_timestamp(final["createdAt"])


async def test_ask_round(open_server: tuple[OwnStoreServer, Client]) -> None:
    _, client = open_server
    task_id = (await client.start("ask", question="Ship it?", ms=50))["taskId"]
    asking = (await client.until(task_id, status_is("input_required")))[-1]
    assert asking["inputRequests"] == {
        "confirm": {
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": "Ship it?",
                "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            },
        }
    }
    # H49: a key that is not outstanding is acknowledged and ignored.
    ack = await client.result("tasks/update", {"taskId": task_id, "inputResponses": {"x": {}}})
    assert ack["resultType"] == "complete"
    assert (await client.get(task_id))["status"] == "input_required"

    answer = {"action": "accept", "content": {"ok": True}}
    params = {"taskId": task_id, "inputResponses": {"confirm": answer}}
    assert (await client.result("tasks/update", params))["resultType"] == "complete"
    taken = await client.get(task_id)  # read-your-update: the answer is taken by the ack
    assert taken["status"] in ("working", "completed")
    assert "inputRequests" not in taken
    done = (await client.until(task_id, status_is("completed")))[-1]
    assert done["result"]["structuredContent"] == {"confirm": answer}
    # Answering again changes nothing: the task is terminal.
    assert (await client.result("tasks/update", params))["resultType"] == "complete"
    assert await client.get(task_id) == done


async def test_fail_task(open_server: tuple[OwnStoreServer, Client]) -> None:
    _, client = open_server
    task_id = (await client.start("fail", ms=20, code=-32000, message="no luck"))["taskId"]
    failed = (await client.until(task_id, status_is("failed")))[-1]
    assert failed["error"] == {"code": -32000, "message": "no luck"}
    assert failed["statusMessage"] == "no luck"  # H40
    assert "result" not in failed


async def test_cancel(open_server: tuple[OwnStoreServer, Client]) -> None:
    _, client = open_server
    task_id = (await client.start("slow", ms=60_000))["taskId"]
    ack = await client.result("tasks/cancel", {"taskId": task_id})
    assert ack["resultType"] == "complete"
    cancelled = await client.get(task_id)
    assert cancelled["status"] == "cancelled"
    # A terminal task is acknowledged unchanged.
    assert (await client.result("tasks/cancel", {"taskId": task_id}))["resultType"] == "complete"
    assert await client.get(task_id) == cancelled

    done_id = (await client.start("slow", ms=0))["taskId"]
    done = (await client.until(done_id, status_is("completed")))[-1]
    await client.result("tasks/cancel", {"taskId": done_id})
    assert await client.get(done_id) == done


async def test_without_the_extension_tools_run_inline(
    open_server: tuple[OwnStoreServer, Client],
) -> None:
    _, client = open_server
    result = await client.result("tools/call", {"name": "slow", "arguments": {"ms": 10}}, caps={})
    assert result["resultType"] == "complete"
    assert result["content"] == [{"type": "text", "text": "done"}]
    body = rpc("tools/call", {"name": "ask", "arguments": {}}, caps={})
    refused = await client.post(body)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == -32021
    failed = await client.error("tools/call", {"name": "fail", "arguments": {"ms": 0}}, caps={})
    assert failed == {"code": -32603, "message": "The fail tool always fails"}
    task_get = await client.post(rpc("tasks/get", {"taskId": "x" * 16}, caps={}))
    assert (task_get.status_code, task_get.json()["error"]["code"]) == (400, -32021)  # H31


async def test_wire_rules(
    open_server: tuple[OwnStoreServer, Client], http: httpx.AsyncClient
) -> None:
    server, client = open_server
    url = f"{client.base}/mcp"
    assert await client.error("tasks/get", {"taskId": "unknown-task-id-0000"}) == NOT_FOUND
    assert await client.error("tasks/get", {"taskId": "short"}) == NOT_FOUND
    assert (await client.error("tasks/get", {}))["code"] == -32602  # missing taskId
    update = await client.error("tasks/update", {"taskId": "unknown-task-id-0000"})
    assert update["code"] == -32602  # inputResponses missing

    parse = await http.post(url, content=b"{nope", headers=headers_for(rpc("tools/list")))
    assert parse.status_code == 400
    assert parse.json() == {"jsonrpc": "2.0", "error": parse.json()["error"]}  # no id
    assert parse.json()["error"]["code"] == -32700
    batch = await http.post(url, json=[rpc("tools/list")], headers=headers_for(rpc("tools/list")))
    assert (batch.status_code, batch.json()["error"]["code"]) == (400, -32600)

    notification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
    accepted = await http.post(url, json=notification, headers=headers_for(notification))
    assert (accepted.status_code, accepted.content) == (202, b"")

    unknown = await client.post(rpc("tasks/list"))
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, -32601)  # H18
    legacy = rpc("tools/list")
    legacy["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2025-11-25"
    old = await client.post(legacy, **{"MCP-Protocol-Version": "2025-11-25"})
    assert (old.status_code, old.json()["error"]["code"]) == (400, -32022)  # H10
    differs = await client.post(rpc("tools/list"), **{"MCP-Protocol-Version": "2025-11-25"})
    assert (differs.status_code, differs.json()["error"]["code"]) == (400, -32020)  # H9
    headers = headers_for(rpc("tools/list"))
    del headers["MCP-Protocol-Version"]
    missing = await http.post(url, json=rpc("tools/list"), headers=headers)
    assert (missing.status_code, missing.json()["error"]["code"]) == (400, -32020)  # H8
    bare = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
    no_meta = await client.post(bare)
    assert (no_meta.status_code, no_meta.json()["id"]) == (400, 7)
    assert no_meta.json()["error"]["code"] == -32602  # H11
    wrong_method = await client.post(rpc("tools/list"), **{"Mcp-Method": "tools/call"})
    assert (wrong_method.status_code, wrong_method.json()["error"]["code"]) == (400, -32020)

    task_id = (await client.start("slow", ms=60_000))["taskId"]
    body = rpc("tasks/get", {"taskId": task_id})
    wrong_name = await client.post(body, **{"Mcp-Name": "someone-elses-task"})
    assert (wrong_name.status_code, wrong_name.json()["error"]["code"]) == (400, -32020)  # H13
    encoded = "=?base64?" + base64.b64encode(task_id.encode()).decode() + "?="
    sentinel = await client.post(body, **{"Mcp-Name": encoded})
    assert sentinel.json()["result"]["taskId"] == task_id  # H14

    bad_args = await client.start("slow", ms="soon")
    assert bad_args["isError"] is True and bad_args["resultType"] == "complete"
    unknown_tool = await client.error("tools/call", {"name": "nope", "arguments": {}})
    assert unknown_tool["code"] == -32602
    assert (await http.get(url)).status_code == 405
    assert len(server.store.entries) == 1  # bad arguments cost no task


async def test_ownership_with_tokens(http: httpx.AsyncClient) -> None:
    async with running(tokens={"alice-token", "bob-token"}) as (_, base):
        alice, bob = Client(http, base, "alice-token"), Client(http, base, "bob-token")
        for stranger in (Client(http, base), Client(http, base, "mallory-token")):
            refused = await stranger.post(rpc("tools/list"))
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert refused.json()["jsonrpc"] == "2.0" and "id" not in refused.json()
            assert refused.json()["error"]["code"] == -31401

        task_id = (await alice.start("slow", ms=60_000))["taskId"]
        assert (await alice.get(task_id))["status"] == "working"
        # H46: someone else's task is exactly an unknown one.
        assert await bob.error("tasks/get", {"taskId": task_id}) == NOT_FOUND
        cancel = await bob.error("tasks/cancel", {"taskId": task_id})
        update = await bob.error("tasks/update", {"taskId": task_id, "inputResponses": {}})
        assert cancel == update == NOT_FOUND
        assert (await alice.get(task_id))["status"] == "working"  # bob's cancel did nothing


async def test_expired_tasks_are_gone(http: httpx.AsyncClient) -> None:
    async with running(ttl_ms=1000) as (server, base):
        client = Client(http, base)
        created = await client.start("slow", ms=60_000)
        assert created["ttlMs"] == 1000
        task_id = created["taskId"]
        assert (await client.get(task_id))["status"] == "working"

        async def gone() -> bool:
            response = await client.post(rpc("tasks/get", {"taskId": task_id}))
            return bool(response.json().get("error") == NOT_FOUND)

        await eventually(gone, timeout=5)
        assert server.task(task_id) is None
        await eventually(lambda: not server.store.entries, timeout=5)  # the memory is freed too


async def test_sse_answers(http: httpx.AsyncClient) -> None:
    async with running(sse=True) as (_, base):
        client = Client(http, base)
        body = rpc("tools/call", {"name": "slow", "arguments": {"ms": 30_000}})
        streamed = await client.post(body)
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.headers["x-accel-buffering"] == "no"
        events = [event for event in streamed.text.split("\n\n") if event]
        assert len(events) == 1
        lines = events[0].split("\n")
        assert lines[0] == "event: message" and lines[1].startswith("data: ")
        message = json.loads(lines[1].removeprefix("data: "))
        assert message["id"] == 1 and message["result"]["resultType"] == "task"
        assert (await client.get(message["result"]["taskId"]))["status"] == "working"

        inline = rpc("tools/call", {"name": "fail", "arguments": {"ms": 0}}, caps={})
        error_event = await client.post(inline)
        assert error_event.headers["content-type"].startswith("text/event-stream")
        assert '"code":-32603' in error_event.text

        as_json = await client.post(body, accept="application/json")
        assert as_json.headers["content-type"] == "application/json"
        assert as_json.json()["result"]["resultType"] == "task"
        # Only tools/call streams.
        assert (await client.result("tools/list"))["resultType"] == "complete"


async def test_stats(open_server: tuple[OwnStoreServer, Client], http: httpx.AsyncClient) -> None:
    server, client = open_server
    assert (await http.post(f"{client.base}/reset-stats")).status_code == 204
    task_id = (await client.start("slow", ms=60_000))["taskId"]
    for _ in range(3):
        await client.get(task_id)
    await http.post(f"{client.base}/mcp", content=b"[", headers=headers_for(rpc("tools/list")))
    stats = (await http.get(f"{client.base}/stats")).json()
    assert stats == {"tools/call": 1, "tasks/get": 3, "(invalid)": 1}
    assert server.stats["tasks/get"] == 3
    await http.post(f"{client.base}/reset-stats")
    assert (await http.get(f"{client.base}/stats")).json() == {}


async def test_set_status_hook(open_server: tuple[OwnStoreServer, Client]) -> None:
    server, client = open_server
    task_id = (await client.start("slow", ms=300))["taskId"]
    requests = {"pick": {"method": "roots/list", "params": {}}}
    server.set_status(task_id, "input_required", message="which?", input_requests=requests)
    held = await client.get(task_id)
    assert (held["status"], held["inputRequests"]) == ("input_required", requests)
    params = {"taskId": task_id, "inputResponses": {"pick": {"roots": []}}}
    await client.result("tasks/update", params)
    assert (await client.get(task_id))["status"] == "working"
    with pytest.raises(ValueError, match="requires 'result'"):
        server.set_status(task_id, "completed")
    server.set_status(task_id, "completed", result={"content": [], "resultType": "complete"})
    # The slow body's timers stopped when the hook took over: the result stays the hook's.
    assert not server.store.entries[task_id].timers
    assert (await client.get(task_id))["result"] == {"content": [], "resultType": "complete"}
    with pytest.raises(TerminalTask):
        server.set_status(task_id, "working")
    with pytest.raises(KeyError):
        server.set_status("no-such-task-00000", "working")


async def test_process_exits_on_sigterm_while_a_client_waits(http: httpx.AsyncClient) -> None:
    port = free_port()
    command = [sys.executable, "-m", "examples.own_store.server", "--port", str(port)]
    process = await asyncio.create_subprocess_exec(
        *command, "--token", "t0", "--shutdown-grace", "1", cwd=ROOT
    )
    try:
        base = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            with contextlib.suppress(httpx.TransportError):
                return (await http.get(f"{base}/readyz")).status_code == 204
            return False

        await eventually(ready, timeout=10)
        client = Client(http, base, "t0")
        # An inline slow call holds its connection open for a minute.
        body = rpc("tools/call", {"name": "slow", "arguments": {"ms": 60_000}}, caps={})
        held = asyncio.create_task(client.post(body))
        await eventually(lambda: _count(http, base, "tools/call"), timeout=5)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(8):
            assert await process.wait() == 0
        assert time.monotonic() - started < 5
        with contextlib.suppress(httpx.HTTPError):
            await held
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _count(http: httpx.AsyncClient, base: str, method: str) -> bool:
    count: int = (await http.get(f"{base}/stats")).json().get(method, 0)
    return count > 0
