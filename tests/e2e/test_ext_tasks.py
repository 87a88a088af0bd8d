"""The official Tasks requester library `@modelcontextprotocol/ext-tasks` 0.2.2, on Node 22.

`tests/e2e/ts/tasks_ext.mjs` connects `@modelcontextprotocol/client` 2.4.0 pinned to 2026-07-28,
makes a task session of it with ext-tasks' `createTaskSessionFromClient` (its raw request path
is the client's own transport), calls one tool with the session's `callTool` and follows the
task with `settle()`, which polls `tasks/get`. Each test runs one scenario of the script against
the hub as the front door of the fleet server `alpha`, whose tasks are written through the NATS
bridge: the URL the library is given is the hub's only.

- complete: `slow_report` goes working, then completed; the library's outcome is the tool's
  return value, and it is the result stored for the task.
- input: `deploy` asks for confirmation (input_required); the library hands the elicitation to
  the session's `onInputRequest`, sends the answer with `tasks/update`, and settles. What the
  tool returns depends on the answer, so the result shows that the answer reached the tool.
- cancel: a long `slow_report`, cancelled through the execution as soon as the library saw the
  task; the library ends at the cancel ack, and the task's terminal state read back through the
  library (`session.task(id).result()`) and the one stored are both cancelled.

The same scenarios run against `examples/own_store` behind the hub: a poll-only server that
keeps its tasks in memory and writes nothing to NATS, so the hub reads each task there
(docs/front-door.md#tasks-the-upstream-keeps). What the library ends with is compared with the
upstream's own stored task (`OwnStoreServer.task`): `slow` completes with its `value`; `ask`'s
answer reaches the upstream's tool, which echoes it; a cancelled `slow` ends `cancelled` there;
a cancel raced against completion may end either way, as long as the hub tells the upstream's
end. With two hub replicas on one bucket in front of the upstream, the library runs at replica
A and replica B's `tasks/get` shows the same terminal state.

Node 22 and the libraries come from the npm project in tests/e2e/ts (`npm ci`, once per
session, see `tests/e2e/npm.py`). The tests skip only when `npm` is missing or the npm registry
cannot be reached; `TASKHUB_REQUIRE_TS_CLIENT=1` turns those skips into failures.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bridge import TaskBridge
from examples.fleet import alpha
from examples.own_store.rpc import NAME
from examples.own_store.server import OwnStoreServer
from tests.e2e import npm
from tests.e2e.npm import TS_DIR, Target
from tests.e2e.own_store import fronted, get, hub_before, own_store
from tests.helpers import PROTOCOL, HubHarness

pytestmark = pytest.mark.timeout(npm.TEST_TIMEOUT)

SCRIPT = TS_DIR / "tasks_ext.mjs"
RUN_TIMEOUT = 20.0  # seconds for the whole script run
CLIENT_TIMEOUT_MS = 15_000  # the script's own deadline


@pytest.fixture
async def front_door(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> AsyncIterator[Target]:
    """The hub as the front door of `alpha`, whose tasks the bridge writes to `bucket`."""
    async with npm.open_target("hub", nats_url, bucket, server_id, tmp_path) as target:
        yield target


@dataclass
class Run:
    """The script's stdout lines, parsed; its stderr (the wire trace) for diagnostics."""

    lines: list[dict[str, Any]]
    stderr: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of(kind)
        assert len(found) == 1, f"expected one {kind!r} line, got {found}\n{self.stderr[-4000:]}"
        return found[0]


async def run(
    node: str, url: str, scenario: str, tool: str, args: dict[str, Any], *extra: str
) -> Run:
    proc = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        url,
        scenario,
        tool,
        "--args",
        json.dumps(args),
        *extra,
        "--timeout-ms",
        str(CLIENT_TIMEOUT_MS),
        "--trace",
        cwd=TS_DIR,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        raise AssertionError(
            f"{scenario}: no exit in {RUN_TIMEOUT}s\nstdout:\n{stdout.decode()}\n"
            f"stderr:\n{stderr.decode(errors='replace')}"
        ) from None
    text = stderr.decode(errors="replace")
    assert proc.returncode == 0, f"exit={proc.returncode}\nstdout:\n{stdout.decode()}\n{text}"
    result = Run([json.loads(line) for line in stdout.splitlines()], text)
    print("\n".join(json.dumps(line) for line in result.lines))  # shown when a test fails
    return result


