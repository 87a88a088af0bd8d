"""The Inspector CLI `mcpdo` (`@modelcontextprotocol/inspector` 2.12.0, Node 22), `--era modern`.

mcpdo keeps its connections in a daemon (`mcpdod`) and each `mcpdo` invocation is one command
against a named connection. Here each test gets a private daemon (its own HOME, socket directory
and token) that the test starts itself and stops by PID, and two connections to the one URL under
test (`client_url`, one per entry of `npm.TARGETS`): `caller` runs the tool calls, `watcher` the
`tasks/get` and `tasks/cancel` commands, because a connection runs one command at a time and one
whose tool call is waiting for an answer refuses every other command.

On the 2026-07-28 era mcpdo's `tools/call` of a task tool follows the task itself (tasks/get at
the same URL) and prints the final result, or returns at once with `elicitationPending` when the
task asks for input; it never prints the task's id, and its `tasks/list` lists nothing on that era.
So the test takes the id of the task the call made from the server's own store (the test's
bucket), which is also the proof that the call made a task at all (run inline, it would make
none), and then drives `tasks/get` and `tasks/cancel` with mcpdo.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from nats.js.errors import NoKeysError

from bridge import TaskBridge
from tests.e2e import npm
from tests.e2e.mcpdo import Mcpdo, McpdoError
from tests.e2e.npm import Target
from tests.helpers import PROTOCOL, TASKS_EXT

pytestmark = pytest.mark.timeout(npm.TEST_TIMEOUT)

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture
async def store(js: Any, nc: Any, bucket: str) -> AsyncIterator[Store]:
    async with await TaskBridge.attach(nc, "inspector-reader", bucket=bucket) as reader:
        yield Store(await js.key_value(bucket), reader)


class Store:
    """The server side's truth: the tasks in the test's bucket."""

    def __init__(self, kv: Any, reader: TaskBridge) -> None:
        self.kv = kv
        self.reader = reader

    async def ids(self) -> set[str]:
        try:
            return set(await self.kv.keys())
        except NoKeysError:
            return set()

    async def new_task(self, before: set[str]) -> str:
        """The one task created since `before` was taken."""
        deadline = time.monotonic() + 10
        while not (new := await self.ids() - before):
            assert time.monotonic() < deadline, "no task was created"
            await asyncio.sleep(0.02)
        assert len(new) == 1, new
        return new.pop()

    async def state(self, task_id: str) -> dict[str, Any]:
        record = await self.reader.get(task_id)
        assert record is not None, task_id
        return msgspec.to_builtins(record.task)  # type: ignore[no-any-return]


async def connect_both(mcpdo: Mcpdo, url: str) -> None:
    for name in ("caller", "watcher"):
        connection = await mcpdo.connect(name, url)
        assert connection["name"] == name and connection["protocolEra"] == "modern", connection


async def test_mcpdo_calls_a_task_tool_and_gets_the_task(
    client_url: Target, mcpdo: Mcpdo, store: Store
) -> None:
    await connect_both(mcpdo, client_url.url)
    shown = await mcpdo.run("connections/show", "@caller")
    assert shown["protocolEra"] == "modern" and shown["protocolVersion"] == PROTOCOL
    assert shown["supportedVersions"] == [PROTOCOL]
    assert TASKS_EXT in shown["capabilities"]["extensions"]
    tools = {tool["name"] for tool in (await mcpdo.run("@caller", "tools/list"))["tools"]}
    assert {"slow_report", "deploy"} <= tools

    before = await store.ids()
    arguments = {"topic": "q3", "steps": 2, "step_seconds": 0.05}
    result = await mcpdo.call("caller", "slow_report", arguments)
    text = "Report on q3: 2 sections compiled"
    assert result["content"] == [{"type": "text", "text": text}], result
    assert result["isError"] is False

    # The call made a task (inline, it would have made none) and mcpdo followed it to its end.
    task_id = await store.new_task(before)
    stored = await store.state(task_id)
    assert stored["status"] == "completed"
    assert stored["result"]["content"] == result["content"]

    # tasks/get at the URL: the terminal state and its result, as the server stored them.
    task = await mcpdo.until_terminal("watcher", task_id)
    assert task["taskId"] == task_id and task["status"] == "completed", task
    wire = task["raw"]  # the tasks/get result as received
    assert wire["result"] == stored["result"]
    assert wire["result"]["content"] == [{"type": "text", "text": text}]


async def test_mcpdo_follows_a_task_through_input_to_its_result(
    client_url: Target, mcpdo: Mcpdo, store: Store
) -> None:
    await connect_both(mcpdo, client_url.url)
    before = await store.ids()
    # The task asks for confirmation: mcpdo returns at once, the call parked in its daemon.
    pending = (await mcpdo.call("caller", "deploy", {"service": "web"}))["elicitationPending"]
    assert pending["origin"] == "task-input-required", pending
    assert pending["message"] == "Deploy web to production?"
    task_id = await store.new_task(before)

    task = await mcpdo.get("watcher", task_id)
    assert task["status"] == "input_required", task
    ((key, request),) = task["raw"]["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert (await store.state(task_id))["inputRequests"] == {key: request}

    # The answer goes back as tasks/update; the deploy runs and completes.
    answered = await mcpdo.run(
        "@caller", "elicitation/respond", pending["elicitationId"], "confirm:=true"
    )
    done = [{"type": "text", "text": "web deployed to production"}]
    assert answered["content"] == done and answered["isError"] is False, answered

    task = await mcpdo.until_terminal("watcher", task_id)
    assert task["status"] == "completed", task
    assert task["raw"]["result"]["content"] == done
    assert (await store.state(task_id))["status"] == "completed"


async def test_mcpdo_cancels_a_waiting_task(client_url: Target, mcpdo: Mcpdo, store: Store) -> None:
    await connect_both(mcpdo, client_url.url)
    before = await store.ids()
    pending = (await mcpdo.call("caller", "deploy", {"service": "api"}))["elicitationPending"]
    task_id = await store.new_task(before)
    assert (await mcpdo.get("watcher", task_id))["status"] == "input_required"

    cancelled = await mcpdo.run("@watcher", "tasks/cancel", task_id)
    assert cancelled == {"cancelled": True, "taskId": task_id}
    task = await mcpdo.until_terminal("watcher", task_id)
    assert task["status"] == "cancelled", task
    assert "result" not in task["raw"] and "error" not in task["raw"], task
    assert (await store.state(task_id))["status"] == "cancelled"

    # Confirming now deploys nothing: the caller's call ends cancelled, the task stays so.
    with pytest.raises(McpdoError) as caught:
        await mcpdo.run("@caller", "elicitation/respond", pending["elicitationId"], "confirm:=true")
    assert caught.value.payload == {
        "error": {"code": "error", "message": 'Tool call "deploy" was cancelled.'}
    }, caught.value
    assert (await mcpdo.get("watcher", task_id))["status"] == "cancelled"
    assert (await store.state(task_id))["status"] == "cancelled"
