"""The legacy door's errors over real HTTP, as the TypeScript SDK 1.x server sends them.

An error of a method is HTTP 200 with the request's id, in the framing of the method's
answers (JSON; SSE for `tasks/result`), its message `MCP error <code>: …`
(hub/legacy/errors.py, docs/legacy.md#errors).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.wire import kv_subject
from hub.upstream import UpstreamSpec
from tests.helpers import HubHarness, envelope, free_port, new_task_id, start_hub

pytestmark = pytest.mark.timeout(60)

LEGACY = "2025-11-25"
BOTH = "application/json, text/event-stream"


@dataclass
class Door:
    harness: HubHarness
    session: str
    completed: str  # a task of the caller's, completed

    @property
    def url(self) -> str:
        return self.harness.url + "/legacy/mcp"

    def headers(self, **changed: str | None) -> dict[str, str]:
        """The headers of a good request, with some changed (None: left out)."""
        headers: dict[str, str | None] = {
            "accept": BOTH,
            "content-type": "application/json",
            "mcp-protocol-version": LEGACY,
            "mcp-session-id": self.session,
        }
        headers.update({name.replace("_", "-"): value for name, value in changed.items()})
        return {name: value for name, value in headers.items() if value is not None}

    async def post(self, body: Any, **changed: str | None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.harness.client.post(
            self.url, content=content, headers=self.headers(**changed)
        )


async def open_door(harness: HubHarness, js: Any, bucket: str) -> Door:
    await harness.hub.source.wait_caught_up(10)
    task_id = new_task_id()
    data = envelope(task_id, "completed", owner="anonymous", result={"content": []})
    await js.publish(kv_subject(bucket, task_id), data)
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}},
    }
    headers = {"accept": BOTH, "content-type": "application/json"}
    answer = await harness.client.post(harness.url + "/legacy/mcp", json=body, headers=headers)
    return Door(harness, answer.headers["mcp-session-id"], task_id)


@pytest.fixture
async def door(nats_url: str, bucket: str, js: Any, tmp_path: Path) -> AsyncIterator[Door]:
    harness = await start_hub(nats_url, bucket, tmp_path)
    try:
        yield await open_door(harness, js, bucket)
    finally:
        await harness.stop()


def call(method: str, params: dict[str, Any] | None = None, request_id: Any = 7) -> Any:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


def method_error(code: int, message: str, request_id: Any = 7) -> dict[str, Any]:
    error = {"code": code, "message": f"MCP error {code}: {message}"}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


# -- errors of methods: 200 -----------------------------------------------------------------


async def test_errors_of_methods_are_http_200_with_the_code_in_the_message(door: Door) -> None:
    terminal = "Cannot cancel task: already in terminal status 'completed'"
    not_found = "Failed to retrieve task: Task not found"
    modern = "This is the 2025-11-25 endpoint; send 2026-07-28 requests to /mcp"
    cases = [
        (call("tasks/cancel", {"taskId": door.completed}), method_error(-32602, terminal)),
        (call("tasks/get", {"taskId": new_task_id()}), method_error(-32602, not_found)),
        (call("tasks/cancel", {"taskId": new_task_id()}), method_error(-32602, not_found)),
        (call("tasks/get", {"taskId": 5}), method_error(-32602, "params.taskId must be a string")),
        (call("tasks/list", {"cursor": "not one"}), method_error(-32602, "Invalid cursor")),
        (call("no/such", request_id="n"), method_error(-32601, "Method not found: no/such", "n")),
        (call("tools/call", {"name": "x"}), method_error(-32601, "Method not found: tools/call")),
        (
            call("ping", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
            method_error(-32600, modern),
        ),
    ]
    for request, expected in cases:
        answer = await door.post(request)
        assert answer.status_code == 200, (request, answer.status_code, answer.text)
        assert answer.headers["content-type"] == "application/json", request
        assert answer.json() == expected, request


async def test_a_tasks_result_error_comes_on_its_event_stream(door: Door) -> None:
    """`tasks/result` answers SSE, so its errors do too, as an SDK server streams them."""
    answer = await door.post(call("tasks/result", {"taskId": new_task_id()}))
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/event-stream"
    data = [line[5:] for line in answer.text.splitlines() if line.startswith("data:")]
    assert [json.loads(line) for line in data] == [
        method_error(-32602, "Failed to retrieve task: Task not found")
    ]


async def test_an_upstream_that_cannot_be_reached_is_a_200_internal_error(
    nats_url: str, bucket: str, js: Any, tmp_path: Path
) -> None:
    gone = UpstreamSpec(None, f"http://127.0.0.1:{free_port()}/mcp")
    harness = await start_hub(nats_url, bucket, tmp_path, upstreams=(gone,))
    try:
        door = await open_door(harness, js, bucket)
        answer = await door.post(call("tools/list"))
        assert answer.status_code == 200, answer.text
        error = answer.json()["error"]
        assert error["code"] == -32603
        assert error["message"].startswith("MCP error -32603: Upstream 'default': ")
    finally:
        await harness.stop()