async def stored(nc: Any, bucket: str, task_id: str) -> dict[str, Any]:
    """The task as the bridge stored it in NATS."""
    async with await TaskBridge.attach(nc, "ext-tasks-reader", bucket=bucket) as reader:
        record = await reader.get(task_id)
    assert record is not None
    return msgspec.to_builtins(record.task)  # type: ignore[no-any-return]


def check_session(result: Run) -> str:
    """The common start: a 2026-07-28 task session and a task-backed execution; its task id."""
    connected = result.one("connected")
    assert connected["protocolVersion"] == PROTOCOL and connected["era"] == "modern"
    # The library took the hub's tasks extension for a 2026-07-28 Tasks server (generation V2).
    assert connected["sessionCapabilities"] == {
        "inventory": "known-handles",  # V2 has no tasks/list
        "execution": True,
        "cancellation": True,
        "inputResponses": True,
        "requestedRetention": False,
    }
    execution = result.one("execution")
    assert execution["executionKind"] == "task"
    task_id = execution["taskId"]
    assert isinstance(task_id, str) and task_id
    assert all(line["task"]["taskId"] == task_id for line in result.of("status"))
    assert result.of("libraryError") == []
    return task_id


async def test_ext_tasks_calls_a_task_tool_and_settles_to_its_result(
    front_door: Target, node: str, nc: Any, bucket: str
) -> None:
    args = {"topic": "q3", "steps": 3, "step_seconds": 0.1}
    result = await run(node, front_door.url, "complete", "slow_report", args)
    task_id = check_session(result)
    assert result.of("input") == []

    # The statuses settle() saw: the task as created, what polling sampled, the result.
    statuses = result.of("status")
    assert [line["status"] for line in statuses[:-1]] == ["working"] * (len(statuses) - 1)
    assert statuses[-1]["status"] == "completed"
    for line in statuses[1:-1]:
        assert line["statusMessage"] in {f"step {i} of 3: q3" for i in (1, 2, 3)}, line
    # Every state after the creation is a tasks/get the hub answered itself.
    for line in statuses[1:]:
        assert line["task"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "taskhub"

    # The outcome is what the tool returned, and it is the result stored for the task.
    outcome = result.one("outcome")
    assert outcome["status"] == "completed"
    text = "Report on q3: 3 sections compiled"
    assert outcome["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"result": text},
        "isError": False,
    }
    assert outcome["task"]["status"] == "completed"
    assert outcome["task"]["result"] == outcome["result"]
    record = await stored(nc, bucket, task_id)
    assert record["status"] == "completed"
    assert {"resultType": "complete", **record["result"]} == outcome["result"]
    assert result.one("final") == {
        "kind": "final",
        "scenario": "complete",
        "status": "completed",
        "race": None,
    }


@pytest.mark.parametrize(
    ("answer", "text", "is_error"),
    [
        ({"action": "accept", "content": {"confirm": True}}, "web deployed to production", False),
        ({"action": "decline"}, "web not deployed: the user did not confirm", True),
    ],
    ids=["confirmed", "declined"],
)
async def test_ext_tasks_answers_an_input_request_and_the_tool_gets_the_answer(
    front_door: Target,
    node: str,
    nc: Any,
    bucket: str,
    answer: dict[str, Any],
    text: str,
    is_error: bool,
) -> None:
    answer_arg = json.dumps(answer)
    run_args = ("input", "deploy", {"service": "web"}, "--answer", answer_arg)
    result = await run(node, front_door.url, *run_args)
    task_id = check_session(result)

    # The task went input_required with one form elicitation, which the library handed to
    # onInputRequest as the task's input (delivered by tasks/update), keyed as the task keys it.
    asked = [line for line in result.of("status") if line["status"] == "input_required"]
    assert asked, result.lines
    assert asked[0]["statusMessage"] == "web: waiting for confirmation"
    (key, request), *more = asked[0]["task"]["inputRequests"].items()
    assert more == []
    assert request == {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Deploy web to production?",
            "requestedSchema": alpha.CONFIRM_SCHEMA,
        },
    }
    handed = result.one("input")
    assert handed["inputKey"] == key
    assert handed["request"] == {"kind": "elicitation", "params": request["params"]}
    assert handed["context"] == {"scope": "task", "delivery": "task-update", "taskId": task_id}
    assert result.one("answer") == {"kind": "answer", "inputKey": key, "response": answer}

    # The tool's return depends on the answer: it reached the tool.
    outcome = result.one("outcome")
    assert outcome["status"] == "completed"
    assert outcome["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "isError": is_error,
    }
    assert result.of("status")[-1]["status"] == "completed"
    record = await stored(nc, bucket, task_id)
    assert record["status"] == "completed"
    assert {"resultType": "complete", **record["result"]} == outcome["result"]
    assert result.one("final")["status"] == "completed"


