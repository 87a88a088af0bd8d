"""bridge/control.py against a real nats-server: forwarded tasks/update and tasks/cancel.

Control messages are published exactly as the hub does (stream MCP_TASKS_CTL, subject
`mcp.tasks.ctl.<server>`, a `Nats-Msg-Id` each). Tests wait on the bridge's counters or
on JetStream's consumer state, never on sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from bridge import ControlOptions, ControlStats, TaskBridge, TaskRecord, states
from bridge.control import outstanding, refusal
from bridge.wire import (
    CONTROL_STREAM,
    CancelMessage,
    ControlMessage,
    UpdateMessage,
    control_subject,
    encode,
)
from hub.commands.embedded_nats import NatsServerProcess
from tests.helpers import eventually

ELICIT: dict[str, Any] = {
    "method": "elicitation/create",
    "params": {"message": "OK?", "requestedSchema": {}},
}
YES: dict[str, Any] = {"action": "accept", "content": {"ok": True}}
NO: dict[str, Any] = {"action": "decline"}
RESULT: dict[str, Any] = {"content": [], "isError": False}
OWNER = "alice"

FAST = ControlOptions(
    ack_wait=0.5,
    backoff=(0.05, 0.1),
    max_deliveries=3,
    fetch_timeout=1.0,
    retry_pause=0.1,
    close_timeout=0.2,
)


class Recorder:
    """Handlers that record every call; `fail` makes the next n input calls raise."""

    def __init__(self) -> None:
        self.inputs: list[tuple[str, dict[str, Any]]] = []
        self.cancels: list[str] = []
        self.fail = 0

    async def on_input(self, task_id: str, responses: dict[str, Any]) -> None:
        self.inputs.append((task_id, responses))
        if self.fail:
            self.fail -= 1
            raise RuntimeError("handler failed")

    async def on_cancel(self, task_id: str) -> None:
        self.cancels.append(task_id)


def listen(bridge: TaskBridge) -> Recorder:
    recorder = Recorder()
    bridge.on_input(recorder.on_input)
    bridge.on_cancel(recorder.on_cancel)
    return recorder


def settled(stats: ControlStats) -> int:
    return stats.processed + stats.ignored + stats.dead_letters + stats.malformed


async def until_settled(bridge: TaskBridge, count: int) -> ControlStats:
    """Wait until `count` messages got their final verdict; return the counters."""
    await eventually(lambda: settled(bridge.control_stats) >= count, timeout=5)
    return bridge.control_stats


async def send(js: Any, server: str, message: ControlMessage | bytes) -> None:
    """Publish like the hub: durable in the control stream, with a de-duplication id."""
    data = message if isinstance(message, bytes) else encode(message)
    headers = {"Nats-Msg-Id": uuid.uuid4().hex}
    await js.publish(control_subject(server), data, stream=CONTROL_STREAM, headers=headers)


def update(task_id: str, responses: dict[str, Any], principal: str = OWNER) -> UpdateMessage:
    return UpdateMessage(taskId=task_id, inputResponses=responses, principal=principal)


def cancel(task_id: str, principal: str = OWNER) -> CancelMessage:
    return CancelMessage(taskId=task_id, principal=principal)


async def drained(js: Any, server: str) -> bool:
    """The server's queue is empty: nothing waiting, nothing delivered and unacked."""
    try:
        info = await js.consumer_info(CONTROL_STREAM, server)
    except NotFoundError:
        return False  # the bridge has not created its durable consumer yet
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def asking(bridge: TaskBridge, *keys: str) -> str:
    """A task of OWNER's, input_required with one elicitation per key."""
    record = await bridge.create(owner=OWNER)
    await bridge.require_input(record.task_id, {key: ELICIT for key in keys})
    return record.task_id


async def stored(bridge: TaskBridge, task_id: str) -> TaskRecord:
    record = await bridge.get(task_id)
    assert record is not None
    return record


@pytest.fixture
async def bridge(nc: Client, js: Any, server_id: str, bucket: str) -> AsyncIterator[TaskBridge]:
    b = await TaskBridge.attach(nc, server_id, bucket=bucket, control=FAST)
    yield b
    await b.close()


# -- tasks/update -------------------------------------------------------------------------


