"""Real 2025-11-25 clients at the hub's legacy door only (issue 13's acceptance).

The hub is the front door of the fleet's alpha server; each client is given
`<hub>/legacy/mcp` and nothing else:

- the TypeScript SDK `@modelcontextprotocol/sdk` 1.32.2 and its experimental tasks API
  (tests/e2e/ts/legacy.mjs): a task followed to its result, one answered when it asks for
  input (the elicitation arrives on the `tasks/result` stream), one cancelled, and
  `tasks/list` showing only this caller's tasks;
- the Inspector CLI `mcpdo` 2.12.0 in its default era, legacy: `tools/list`, a task
  `tools/call` (`--task`), `tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel`.

Both see the door's errors with their JSON-RPC codes, as from an SDK 1.x server: the SDK
raises an `McpError` carrying the code (tests/e2e/ts/legacy_errors.mjs), and `mcpdo`, which
prints an error's message only, prints `MCP error <code>: …`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from examples.fleet import alpha
from hub.settings import UpstreamSpec
from tests.e2e import npm
from tests.e2e.mcpdo import Mcpdo, McpdoError
from tests.e2e.npm import TS_DIR
from tests.helpers import HubHarness, envelope, fleet_server, new_task_id, start_hub

pytestmark = pytest.mark.timeout(npm.TEST_TIMEOUT)


@pytest.fixture
async def legacy_url(
    node: str, nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> AsyncIterator[tuple[str, HubHarness]]:
    async with fleet_server(alpha, nats_url, bucket, server_id) as url:
        hub = await start_hub(nats_url, bucket, tmp_path, upstreams=(UpstreamSpec(None, url),))
        try:
            await hub.hub.source.wait_caught_up(10)
            yield hub.url + "/legacy/mcp", hub
        finally:
            await hub.stop()


async def test_the_typescript_sdk_1x_tasks_client(
    node: str, legacy_url: tuple[str, HubHarness], js: Any, bucket: str
) -> None:
    url, _ = legacy_url
    # Someone else's task in the same bucket: tasks/list must not show it.
    other = new_task_id()
    await js.publish(f"$KV.{bucket}.{other}", envelope(other, owner="mallory"))
    proc = await asyncio.create_subprocess_exec(
        node,
        str(TS_DIR / "legacy.mjs"),
        url,
        cwd=TS_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    lines = [json.loads(line) for line in out.decode().splitlines()]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_kind.setdefault(line["kind"], []).append(line)

    connected = by_kind["connected"][0]
    assert connected["protocolVersion"] == "2025-11-25" and connected["sessionId"]
    assert connected["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    report, deploy = by_kind["created"][0]["task"], by_kind["created"][1]["task"]
    assert report["status"] == "working" and "ttl" in report and "ttlMs" not in report
    results = {line["tool"]: line["result"] for line in by_kind["result"]}
    assert results["slow_report"]["content"][0]["text"] == "Report on sales: 2 sections compiled"
    assert "resultType" not in results["slow_report"]
    related = results["deploy"]["_meta"]["io.modelcontextprotocol/related-task"]
    assert related == {"taskId": deploy["taskId"]}
    assert results["deploy"]["content"][0]["text"] == "api deployed to production"
    statuses = [line["task"]["status"] for line in by_kind["status"] if line["tool"] == "deploy"]
    assert "input_required" in statuses
    asked = by_kind["elicited"][0]["requests"]
    assert len(asked) == 1 and asked[0]["message"] == "Deploy api to production?"
    assert by_kind["cancelled"][0]["task"]["status"] == "cancelled"
    assert by_kind["get"][0]["task"]["status"] == "cancelled"
    listed = {task["taskId"]: task["status"] for task in by_kind["list"][0]["tasks"]}
    cancelled = by_kind["cancelled"][0]["task"]["taskId"]
    assert listed == {
        report["taskId"]: "completed",
        deploy["taskId"]: "completed",
        cancelled: "cancelled",
    }
    assert other not in listed and by_kind["done"]


async def test_mcpdo_in_its_default_legacy_era(
    legacy_url: tuple[str, HubHarness], mcpdo: Mcpdo
) -> None:
    url, _ = legacy_url
    for name in ("caller", "watcher"):
        connection = await mcpdo.run("connect", f"@{name}", url)  # no --era: the default
        assert connection["protocolEra"] == "legacy", connection
    tools = await mcpdo.run("@caller", "tools/list")
    assert {tool["name"] for tool in tools["tools"]} == {"slow_report", "deploy"}

    arguments = json.dumps({"steps": 2, "step_seconds": 0.05})
    result = await mcpdo.run(
        "@caller", "tools/call", "slow_report", "--tool-args-json", arguments, "--task"
    )
    assert result["content"][0]["text"] == "Report on sales: 2 sections compiled"
    task_id = result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
    listed = await mcpdo.run("@watcher", "tasks/list")
    assert [task["taskId"] for task in listed["tasks"]] == [task_id]
    got = await mcpdo.run("@watcher", "tasks/get", task_id)
    assert got["task"]["status"] == "completed"
    again = await mcpdo.run("@watcher", "tasks/result", task_id)
    assert again["content"] == result["content"]

    # A deploy waits for confirmation; the watcher cancels it.
    service = json.dumps({"service": "x"})
    calling = asyncio.create_task(
        mcpdo.run("@caller", "tools/call", "deploy", "--tool-args-json", service, "--task")
    )
    try:
        waiting = None
        async with asyncio.timeout(20):
            while waiting is None:
                tasks = (await mcpdo.run("@watcher", "tasks/list"))["tasks"]
                waiting = next((t for t in tasks if t["status"] == "input_required"), None)
        cancelled = await mcpdo.run("@watcher", "tasks/cancel", waiting["taskId"])
        assert cancelled["taskId"] == waiting["taskId"]
        final = await mcpdo.run("@watcher", "tasks/get", waiting["taskId"])
        assert final["task"]["status"] == "cancelled"
        with pytest.raises(McpdoError, match="cancelled"):
            await calling
    finally:
        calling.cancel()


async def run_script(node: str, script: str, url: str) -> dict[str, dict[str, Any]]:
    """A script of tests/e2e/ts run against `url`: its output lines by kind."""
    proc = await asyncio.create_subprocess_exec(
        node,
        str(TS_DIR / script),
        url,
        cwd=TS_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    return {line["kind"]: line for line in map(json.loads, out.decode().splitlines())}


async def test_the_typescript_sdk_1x_gets_each_error_as_an_mcp_error_with_its_code(
    node: str, legacy_url: tuple[str, HubHarness]
) -> None:
    url, _ = legacy_url
    by_kind = await run_script(node, "legacy_errors.mjs", url)
    assert by_kind["completed"] and by_kind["done"]
    expected = {
        "cancel completed": (-32602, "Cannot cancel task: already in terminal status 'completed'"),
        "get unknown": (-32602, "Failed to retrieve task: Task not found"),
        "result unknown": (-32602, "Failed to retrieve task: Task not found"),
        "unknown method": (-32601, "Method not found: hub/nothing"),
    }
    for kind, (code, message) in expected.items():
        error = by_kind[kind]
        assert error.get("mcpError") is True, error  # not an HTTP error without the code
        assert error["code"] == code and message in error["message"], error


async def test_mcpdo_prints_the_json_rpc_code_of_an_error(
    legacy_url: tuple[str, HubHarness], mcpdo: Mcpdo
) -> None:
    url, _ = legacy_url
    await mcpdo.run("connect", "@legacy", url)
    arguments = json.dumps({"steps": 1, "step_seconds": 0})
    result = await mcpdo.run(
        "@legacy", "tools/call", "slow_report", "--tool-args-json", arguments, "--task"
    )
    task_id = result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
    with pytest.raises(McpdoError) as cancelled:
        await mcpdo.run("@legacy", "tasks/cancel", task_id)
    assert cancelled.value.payload["error"]["message"] == (
        "MCP error -32602: Cannot cancel task: already in terminal status 'completed'"
    )
    with pytest.raises(McpdoError) as unknown:
        await mcpdo.run("@legacy", "tasks/get", new_task_id())
    assert unknown.value.payload["error"]["message"] == (
        "MCP error -32602: Failed to retrieve task: Task not found"
    )
