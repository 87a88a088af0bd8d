"""The legacy door's errors over real HTTP, as the TypeScript SDK 1.x server sends them.

An error of a method is HTTP 200 with the request's id, in the framing of the method's
answers (JSON; SSE for `tasks/result`), its message `MCP error <code>: …`. A refusal of the
transport has the SDK transport's status and body, `"id": null` (hub/legacy/errors.py,
docs/legacy.md#errors). The real clients' view of the same errors is in
tests/e2e/test_legacy_clients.py.
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
from hub.settings import UpstreamSpec
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


def refused(code: int, message: str) -> dict[str, Any]:
    """The SDK transport's body for a refusal."""
    return {"jsonrpc": "2.0", "error": {"code": code, "message": message}, "id": None}


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


# -- refusals of the transport: the SDK's statuses and bodies ------------------------------


async def test_transport_refusals_have_the_sdk_statuses_and_bodies(door: Door) -> None:
    limit = door.harness.hub.config.max_body_bytes
    ping = call("ping")
    cases: list[tuple[str, Any, dict[str, str | None], int, dict[str, Any]]] = [
        (
            "no session",
            ping,
            {"mcp_session_id": None},
            400,
            refused(-32000, "Bad Request: Mcp-Session-Id header is required"),
        ),
        (
            "unknown session",
            ping,
            {"mcp_session_id": "x" * 43},
            404,
            refused(-32001, "Session not found"),
        ),
        (
            "bad Origin",
            ping,
            {"origin": "http://evil.example"},
            403,
            refused(-32000, "Invalid Origin header: http://evil.example"),
        ),
        (
            "a modern version",
            ping,
            {"mcp_protocol_version": "2026-07-28"},
            400,
            refused(
                -32000,
                "Bad Request: Unsupported protocol version: 2026-07-28 (supported versions: "
                "2025-11-25); 2026-07-28 is served at /mcp",
            ),
        ),
        (
            "Accept without SSE",
            ping,
            {"accept": "application/json"},
            406,
            refused(
                -32000,
                "Not Acceptable: Client must accept both application/json and text/event-stream",
            ),
        ),
        (
            "a body not JSON by its type",
            ping,
            {"content_type": "text/plain"},
            415,
            refused(-32000, "Unsupported Media Type: Content-Type must be application/json"),
        ),
        (
            "too large",
            b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"y" * limit + b'"}}',
            {},
            413,
            refused(-32000, f"Payload Too Large: Request body must not exceed {limit} bytes"),
        ),
        ("not JSON", b"{nope", {}, 400, refused(-32700, "Parse error: Invalid JSON")),
        (
            "not JSON-RPC",
            {"id": 1, "method": "ping"},
            {},
            400,
            refused(-32700, "Parse error: Invalid JSON-RPC message"),
        ),
        (
            "params not an object",
            {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]},
            {},
            400,
            refused(-32700, "Parse error: Invalid JSON-RPC message"),
        ),
        (
            "a response without a result",
            {"jsonrpc": "2.0", "id": 1},
            {},
            400,
            refused(-32700, "Parse error: Invalid JSON-RPC message"),
        ),
        (
            "a batch",
            [ping],
            {},
            400,
            refused(-32600, "Invalid Request: JSON-RPC batches are not supported"),
        ),
    ]
    wrong = []
    for name, body, changed, status, expected in cases:
        answer = await door.post(body, **changed)
        if (answer.status_code, answer.json()) != (status, expected):
            wrong.append((name, answer.status_code, answer.text))
        assert answer.headers["content-type"] == "application/json", name
    assert wrong == []
    assert (await door.post(ping)).json()["result"] is not None  # the session still works


async def test_an_ended_session_is_not_found(door: Door) -> None:
    ended = await door.harness.client.delete(door.url, headers=door.headers())
    assert ended.status_code == 204
    answer = await door.post(call("ping"))
    assert answer.status_code == 404
    assert answer.json() == refused(-32001, "Session not found")


async def test_get_and_other_http_methods_are_refused_as_the_sdk_does(door: Door) -> None:
    client = door.harness.client
    put = await client.put(door.url, content=b"{}", headers=door.headers())
    assert put.status_code == 405 and put.headers["allow"] == "GET, POST, DELETE"
    assert put.json() == refused(-32000, "Method not allowed.")
    json_only = await client.get(door.url, headers=door.headers(accept="application/json"))
    assert json_only.status_code == 406
    assert json_only.json() == refused(
        -32000, "Not Acceptable: Client must accept text/event-stream"
    )
    bad_id = await client.get(
        door.url, headers=door.headers(accept="text/event-stream", last_event_id="abc")
    )
    assert bad_id.status_code == 400
    assert bad_id.json() == refused(-32000, "Invalid event ID format")


async def test_a_host_the_hub_does_not_serve_is_refused_as_the_sdk_does(door: Door) -> None:
    """An open hub answers a foreign `Host` 421 elsewhere; the legacy door as the SDK's
    DNS-rebinding protection does (hub/app.py)."""
    answer = await door.post(call("ping"), host="evil.example")
    assert answer.status_code == 403
    assert answer.json() == refused(-32000, "Invalid Host header: evil.example")
    modern = await door.harness.client.post(
        door.harness.url + "/mcp", json=call("ping"), headers={"host": "evil.example"}
    )
    assert modern.status_code == 421


async def test_lenient_heads_are_served(door: Door) -> None:
    """No `Content-Type`, and wildcard `Accept` ranges, are fine (D21)."""
    client = door.harness.client
    session = {"mcp-session-id": door.session}
    bare = await client.post(door.url, content=json.dumps(call("ping")).encode(), headers=session)
    assert bare.status_code == 200 and "result" in bare.json(), bare.text
    for accept in ("*/*", "application/*, text/*", "application/json;q=1, text/event-stream;q=0.5"):
        answer = await door.post(call("ping"), accept=accept)
        assert answer.status_code == 200 and "result" in answer.json(), accept
    charset = await door.post(call("ping"), content_type="application/json; charset=utf-8")
    assert charset.status_code == 200