async def test_only_outstanding_keys_reach_the_handler(bridge: TaskBridge, js: Any) -> None:
    tid = await asking(bridge, "a", "b")
    calls = listen(bridge)
    await send(js, bridge.server_id, update(tid, {"a": YES, "never-issued": NO}))
    stats = await until_settled(bridge, 1)
    assert stats.processed == 1
    assert calls.inputs == [(tid, {"a": YES})]
    task = (await stored(bridge, tid)).task
    assert task.status == "input_required"  # a partial answer (H50)
    assert task.inputRequests == {"b": ELICIT}  # only the rest is still outstanding


async def test_second_partial_answer_returns_the_task_to_working(
    bridge: TaskBridge, js: Any
) -> None:
    tid = await asking(bridge, "a", "b")
    calls = listen(bridge)
    await send(js, bridge.server_id, update(tid, {"a": YES}))
    await send(js, bridge.server_id, update(tid, {"b": NO}))
    await until_settled(bridge, 2)
    assert calls.inputs == [(tid, {"a": YES}), (tid, {"b": NO})]
    assert (await stored(bridge, tid)).task.status == "working"
    assert await drained(js, bridge.server_id)


async def test_a_duplicate_update_reaches_the_handler_once(bridge: TaskBridge, js: Any) -> None:
    tid = await asking(bridge, "a")
    calls = listen(bridge)
    for _ in range(2):  # a client retry: same keys, a new Msg-Id, so JetStream keeps both
        await send(js, bridge.server_id, update(tid, {"a": YES}))
    stats = await until_settled(bridge, 2)
    assert (stats.processed, stats.ignored) == (1, 1)
    assert calls.inputs == [(tid, {"a": YES})]


async def test_unknown_keys_alone_are_ignored(bridge: TaskBridge, js: Any) -> None:
    tid = await asking(bridge, "a")
    before = await stored(bridge, tid)
    calls = listen(bridge)
    await send(js, bridge.server_id, update(tid, {"stale": YES}))
    assert (await until_settled(bridge, 1)).ignored == 1
    assert calls.inputs == []
    assert await stored(bridge, tid) == before  # nothing written
    assert await drained(js, bridge.server_id)


@pytest.mark.parametrize("state", ["working", "completed", "unknown"])
async def test_update_for_a_task_not_waiting_is_ignored(
    bridge: TaskBridge, js: Any, state: str
) -> None:
    record = await bridge.create(owner=OWNER)
    tid = str(uuid.uuid4()) if state == "unknown" else record.task_id
    if state == "completed":
        await bridge.require_input(tid, {"a": ELICIT})
        await bridge.complete(tid, RESULT)
    calls = listen(bridge)
    await send(js, bridge.server_id, update(tid, {"a": YES}))
    assert (await until_settled(bridge, 1)).ignored == 1
    assert calls.inputs == []
    assert await drained(js, bridge.server_id)


async def test_a_principal_that_does_not_own_the_task_is_ignored(
    bridge: TaskBridge, js: Any
) -> None:
    tid = await asking(bridge, "a")
    calls = listen(bridge)
    await send(js, bridge.server_id, update(tid, {"a": YES}, "mallory"))
    await send(js, bridge.server_id, cancel(tid, "mallory"))
    assert (await until_settled(bridge, 2)).ignored == 2
    assert (calls.inputs, calls.cancels) == ([], [])
    assert (await stored(bridge, tid)).task.inputRequests == {"a": ELICIT}


async def test_a_message_for_another_servers_task_is_ignored(
    bridge: TaskBridge, nc: Client, js: Any, bucket: str
) -> None:
    other = await TaskBridge.attach(nc, "srv-elsewhere", bucket=bucket, control=FAST)
    foreign = await asking(other, "a")  # same bucket, owned by a different server id
    await other.close()
    calls = listen(bridge)
    await send(js, bridge.server_id, update(foreign, {"a": YES}))
    assert (await until_settled(bridge, 1)).ignored == 1
    assert calls.inputs == []


async def test_no_input_handler_acks_and_drops_updates(bridge: TaskBridge, js: Any) -> None:
    tid = await asking(bridge, "a")
    calls = Recorder()
    bridge.on_cancel(calls.on_cancel)  # only a cancel handler: consumption starts anyway
    await send(js, bridge.server_id, update(tid, {"a": YES}))
    assert (await until_settled(bridge, 1)).ignored == 1
    assert await drained(js, bridge.server_id)
    assert (await stored(bridge, tid)).task.status == "input_required"


