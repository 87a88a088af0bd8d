"""The 2025-11-25 door (`/legacy/mcp`) over real HTTP, in front of the fleet's alpha server.

A session-based client speaks the legacy task vocabulary to the hub; the hub answers from
its snapshot and control path and sends tool calls to the modern upstream translated
(hub/legacy/vocabulary.py). Raw JSON-RPC here, so every shape is visible; the real
clients' tests follow them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge import TaskBridge
from examples.fleet import alpha
from hub.settings import UpstreamSpec
from tests.cluster import taskhub_command
from tests.e2e.test_front_door import hub_in_front
from tests.helpers import (
    HubHarness,
    eventually,
    fleet_server,
    free_port,
    headers_for,
    rpc,
    start_hub,
)

pytestmark = pytest.mark.timeout(60)

LEGACY = "2025-11-25"


class LegacyClient:
    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.session: str | None = None
        self.ids = 0
        self.extra: dict[str, str] = {}  # sent with every request (a credential)

    def headers(self) -> dict[str, str]:
        headers = {
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": LEGACY,
            **self.extra,
        }
        if self.session is not None:
            headers["mcp-session-id"] = self.session
        return headers

    async def initialize(self) -> dict[str, Any]:
        answer = await self.post(
            "initialize",
            {
                "protocolVersion": LEGACY,
                "capabilities": {"elicitation": {"form": {}}, "tasks": {"list": {}, "cancel": {}}},
                "clientInfo": {"name": "legacy-test", "version": "1"},
            },
        )
        self.session = answer.headers["mcp-session-id"]
        await self.http.post(
            self.url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=self.headers(),
        )
        return dict(answer.json()["result"])

    async def post(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        self.ids += 1
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self.ids, "method": method}
        if params is not None:
            body["params"] = params
        return await self.http.post(self.url, json=body, headers=self.headers())

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = await self.post(method, params)
        message: dict[str, Any] = answer.json()
        assert "result" in message, message
        return dict(message["result"])

    @contextlib.asynccontextmanager
    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        self.ids += 1
        body = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        async with self.http.stream("POST", self.url, json=body, headers=self.headers()) as r:
            assert r.headers["content-type"].startswith("text/event-stream"), r.headers

            async def messages() -> AsyncIterator[dict[str, Any]]:
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        yield json.loads(line[5:])

            yield messages()


@pytest.fixture
async def front(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> AsyncIterator[HubHarness]:
    async with (
        fleet_server(alpha, nats_url, bucket, server_id) as url,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, url)) as harness,
    ):
        yield harness


@pytest.fixture
async def client(front: HubHarness) -> LegacyClient:
    legacy = LegacyClient(front.client, front.url + "/legacy/mcp")
    await legacy.initialize()
    return legacy


async def test_initialize_opens_a_session_with_the_legacy_tasks_capability(
    front: HubHarness,
) -> None:
    legacy = LegacyClient(front.client, front.url + "/legacy/mcp")
    result = await legacy.initialize()
    assert result["protocolVersion"] == LEGACY
    assert result["capabilities"]["tasks"] == {
        "list": {},
        "cancel": {},
        "requests": {"tools": {"call": {}}},
    }
    assert legacy.session is not None and len(legacy.session) >= 32


async def test_a_task_call_is_nested_and_followed_to_its_exact_result(
    client: LegacyClient,
) -> None:
    created = await client.call(
        "tools/call",
        {
            "name": "slow_report",
            "arguments": {"steps": 2, "step_seconds": 0.05},
            "task": {"ttl": 60000},
        },
    )
    task = created["task"]
    assert set(task) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl"}
    assert task["status"] == "working" and "resultType" not in created
    assert "ttlMs" not in task and "pollIntervalMs" not in task
    got = await client.call("tasks/get", {"taskId": task["taskId"]})
    assert got["taskId"] == task["taskId"] and "result" not in got

    async with client.stream("tasks/result", {"taskId": task["taskId"]}) as messages:
        final = [m async for m in messages][-1]
    result = final["result"]
    assert result["content"][0]["text"] == "Report on sales: 2 sections compiled"
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    listed = await client.call("tasks/list")
    assert task["taskId"] in [t["taskId"] for t in listed["tasks"]]


async def test_input_is_asked_on_the_result_stream_and_answered_as_an_update(
    client: LegacyClient,
) -> None:
    created = await client.call(
        "tools/call", {"name": "deploy", "arguments": {"service": "api"}, "task": {}}
    )
    task_id = created["task"]["taskId"]
    async with client.stream("tasks/result", {"taskId": task_id}) as messages:
        async for message in messages:
            if message.get("method") == "elicitation/create":
                meta = message["params"]["_meta"]
                assert meta["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
                answer = {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"action": "accept", "content": {"confirm": True}},
                }
                posted = await client.http.post(client.url, json=answer, headers=client.headers())
                assert posted.status_code == 202
            elif "result" in message or "error" in message:
                final = message
                break
    assert final["result"]["content"][0]["text"] == "api deployed to production"
    got = await client.call("tasks/get", {"taskId": task_id})
    assert got["status"] == "completed"


async def test_a_declined_deploy_is_failed_in_the_legacy_vocabulary(client: LegacyClient) -> None:
    created = await client.call(
        "tools/call", {"name": "deploy", "arguments": {"service": "db"}, "task": {}}
    )
    task_id = created["task"]["taskId"]
    async with client.stream("tasks/result", {"taskId": task_id}) as messages:
        async for message in messages:
            if message.get("method") == "elicitation/create":
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"action": "decline"}}
                await client.http.post(client.url, json=answer, headers=client.headers())
            elif "result" in message:
                assert message["result"]["isError"] is True  # the result, exactly
                break
    got = await client.call("tasks/get", {"taskId": task_id})
    assert got["status"] == "failed"  # isError → failed under 2025-11-25


async def test_cancel_returns_the_cancelled_task_and_a_terminal_one_is_refused(
    client: LegacyClient,
) -> None:
    created = await client.call(
        "tools/call", {"name": "deploy", "arguments": {"service": "web"}, "task": {}}
    )
    task_id = created["task"]["taskId"]
    cancelled = await client.call("tasks/cancel", {"taskId": task_id})
    assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
    again = (await client.post("tasks/cancel", {"taskId": task_id})).json()
    assert again["error"]["code"] == -32602
    assert "already in terminal status 'cancelled'" in again["error"]["message"]


async def test_sessions_are_required_and_bound(front: HubHarness, client: LegacyClient) -> None:
    bare = LegacyClient(front.client, client.url)
    assert (await bare.post("tasks/list")).status_code == 400
    bare.session = "x" * 43
    assert (await bare.post("tasks/list")).status_code == 404
    ended = await client.http.delete(client.url, headers=client.headers())
    assert ended.status_code == 204
    assert (await client.post("tasks/list")).status_code == 404


async def test_bad_input_gets_clear_errors(client: LegacyClient) -> None:
    bad_cursor = (await client.post("tasks/list", {"cursor": "not a cursor"})).json()
    assert bad_cursor["error"]["code"] == -32602
    modern = await client.post(
        "tasks/get",
        {"taskId": "t", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}},
    )
    assert modern.status_code == 200 and modern.json()["error"]["code"] == -32600
    assert "/mcp" in modern.json()["error"]["message"]
    unknown = (await client.post("tasks/get", {"taskId": "nope"})).json()
    assert unknown["error"]["code"] == -32602
    missing = (await client.post("no/such/method")).json()
    assert missing["error"]["code"] == -32601
    wrong = await client.http.post(
        client.url,
        json={"jsonrpc": "2.0", "id": 9, "method": "ping"},
        headers={**client.headers(), "mcp-protocol-version": "2026-07-28"},
    )
    assert wrong.status_code == 400 and "/mcp" in wrong.json()["error"]["message"]
    huge = {"jsonrpc": "2.0", "id": 9, "method": "ping", "params": {"x": "y" * 2_000_000}}
    too_large = await client.http.post(client.url, json=huge, headers=client.headers())
    assert too_large.status_code == 413
    assert "result" in (await client.post("ping")).json()


@contextlib.asynccontextmanager
async def status_events(
    client: LegacyClient, last_event_id: str | None = None
) -> AsyncIterator[AsyncIterator[tuple[str, dict[str, Any]]]]:
    headers = {**client.headers(), "accept": "text/event-stream"}
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    async with client.http.stream("GET", client.url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()

        async def events() -> AsyncIterator[tuple[str, dict[str, Any]]]:
            event_id = ""
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:"):
                    yield event_id, json.loads(line[5:])

        yield events()


async def test_the_get_stream_carries_status_and_resumes_from_last_event_id(
    client: LegacyClient,
) -> None:
    async with status_events(client) as events:
        created = await client.call(
            "tools/call",
            {"name": "slow_report", "arguments": {"steps": 2, "step_seconds": 0.05}, "task": {}},
        )
        task_id = created["task"]["taskId"]
        seen: list[tuple[str, dict[str, Any]]] = []
        async for event_id, message in events:
            assert message["method"] == "notifications/tasks/status"
            assert message["params"]["taskId"] == task_id
            assert "ttlMs" not in message["params"]
            seen.append((event_id, message["params"]))
            if message["params"]["status"] == "completed":
                break
    ids = [int(event_id) for event_id, _ in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Back with the first event's id: the task's state as it is now, once.
    async with status_events(client, str(ids[0])) as events:
        async for event_id, message in events:
            assert int(event_id) == ids[-1]
            assert message["params"] == seen[-1][1]
            break


async def test_a_modern_and_a_legacy_client_agree_on_the_same_task(
    front: HubHarness, client: LegacyClient
) -> None:
    created = await client.call(
        "tools/call",
        {"name": "slow_report", "arguments": {"steps": 3, "step_seconds": 0.05}, "task": {}},
    )
    task_id = created["task"]["taskId"]
    async with front.listen([task_id]) as modern:
        assert (await modern.next())["method"] == "notifications/subscriptions/acknowledged"
        final = await modern.until(lambda m: m.get("params", {}).get("status") == "completed")
    async with client.stream("tasks/result", {"taskId": task_id}) as messages:
        result = [m async for m in messages][-1]["result"]
    legacy = await client.call("tasks/get", {"taskId": task_id})
    assert legacy["status"] == final["params"]["status"] == "completed"
    assert legacy["lastUpdatedAt"] == final["params"]["lastUpdatedAt"]
    assert result["content"] == final["params"]["result"]["content"]


async def test_a_bad_last_event_id_is_refused(client: LegacyClient) -> None:
    headers = {**client.headers(), "accept": "text/event-stream", "last-event-id": "abc"}
    answer = await client.http.get(client.url, headers=headers)
    assert answer.status_code == 400


async def test_legacy_shapes_at_the_modern_endpoint_are_answered_by_the_hub(
    front: HubHarness,
) -> None:
    """`tasks/list` never exists at `/mcp`, and `initialize` names the versions spoken there;
    neither goes to the upstream, even one that would serve it."""
    forwarded = front.hub.metrics.upstream_requests.value("default", "ok")
    for method in ("tasks/list", "tasks/result"):
        body = rpc(method, {"taskId": "x"} if method == "tasks/result" else {})
        answer = await front.client.post(front.url + "/mcp", json=body, headers=headers_for(body))
        assert answer.status_code == 404 and answer.json()["error"]["code"] == -32601, method
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": LEGACY},
    }
    raw = await front.client.post(front.url + "/mcp", json=body)
    answer = raw.json()
    assert raw.status_code == 404 and answer["error"]["code"] == -32601
    assert answer["error"]["data"]["supported"] == ["2026-07-28"]
    assert "/legacy/mcp" in answer["error"]["message"]
    assert front.hub.metrics.upstream_requests.value("default", "ok") == forwarded


async def test_sigterm_ends_the_legacy_streams_and_the_hub_exits(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """A `taskhub serve` process with a session's GET stream and a waiting `tasks/result`
    open: SIGTERM answers the waiting request with a retryable error and the hub exits."""

    port = free_port()
    args = ["serve", "--port", str(port), "--nats-url", nats_url, "--bucket", bucket]
    proc = await asyncio.create_subprocess_exec(
        *taskhub_command(), *args, "--data-dir", str(tmp_path), "--keepalive", "1"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with (
            httpx.AsyncClient(timeout=10) as http,
            await TaskBridge.connect(nats_url, "srv-legacy", bucket=bucket) as bridge,
        ):

            async def ready() -> bool:
                try:
                    return (await http.get(url + "/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=15)
            task = await bridge.create(owner="anonymous")
            client = LegacyClient(http, url + "/legacy/mcp")
            await client.initialize()
            async with (
                status_events(client) as events,
                client.stream("tasks/result", {"taskId": task.task_id}) as waiting,
            ):
                proc.send_signal(signal.SIGTERM)
                last = [m async for m in waiting][-1]
                assert last["error"]["code"] == -32603 and "retry" in last["error"]["message"]
                assert [e async for e in events] == []  # it ended, with nothing sent
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_named_upstream_has_its_legacy_door_beside_it(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> None:
    async with fleet_server(alpha, nats_url, bucket, server_id) as url:
        harness = await start_hub(
            nats_url, bucket, tmp_path, upstreams=(UpstreamSpec("alpha", url),)
        )
        try:
            await harness.hub.source.wait_caught_up(10)
            client = LegacyClient(harness.client, harness.url + "/servers/alpha/legacy/mcp")
            await client.initialize()
            created = await client.call(
                "tools/call",
                {"name": "slow_report", "arguments": {"steps": 1, "step_seconds": 0}, "task": {}},
            )
            assert created["task"]["status"] == "working"
            modern = await client.post(
                "ping", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
            )
            assert "/servers/alpha/mcp" in modern.json()["error"]["message"]
            # The bare /legacy/mcp has no upstream here: task methods only.
            bare = LegacyClient(harness.client, harness.url + "/legacy/mcp")
            await bare.initialize()
            refused = (await bare.post("tools/call", {"name": "slow_report"})).json()
            assert refused["error"]["code"] == -32601
        finally:
            await harness.stop()