async def test_ext_tasks_cancels_a_slow_task(
    front_door: Target, node: str, nc: Any, bucket: str
) -> None:
    # Ten seconds of work unless cancelled; the script cancels on the first status it sees.
    args = {"topic": "long", "steps": 100, "step_seconds": 0.1}
    result = await run(node, front_door.url, "cancel", "slow_report", args)
    task_id = check_session(result)
    assert result.one("cancel")["atStatus"] == "working"
    result.one("cancelled")  # the hub acked tasks/cancel

    # The library ends at the ack (cancellation is cooperative): cancelled, with no terminal
    # snapshot of its own. The task's terminal state, read back through the library and as
    # stored, is cancelled too.
    outcome = result.one("outcome")
    assert outcome["status"] == "cancelled"
    assert "result" not in outcome
    server = result.one("server")
    assert server["status"] == "cancelled", server
    assert server["task"]["taskId"] == task_id and server["task"]["status"] == "cancelled"
    assert "result" not in server["task"]
    assert result.one("final") == {
        "kind": "final",
        "scenario": "cancel",
        "status": "cancelled",
        "race": "cancel-won",
    }
    record = await stored(nc, bucket, task_id)
    assert record["status"] == "cancelled"


# -- a poll-only upstream that keeps its own tasks, behind the hub ---------------------------
#
# `examples/own_store` keeps its tasks in memory and writes nothing to NATS; the hub fronts it
# with `--upstream` and reads each task there (docs/front-door.md#tasks-the-upstream-keeps).
# The library is given the hub's URL only; the upstream's own store is the reference.

UPSTREAM_POLL_MS = 100  # the tasks' pollIntervalMs: how often the hub and the library read


@pytest.fixture(params=["one-hub", "two-replicas"])
async def own_front(
    request: pytest.FixtureRequest, nats_url: str, bucket: str, tmp_path: Path
) -> AsyncIterator[tuple[OwnStoreServer, HubHarness]]:
    """`OwnStoreServer` and the hub in front of it: one hub, or two replicas behind a load
    balancer that sends each request to the other in turn (the harness then points there)."""
    replicas = 1 if request.param == "one-hub" else 2
    async with (
        own_store(poll_interval_ms=UPSTREAM_POLL_MS) as (server, url),
        fronted(nats_url, bucket, tmp_path, url, replicas) as (front, base),
    ):
        yield server, HubHarness(front.hub, front.server, front.task, base, front.client)


def upstream_task(server: OwnStoreServer, task_id: str) -> dict[str, Any]:
    """The task as the upstream keeps it."""
    task = server.task(task_id)
    assert task is not None, f"the upstream does not hold {task_id}"
    return task