# -- tasks/cancel -------------------------------------------------------------------------


async def test_cancel_reaches_the_handler_which_may_write_cancelled(
    bridge: TaskBridge, js: Any
) -> None:
    tid = await asking(bridge, "a")
    cancels: list[str] = []

    async def stop(task_id: str) -> None:
        cancels.append(task_id)
        await bridge.cancelled(task_id, status_message="stopped on request")

    bridge.on_cancel(stop)
    await send(js, bridge.server_id, cancel(tid))
    await send(js, bridge.server_id, cancel(tid))  # repeated: the task is terminal by then
    stats = await until_settled(bridge, 2)
    assert (stats.processed, stats.ignored) == (1, 1)
    assert cancels == [tid]
    assert (await stored(bridge, tid)).task.status == "cancelled"


async def test_cancel_of_a_terminal_task_is_ignored(bridge: TaskBridge, js: Any) -> None:
    record = await bridge.create(owner=OWNER)
    await bridge.complete(record.task_id, RESULT)
    calls = listen(bridge)
    await send(js, bridge.server_id, cancel(record.task_id))
    assert (await until_settled(bridge, 1)).ignored == 1
    assert calls.cancels == []


async def test_cancel_losing_a_race_to_completion_counts_as_done(
    bridge: TaskBridge, js: Any
) -> None:
    record = await bridge.create(owner=OWNER)

    async def too_late(task_id: str) -> None:
        await bridge.complete(task_id, RESULT)  # the work finished first
        await bridge.cancelled(task_id)  # raises TerminalStateError

    bridge.on_cancel(too_late)
    await send(js, bridge.server_id, cancel(record.task_id))
    stats = await until_settled(bridge, 1)
    assert (stats.processed, stats.retried) == (1, 0)
    assert (await stored(bridge, record.task_id)).task.status == "completed"


# -- durability: restarts, close, retries, dead letters --------------------------------------


async def test_messages_queued_while_down_are_delivered_once_on_return(
    nats_url: str, js: Any, server_id: str, bucket: str
) -> None:
    first = await TaskBridge.connect(nats_url, server_id, bucket=bucket, control=FAST)
    tid = await asking(first, "a")
    doomed = await asking(first, "b")
    listen(first)
    await eventually(lambda: drained(js, server_id))  # the durable consumer exists
    await first.close()

    await send(js, server_id, update(tid, {"a": YES}))
    await send(js, server_id, cancel(doomed))
    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket, control=FAST) as again:
        calls = listen(again)
        assert (await until_settled(again, 2)).processed == 2
        assert calls.inputs == [(tid, {"a": YES})]
        assert calls.cancels == [doomed]
        assert await drained(js, server_id)  # acked: never delivered again


async def test_close_lets_an_in_flight_handler_finish(
    nc: Client, js: Any, server_id: str, bucket: str
) -> None:
    bridge = await TaskBridge.attach(
        nc, server_id, bucket=bucket, control=ControlOptions(close_timeout=5.0)
    )
    tid = await asking(bridge, "a")
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(task_id: str, responses: dict[str, Any]) -> None:
        entered.set()
        await release.wait()

    bridge.on_input(slow)
    await send(js, server_id, update(tid, {"a": YES}))
    await asyncio.wait_for(entered.wait(), 5)
    closing = asyncio.create_task(bridge.close())
    release.set()
    await asyncio.wait_for(closing, 5)
    assert bridge.control_stats.processed == 1
    assert (await stored(bridge, tid)).task.status == "working"
    assert await drained(js, server_id)


async def test_close_before_ack_leaves_the_message_for_the_next_bridge(
    nats_url: str, js: Any, server_id: str, bucket: str
) -> None:
    first = await TaskBridge.connect(nats_url, server_id, bucket=bucket, control=FAST)
    tid = await asking(first, "a")
    entered = asyncio.Event()

    async def stuck(task_id: str, responses: dict[str, Any]) -> None:
        entered.set()
        await asyncio.Event().wait()  # never finishes: close() gives up on it

    first.on_input(stuck)
    await send(js, server_id, update(tid, {"a": YES}))
    await asyncio.wait_for(entered.wait(), 5)
    await first.close()
    assert settled(first.control_stats) == 0  # neither acked nor nak'd

    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket, control=FAST) as again:
        calls = listen(again)  # redelivered once ack_wait (0.5 s) has passed
        assert (await until_settled(again, 1)).processed == 1
        assert calls.inputs == [(tid, {"a": YES})]
        assert await drained(js, server_id)
        assert (await stored(again, tid)).task.status == "working"


