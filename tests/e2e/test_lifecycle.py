"""The whole task lifecycle through the hub: answers and cancels reach the owning server.

Races and restarts: a cancel racing a completion ends in exactly one terminal state that
every observer agrees on; an answer sent while the server is down arrives once when it
returns; repeated and unknown input keys never reach the tool twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from bridge import ControlOptions, TaskBridge, TerminalStateError
from tests.helpers import HubHarness, eventually, rpc, start_hub

FAST = ControlOptions(fetch_timeout=0.5, retry_pause=0.1, ack_wait=2.0, backoff=(0.05,))
TERMINAL = ("completed", "failed", "cancelled")
QUESTIONS = {
    key: {"method": "elicitation/create", "params": {"message": key, "requestedSchema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}}}}
    for key in ("first", "second")
}  # fmt: skip


def accept(*keys: str) -> dict[str, Any]:
    return {key: {"action": "accept", "content": {"ok": True}} for key in keys}


async def status_at(hub: HubHarness, task_id: str) -> str:
    return str((await hub.get_task(task_id)).json()["result"]["status"])


async def test_cancel_racing_completion_ends_in_one_agreed_state(
    hub: HubHarness, nc: Any, bucket: str, server_id: str, nats_url: str, tmp_path: Path
) -> None:
    other = await start_hub(nats_url, bucket, tmp_path / "other")
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket, control=FAST)

    async def cancel_handler(task_id: str) -> None:
        with contextlib.suppress(TerminalStateError):  # the completion may have won
            await bridge.cancelled(task_id, status_message="cancelled by request")

    bridge.on_cancel(cancel_handler)
    outcomes: set[str] = set()
    try:
        for round_ in range(10):
            task = await bridge.create(owner="anonymous")
            tid = task.task_id
            async with hub.listen([tid], id=round_) as stream:
                await stream.next()
                await stream.next()  # the working state
                cancel = hub.call(rpc("tasks/cancel", {"taskId": tid}, id=round_))
                complete = bridge.complete(tid, {"content": [{"type": "text", "text": "done"}]})
                answer, completed = await asyncio.gather(cancel, complete, return_exceptions=True)
                assert answer.status_code == 200  # type: ignore[union-attr]
                assert isinstance(completed, TerminalStateError) or completed.task.status == (
                    "completed"
                )
                terminal = await stream.until(lambda m: m["params"]["status"] in TERMINAL)
                final = terminal["params"]["status"]
                outcomes.add(final)
                # Nothing after a terminal state; both replicas agree on it.
                with pytest.raises(TimeoutError):
                    await stream.next(timeout=0.2)
            assert await status_at(hub, tid) == final
            assert await status_at(other, tid) == final
            stored = await bridge.get(tid)
            assert stored is not None and stored.task.status == final
    finally:
        await bridge.close()
        await other.stop()
    assert outcomes <= {"completed", "cancelled"}


async def test_an_answer_sent_while_the_server_is_down_arrives_once(
    hub: HubHarness, nats_url: str, bucket: str, server_id: str
) -> None:
    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket) as first:
        task = await first.create(owner="anonymous")
        await first.require_input(task.task_id, QUESTIONS)
    tid = task.task_id
    # The server is down: the hub still takes the answer, durably.
    body = rpc("tasks/update", {"taskId": tid, "inputResponses": accept("first")}, id="u1")
    assert (await hub.call(body)).json()["result"]["resultType"] == "complete"
    repeat = {**body, "id": "u2"}  # the client repeats itself
    assert (await hub.call(repeat)).status_code == 200
    unknown = rpc("tasks/update", {"taskId": tid, "inputResponses": accept("never-asked")}, id=3)
    assert (await hub.call(unknown)).status_code == 200

    received: list[dict[str, Any]] = []
    handled = asyncio.Event()

    async def on_input(task_id: str, responses: dict[str, Any]) -> None:
        received.append(responses)
        handled.set()

    async with await TaskBridge.connect(
        nats_url, server_id, bucket=bucket, control=FAST
    ) as restarted:
        restarted.on_input(on_input)
        async with asyncio.timeout(10):
            await handled.wait()
        # All three queued messages are processed; only the first one had news.

        def settled() -> bool:
            stats = restarted.control_stats  # a snapshot each time
            return stats.processed + stats.ignored >= 3

        await eventually(settled)
        assert received == [accept("first")]
        state = await restarted.get(tid)
        assert state is not None and state.task.status == "input_required"
        assert set(state.task.inputRequests) == {"second"}  # type: ignore[arg-type]

        # The rest of the answer returns the task to working.
        body = rpc("tasks/update", {"taskId": tid, "inputResponses": accept("second")}, id=4)
        assert (await hub.call(body)).status_code == 200
        await eventually(lambda: len(received) == 2)
        assert received[1] == accept("second")

        async def working() -> bool:
            return await status_at(hub, tid) == "working"

        await eventually(working)