def without_meta(task: dict[str, Any]) -> dict[str, Any]:
    """A task as a client received it, less what the answering server adds (`_meta`,
    `resultType`): what is left is comparable to the upstream's stored task."""
    return {key: value for key, value in task.items() if key not in ("_meta", "resultType")}


async def hub_reads(front: HubHarness, task_id: str) -> dict[str, Any]:
    """The hub's own `tasks/get` answer (a plain HTTP request), as a task."""
    answer = await get(front, task_id)
    assert "result" in answer, answer
    return without_meta(answer["result"])


async def test_ext_tasks_settles_a_task_the_upstream_keeps(
    own_front: tuple[OwnStoreServer, HubHarness], node: str
) -> None:
    server, front = own_front
    args = {"ms": 600, "value": "made upstream"}
    result = await run(node, front.url + "/mcp", "complete", "slow", args)
    task_id = check_session(result)
    assert result.of("input") == []

    # What settle() saw: the task as created, the steps polling sampled, then the result.
    statuses = result.of("status")
    assert [line["status"] for line in statuses[:-1]] == ["working"] * (len(statuses) - 1)
    assert statuses[-1]["status"] == "completed"
    for line in statuses[1:-1]:
        assert line["statusMessage"] in {"step 1/3", "step 2/3", "step 3/3"}, line
    # The creation is the upstream's answer; every state after it, the hub's own tasks/get.
    assert statuses[0]["task"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == NAME
    for line in statuses[1:]:
        assert line["task"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "taskhub"

    outcome = result.one("outcome")
    assert outcome["status"] == "completed"
    assert outcome["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": "made upstream"}],
    }
    assert outcome["task"]["status"] == "completed"
    assert outcome["task"]["result"] == outcome["result"]
    # What the library ended with is the upstream's own final state.
    kept = upstream_task(server, task_id)
    assert kept["status"] == "completed" and kept["result"] == outcome["result"]
    assert without_meta(outcome["task"]) == kept
    assert result.one("final") == {
        "kind": "final",
        "scenario": "complete",
        "status": "completed",
        "race": None,
    }


async def test_ext_tasks_answers_an_input_request_of_a_task_the_upstream_keeps(
    own_front: tuple[OwnStoreServer, HubHarness], node: str
) -> None:
    server, front = own_front
    answer = {"action": "accept", "content": {"ok": True}}
    args = {"question": "Ship it?", "ms": 100}
    run_args = ("input", "ask", args, "--answer", json.dumps(answer))
    result = await run(node, front.url + "/mcp", *run_args)
    task_id = check_session(result)

    # input_required with the upstream's one form elicitation, under its key `confirm`.
    asked = [line for line in result.of("status") if line["status"] == "input_required"]
    assert asked, result.lines
    assert asked[0]["statusMessage"] == "Ship it?"
    request = {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Ship it?",
            "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        },
    }
    assert asked[0]["task"]["inputRequests"] == {"confirm": request}
    handed = result.one("input")
    assert handed["inputKey"] == "confirm"
    assert handed["request"] == {"kind": "elicitation", "params": request["params"]}
    assert handed["context"] == {"scope": "task", "delivery": "task-update", "taskId": task_id}
    assert result.one("answer") == {"kind": "answer", "inputKey": "confirm", "response": answer}

    # The tool echoes the answer it was given: the library's tasks/update reached the upstream.
    text = "confirm: " + json.dumps(answer, sort_keys=True)
    outcome = result.one("outcome")
    assert outcome["status"] == "completed"
    assert outcome["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"confirm": answer},
    }
    kept = upstream_task(server, task_id)
    assert kept["status"] == "completed"
    assert kept["result"]["structuredContent"]["confirm"] == answer
    assert kept["result"] == outcome["result"]
    assert server.stats["tasks/update"] == 1
    assert result.one("final")["status"] == "completed"