async def test_a_slow_handler_keeps_its_message(
    bridge: TaskBridge, nats_url: str, js: Any, server_id: str, bucket: str
) -> None:
    tid = await asking(bridge, "a")
    calls: list[str] = []
    entered = asyncio.Event()

    async def slow(task_id: str, responses: dict[str, Any]) -> None:
        calls.append(task_id)
        entered.set()
        await asyncio.sleep(2.5 * FAST.ack_wait)  # the work itself, not synchronisation

    bridge.on_input(slow)
    await send(js, server_id, update(tid, {"a": YES}))
    await asyncio.wait_for(entered.wait(), 5)
    # A second consumer of the same durable gets the message if its ack_wait lapses.
    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket, control=FAST) as peer:
        peer_calls = listen(peer)
        assert (await until_settled(bridge, 1)).processed == 1
        assert await drained(js, server_id)
        assert calls == [tid]
        assert peer_calls.inputs == [] and settled(peer.control_stats) == 0


async def test_a_failing_handler_is_retried_until_it_succeeds(bridge: TaskBridge, js: Any) -> None:
    tid = await asking(bridge, "a")
    calls = listen(bridge)
    calls.fail = 1
    await send(js, bridge.server_id, update(tid, {"a": YES}))
    stats = await until_settled(bridge, 1)
    assert (stats.retried, stats.processed) == (1, 1)
    assert calls.inputs == [(tid, {"a": YES})] * 2
    assert (await stored(bridge, tid)).task.status == "working"


