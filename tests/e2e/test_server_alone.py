"""A fleet server on its own, no hub in the path: issue 11 item 0, "every server is complete".

The example fleet's `alpha` (TaskTools on the real `mcp` 2.3.0 MCPServer, uvicorn on a
loopback port, a real bridge to the session's nats-server) is called by the real `mcp`
client: a task tool's task is followed with `tasks/get` at that same URL until it ends,
answered with `tasks/update`, cancelled with `tasks/cancel`. Unknown, foreign and expired
tasks are the same -32602; a request that did not declare the extension is -32021; a listen
gets the SDK's ack with no `taskIds`. Finally `python -m examples.fleet.alpha` stops on
SIGTERM while a client holds a stream open. Waits poll the server, never sleep.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from bridge import TaskBridge
from examples.fleet import alpha
from examples.fleet.tasks_client import CreateTaskResult, HubTasks, TaskCalls
from tests.helpers import (
    HubHarness,
    SseStream,
    eventually,
    fleet_server,
    headers_for,
    new_task_id,
    rpc,
)

pytestmark = pytest.mark.timeout(60)

NOT_FOUND = (-32602, "Failed to retrieve task: Task not found")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def alpha_url(nats_url: str, bucket: str, server_id: str) -> AsyncIterator[str]:
    async with fleet_server(alpha, nats_url, bucket, server_id) as url:
        yield url


def at_server(url: str) -> Any:
    """tasks/* at the fleet server itself (HubTasks speaks them to whatever URL it gets).

    Entered in the test's own task: the SDK client's cancel scopes must not span a fixture's
    setup and teardown."""
    return HubTasks().connect(url, timeout=10)


async def confirm(_: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"confirm": True})


async def start(url: str, tool: str, arguments: dict[str, Any]) -> str:
    async with Client(url, extensions=[TaskCalls()], elicitation_callback=confirm) as client:
        created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(created, CreateTaskResult), created
    return created.task_id


async def until(tasks: HubTasks, task_id: str, *statuses: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.clear()
        seen.update(await tasks.get(task_id))
        return seen["status"] in statuses

    await eventually(reached)
    return seen


async def raw(url: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, json=body, headers=headers_for(body))


async def test_a_task_is_followed_to_its_end_at_the_server_that_made_it(alpha_url: str) -> None:
    async with at_server(alpha_url) as tasks:
        arguments = {"topic": "q3", "steps": 2, "step_seconds": 0.05}
        task_id = await start(alpha_url, "slow_report", arguments)
        # Read-your-create: the CreateTaskResult came after the store acked, so this finds it.
        assert (await tasks.get(task_id))["taskId"] == task_id
        state = await until(tasks, task_id, "completed", "failed", "cancelled")
        assert state["status"] == "completed", state
        assert state["result"]["content"] == [
            {"type": "text", "text": "Report on q3: 2 sections compiled"}
        ]


async def test_the_server_answers_tasks_get_exactly_as_the_hub(
    alpha_url: str, hub: HubHarness
) -> None:
    task_id = await start(alpha_url, "slow_report", {"steps": 1, "step_seconds": 0})

    async def ended() -> bool:
        body = (await raw(alpha_url, rpc("tasks/get", {"taskId": task_id}))).json()
        return bool(body["result"]["status"] == "completed")

    await eventually(ended)
    at_server = (await raw(alpha_url, rpc("tasks/get", {"taskId": task_id}))).json()["result"]
    at_hub = (await hub.get_task(task_id)).json()["result"]
    assert at_server.pop("_meta") and at_hub.pop("_meta")  # each names its own serverInfo
    assert at_server == at_hub
    assert at_server["resultType"] == "complete"


async def test_unknown_foreign_and_expired_tasks_are_one_not_found(
    alpha_url: str, nats_url: str, bucket: str
) -> None:
    async with at_server(alpha_url) as tasks:
        async with await TaskBridge.connect(nats_url, "other-1", bucket=bucket) as other:
            foreign = await other.create(owner="alice", ttl_ms=600_000)
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        async with await TaskBridge.connect(
            nats_url, "other-2", bucket=bucket, clock=lambda: hour_ago
        ) as old:
            # createdAt an hour ago, ttlMs a minute: past its ttl, though still stored.
            stale = await old.create(owner="anonymous", ttl_ms=60_000)
        for task_id in (new_task_id(), foreign.task_id, stale.task_id, "not a task id"):
            for call in (tasks.get, tasks.cancel):
                with pytest.raises(MCPError) as caught:
                    await call(task_id)
                assert (caught.value.error.code, caught.value.error.message) == NOT_FOUND
            with pytest.raises(MCPError) as caught:
                await tasks.update(task_id, {"k": {}})
            assert (caught.value.error.code, caught.value.error.message) == NOT_FOUND


async def test_not_found_is_the_hubs_error_with_the_sdks_http_status(alpha_url: str) -> None:
    response = await raw(alpha_url, rpc("tasks/get", {"taskId": new_task_id()}))
    error = response.json()["error"]
    assert (error["code"], error["message"]) == NOT_FOUND
    # The hub answers 200; the SDK's transport maps every -32602 to 400 (its table).
    assert response.status_code == 400


async def test_tasks_methods_need_the_extension_declared(alpha_url: str) -> None:
    task_id = await start(alpha_url, "slow_report", {"steps": 1, "step_seconds": 0})
    for method, params in (
        ("tasks/get", {"taskId": task_id}),
        ("tasks/update", {"taskId": task_id, "inputResponses": {}}),
        ("tasks/cancel", {"taskId": task_id}),
    ):
        response = await raw(alpha_url, rpc(method, params, caps={}))
        error = response.json()["error"]
        assert (response.status_code, error["code"]) == (400, -32021), (method, error)
        assert error["data"] == {
            "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        }


async def test_tasks_update_answers_the_question_and_the_tool_completes(alpha_url: str) -> None:
    async with at_server(alpha_url) as tasks:
        task_id = await start(alpha_url, "deploy", {"service": "web"})
        state = await until(tasks, task_id, "input_required")
        (key,) = state["inputRequests"]
        await tasks.update(task_id, {key: {"action": "accept", "content": {"confirm": True}}})
        state = await until(tasks, task_id, "completed", "failed", "cancelled")
        assert state["status"] == "completed", state
        assert state["result"]["content"][0]["text"] == "web deployed to production"
        await tasks.update(task_id, {key: {"action": "decline"}})  # terminal: acked, unchanged
        assert await tasks.get(task_id) == state


async def test_tasks_cancel_cancels_a_running_task(alpha_url: str) -> None:
    async with at_server(alpha_url) as tasks:
        task_id = await start(alpha_url, "slow_report", {"steps": 1000, "step_seconds": 0.05})
        await until(tasks, task_id, "working")
        await tasks.cancel(task_id)
        state = await until(tasks, task_id, "completed", "failed", "cancelled")
        assert state["status"] == "cancelled", state
        await tasks.cancel(task_id)  # a terminal task is acked and stays as it is
        assert await tasks.get(task_id) == state


async def listen_at(client: httpx.AsyncClient, url: str, task_ids: list[str]) -> Any:
    body = rpc("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, id="L")
    request = client.build_request("POST", url, json=body, headers=headers_for(body))
    return await client.send(request, stream=True)


async def test_a_listen_at_a_server_grants_no_task_ids(alpha_url: str) -> None:
    task_id = await start(alpha_url, "slow_report", {"steps": 1, "step_seconds": 0})
    async with httpx.AsyncClient(timeout=10) as client:
        response = await listen_at(client, alpha_url, [task_id])
        try:
            assert response.status_code == 200
            ack = await SseStream(response).next()
        finally:
            await response.aclose()
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert "taskIds" not in ack["params"]["notifications"]  # declined: follow it elsewhere


async def test_sigterm_stops_a_server_that_holds_an_open_stream(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> None:
    ready = tmp_path / "alpha.url"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.fleet.alpha",
        *("--nats-url", nats_url, "--server-id", server_id, "--bucket", bucket),
        *("--port", "0", "--ready-file", str(ready), "--shutdown-grace", "2"),
        cwd=REPO,
    )
    try:
        await eventually(lambda: ready.exists() or process.returncode is not None, timeout=20)
        url = ready.read_text().strip()
        async with httpx.AsyncClient(timeout=30) as client:
            response = await listen_at(client, url, [])
            try:
                await SseStream(response).next()  # the stream is open and held
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(process.wait(), timeout=15)
                assert time.monotonic() - started < 15
            finally:
                await response.aclose()
        assert code == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