async def test_ext_tasks_cancels_a_task_the_upstream_keeps(
    own_front: tuple[OwnStoreServer, HubHarness], node: str
) -> None:
    server, front = own_front
    # A minute of work unless cancelled; the script cancels on the first status it sees.
    result = await run(node, front.url + "/mcp", "cancel", "slow", {"ms": 60_000})
    task_id = check_session(result)
    assert result.one("cancel")["atStatus"] == "working"
    result.one("cancelled")  # the cancel was acked

    outcome = result.one("outcome")
    assert outcome["status"] == "cancelled"
    assert "result" not in outcome
    # Read back through the hub by the library, by a plain tasks/get, and at the upstream.
    read_back = result.one("server")
    assert read_back["status"] == "cancelled", read_back
    assert read_back["task"]["taskId"] == task_id and "result" not in read_back["task"]
    kept = upstream_task(server, task_id)
    assert kept["status"] == "cancelled"
    assert without_meta(read_back["task"]) == kept
    assert await hub_reads(front, task_id) == kept
    assert server.stats["tasks/cancel"] == 1
    assert result.one("final") == {
        "kind": "final",
        "scenario": "cancel",
        "status": "cancelled",
        "race": "cancel-won",
    }


# The cancel, sent on the first status the library sees, reaches the upstream about 10 ms
# after the task's creation (on this machine): at 0 ms the completion wins, at 30 ms the
# cancel mostly does, at 10 ms it is a toss-up. Each run accepts either end; the hub must tell
# the one the upstream tells.
@pytest.mark.parametrize("ms", [0, 10, 30])
async def test_ext_tasks_cancel_raced_against_completion_ends_as_the_upstream_says(
    ms: int, own_front: tuple[OwnStoreServer, HubHarness], node: str
) -> None:
    server, front = own_front
    result = await run(node, front.url + "/mcp", "cancel", "slow", {"ms": ms, "value": "won"})
    task_id = check_session(result)
    result.one("cancelled")
    final = result.one("final")
    kept = upstream_task(server, task_id)
    assert kept["status"] in ("completed", "cancelled")
    assert final["status"] == kept["status"]
    assert final["race"] == ("completion-won" if kept["status"] == "completed" else "cancel-won")
    read_back = result.one("server")
    assert without_meta(read_back["task"]) == kept
    if kept["status"] == "completed":
        assert kept["result"]["content"] == [{"type": "text", "text": "won"}]
        assert read_back["result"] == kept["result"]
    assert await hub_reads(front, task_id) == kept
    print(f"race: {final['race']}")


@pytest.mark.parametrize("scenario", ["complete", "cancel"])
async def test_ext_tasks_at_one_replica_the_other_replica_reads_the_same_end(
    scenario: str, node: str, nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Two hub replicas (one NATS bucket) in front of one upstream: the library creates and
    settles the task at replica A; replica B's tasks/get shows the same terminal state."""
    args = {"ms": 600 if scenario == "complete" else 60_000, "value": "seen by both"}
    async with (
        own_store(poll_interval_ms=UPSTREAM_POLL_MS) as (server, url),
        hub_before(nats_url, bucket, tmp_path / "a", url) as a,
        hub_before(nats_url, bucket, tmp_path / "b", url) as b,
    ):
        result = await run(node, a.url + "/mcp", scenario, "slow", args)
        task_id = check_session(result)
        final = result.one("final")
        kept = upstream_task(server, task_id)
        expected = "completed" if scenario == "complete" else "cancelled"
        assert final["status"] == kept["status"] == expected
        if scenario == "complete":
            assert kept["result"]["content"] == [{"type": "text", "text": "seen by both"}]
            assert without_meta(result.one("outcome")["task"]) == kept
        else:
            assert without_meta(result.one("server")["task"]) == kept
        # B was never asked before; it answers the same terminal state.
        assert await hub_reads(b, task_id) == kept
        assert await hub_reads(a, task_id) == kept
