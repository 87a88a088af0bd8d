"""Bridge writes, hub serves: every status round-trips through `tasks/get` and listen frames."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from bridge import TaskBridge, TaskRecord
from tests.helpers import SUB_KEY, HubHarness

ELICIT = {
    "confirm": {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Proceed?",
            "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        },
    }
}


@pytest.fixture
async def bridge(nc: Any, server_id: str, bucket: str) -> AsyncIterator[TaskBridge]:
    async with await TaskBridge.attach(nc, server_id, bucket=bucket) as b:
        yield b


def written(record: TaskRecord) -> dict[str, Any]:
    return msgspec.to_builtins(record.task)  # type: ignore[no-any-return]


async def served(hub: HubHarness, task_id: str) -> dict[str, Any]:
    result = dict((await hub.get_task(task_id)).json()["result"])
    assert result.pop("resultType") == "complete"
    result.pop("_meta")
    return result


@pytest.mark.parametrize("ending", ["complete", "fail", "cancelled"])
async def test_bridge_states_reach_get_and_listen_unchanged(
    hub: HubHarness, bridge: TaskBridge, ending: str
) -> None:
    created = await bridge.create(owner="anonymous", ttl_ms=600_000, poll_interval_ms=500)
    tid = created.task_id
    assert await served(hub, tid) == written(created)  # right after create: never "not found"
    async with hub.listen([tid], id=3) as stream:
        await stream.next()
        records = [created]
        records.append(await bridge.working(tid, status_message="step 1 of 2"))
        records.append(await bridge.require_input(tid, ELICIT, status_message="need you"))
        records.append(await bridge.answer(tid, ["confirm"]))
        if ending == "complete":
            result = {"content": [{"type": "text", "text": "done"}], "isError": True}
            records.append(await bridge.complete(tid, result))
        elif ending == "fail":
            records.append(await bridge.fail(tid, {"code": -32000, "message": "tool crashed"}))
        else:
            records.append(await bridge.cancelled(tid))
        frames = []
        while not frames or frames[-1]["status"] not in ("completed", "failed", "cancelled"):
            params = (await stream.next())["params"]
            assert params.pop("_meta") == {SUB_KEY: 3}
            frames.append(params)
        # Every frame is exactly one written state, in write order (coalescing may skip some).
        expected = [written(r) for r in records]
        positions = [expected.index(frame) for frame in frames]
        assert positions == sorted(positions) and positions[-1] == len(expected) - 1
        assert await served(hub, tid) == expected[-1]
    final = expected[-1]
    if ending == "complete":
        assert final["result"]["resultType"] == "complete" and final["result"]["isError"]
    if ending == "fail":
        assert final["statusMessage"] == "tool crashed"