async def test_an_always_failing_handler_makes_a_dead_letter(
    bridge: TaskBridge, js: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tid = await asking(bridge, "a")
    calls = listen(bridge)
    calls.fail = 1_000
    with caplog.at_level(logging.ERROR, logger="bridge.control"):
        await send(js, bridge.server_id, update(tid, {"a": YES}))
        stats = await until_settled(bridge, 1)
    assert (stats.dead_letters, stats.retried, stats.processed) == (1, 2, 0)
    assert len(calls.inputs) == FAST.max_deliveries
    assert any(tid in r.getMessage() and "update" in r.getMessage() for r in caplog.records)
    await eventually(lambda: drained(js, bridge.server_id))  # termed: never redelivered
    assert (await stored(bridge, tid)).task.inputRequests == {"a": ELICIT}  # not answered

    calls.fail = 0  # the queue moves on: a later message is handled normally
    await send(js, bridge.server_id, update(tid, {"a": NO}))
    assert (await until_settled(bridge, 2)).processed == 1
    assert len(calls.inputs) == FAST.max_deliveries + 1


async def test_a_failed_answer_write_does_not_call_the_handler_again(
    bridge: TaskBridge, js: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = await asking(bridge, "a")
    calls = listen(bridge)
    real_answer = bridge.answer
    failures = [ConnectionError("NATS away")]

    async def flaky_answer(task_id: str, keys: Any) -> TaskRecord:
        if failures:
            raise failures.pop()
        return await real_answer(task_id, keys)

    monkeypatch.setattr(bridge, "answer", flaky_answer)
    await send(js, bridge.server_id, update(tid, {"a": YES}))
    stats = await until_settled(bridge, 1)
    assert (stats.retried, stats.processed) == (1, 1)
    assert calls.inputs == [(tid, {"a": YES})]  # once, though the message came twice
    assert (await stored(bridge, tid)).task.status == "working"


@pytest.mark.parametrize(
    "data",
    [b"not json", b'{"op":"explode","taskId":"x"}', b'{"op":"update","taskId":"x"}'],
    ids=["not-json", "unknown-op", "missing-field"],
)
async def test_a_malformed_message_is_termed_and_counted(
    bridge: TaskBridge, js: Any, data: bytes
) -> None:
    tid = await asking(bridge, "a")
    calls = listen(bridge)
    await send(js, bridge.server_id, data)
    await send(js, bridge.server_id, update(tid, {"a": YES}))
    stats = await until_settled(bridge, 2)
    assert (stats.malformed, stats.processed) == (1, 1)
    assert calls.inputs == [(tid, {"a": YES})]
    assert await drained(js, bridge.server_id)


async def test_servers_never_see_each_others_messages(
    bridge: TaskBridge, nc: Client, js: Any, bucket: str
) -> None:
    other = await TaskBridge.attach(nc, f"{bridge.server_id}-b", bucket=bucket, control=FAST)
    try:
        mine, theirs = await asking(bridge, "a"), await asking(other, "a")
        my_calls, their_calls = listen(bridge), listen(other)
        await send(js, other.server_id, update(theirs, {"a": NO}))
        await send(js, bridge.server_id, update(mine, {"a": YES}))
        await send(js, other.server_id, cancel(theirs))
        assert (await until_settled(bridge, 1)).processed == 1
        assert (await until_settled(other, 2)).processed == 2
        assert (my_calls.inputs, my_calls.cancels) == ([(mine, {"a": YES})], [])
        assert (their_calls.inputs, their_calls.cancels) == ([(theirs, {"a": NO})], [theirs])
    finally:
        await other.close()


async def test_consumption_survives_a_nats_restart(tmp_path: Path) -> None:
    server = NatsServerProcess(tmp_path / "nats")
    server.start()
    nc = await nats.connect(server.url, reconnect_time_wait=0.05, max_reconnect_attempts=-1)
    # A pull request dies with the server; the next long poll (0.5 s here) replaces it.
    options = dataclasses.replace(FAST, fetch_timeout=0.5)
    bridge = await TaskBridge.attach(nc, "srv-restart", bucket="restart", control=options)
    try:
        tid = await asking(bridge, "a")
        calls = listen(bridge)
        js = nc.jetstream()
        await eventually(lambda: drained(js, "srv-restart"))
        server.stop()
        server.start()  # same port, same store

        async def published() -> bool:
            try:
                data = encode(update(tid, {"a": YES}))
                await js.publish(control_subject("srv-restart"), data, timeout=0.5)
            except Exception:
                return False  # still reconnecting, or JetStream not ready yet
            return True

        await eventually(published, timeout=5)
        assert (await until_settled(bridge, 1)).processed == 1
        assert calls.inputs == [(tid, {"a": YES})]
    finally:
        await bridge.close()
        await nc.close()
        server.stop()


# -- the pure parts -------------------------------------------------------------------------


def _record(status: str = "input_required", owner: str = OWNER) -> TaskRecord:
    task = states.new_task(
        "t" * 16, datetime.now(UTC), ttl_ms=None, poll_interval_ms=None, status_message=None
    )
    if status == "input_required":
        task = states.to_input_required(
            task, {"a": ELICIT, "b": ELICIT}, datetime.now(UTC), issued_keys=frozenset()
        )
    elif status == "cancelled":
        task = states.to_cancelled(task, datetime.now(UTC))
    return TaskRecord(task.taskId, 1, owner, "srv-1", task)


def test_refusal_reasons() -> None:
    asked = _record()
    assert refusal(asked, update("t" * 16, {"a": YES}), "srv-1") is None
    assert refusal(asked, cancel("t" * 16), "srv-1") is None
    assert refusal(None, cancel("t" * 16), "srv-1") == "unknown task"
    assert "server" in (refusal(asked, cancel("t" * 16), "srv-2") or "")
    assert "principal" in (refusal(asked, cancel("t" * 16, "bob"), "srv-1") or "")
    assert refusal(_record("cancelled"), cancel("t" * 16), "srv-1") == "task is cancelled"
    assert "input_required" in (refusal(_record("working"), update("t" * 16, {}), "srv-1") or "")
    assert "outstanding" in (refusal(asked, update("t" * 16, {"z": YES}), "srv-1") or "")


def test_outstanding_keeps_only_waiting_keys() -> None:
    message = update("t" * 16, {"a": YES, "z": NO})
    assert outstanding(_record(), message) == {"a": YES}
    assert outstanding(_record("working"), message) == {}


@pytest.mark.parametrize(
    "bad",
    [
        {"backoff": ()},
        {"backoff": (-1.0,)},
        {"max_deliveries": 0},
        {"ack_wait": 0},
        {"fetch_timeout": -1},
        {"close_timeout": -1},
    ],
)
def test_options_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ControlOptions(**bad)
