"""bridge/bridge.py against a real nats-server: durability, CAS, TTL, what the hub reads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError

from bridge import (
    CreateOutcomeUnknown,
    InputKeyReused,
    InvalidPayload,
    TaskBridge,
    TaskExpired,
    TaskNotFound,
    TaskRecord,
    TerminalStateError,
)
from bridge.publisher import AckedPublisher
from bridge.states import new_task
from bridge.task_store import MAX_MESSAGE_TTL_S, message_ttl
from bridge.wire import TaskError, decode_envelope, kv_stream, kv_subject

ELICIT: dict[str, Any] = {
    "method": "elicitation/create",
    "params": {"message": "OK?", "requestedSchema": {}},
}
RESULT: dict[str, Any] = {"content": [{"type": "text", "text": "done"}], "isError": False}
ERROR: dict[str, Any] = {"code": -32603, "message": "boom"}


class FakeClock:
    """A clock the test moves by hand, so expiry needs no waiting."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
async def bridge(nc: Client, js: Any, server_id: str, bucket: str) -> AsyncIterator[TaskBridge]:
    b = await TaskBridge.attach(nc, server_id, bucket=bucket)
    yield b
    await b.close()


@pytest.fixture
async def other(nats_url: str, js: Any, server_id: str, bucket: str) -> AsyncIterator[TaskBridge]:
    """A second bridge on its own connection: another replica of the same server."""
    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket) as b:
        yield b


async def raw(js: Any, bucket: str, task_id: str) -> Any:
    return await js.get_msg(kv_stream(bucket), subject=kv_subject(bucket, task_id))


# -- create and read back ----------------------------------------------------------------


async def test_create_is_read_back_identically(bridge: TaskBridge, other: TaskBridge) -> None:
    record = await bridge.create(owner="alice", poll_interval_ms=2_000, status_message="queued")
    assert record.task.status == "working"
    assert (record.owner, record.server) == ("alice", bridge.server_id)
    assert await bridge.get(record.task_id) == record
    assert await other.get(record.task_id) == record  # nothing cached there


async def test_stored_value_is_the_contract_3_envelope(
    bridge: TaskBridge, js: Any, bucket: str
) -> None:
    record = await bridge.create(owner="user:42", ttl_ms=None)
    msg = await raw(js, bucket, record.task_id)
    assert msg.seq == record.revision
    envelope = decode_envelope(record.task_id, msg.data)
    assert (envelope.owner, envelope.server) == ("user:42", bridge.server_id)
    assert envelope.task == record.task
    as_json = msgspec.json.decode(msg.data)
    assert list(as_json)[:3] == ["owner", "server", "task"]
    assert as_json["task"]["ttlMs"] is None
    assert "Nats-TTL" not in (msg.headers or {})
    assert len(record.task_id) == 36  # a uuid4


async def test_owner_must_be_a_non_empty_string(bridge: TaskBridge) -> None:
    with pytest.raises(ValueError):
        await bridge.create(owner="")


# -- each status round-trips --------------------------------------------------------------


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
async def test_every_status_round_trips(bridge: TaskBridge, other: TaskBridge, ending: str) -> None:
    record = await bridge.create(owner="alice", ttl_ms=600_000)
    steps: list[Callable[[], Awaitable[TaskRecord]]] = [
        lambda: bridge.working(record.task_id, status_message="step 2 of 5"),
        lambda: bridge.require_input(record.task_id, {"a": ELICIT, "b": ELICIT}),
        lambda: bridge.answer(record.task_id, ["a"]),
        lambda: bridge.answer(record.task_id, ["b"]),
        lambda: bridge.require_input(record.task_id, {"c": ELICIT}),
    ]
    endings: dict[str, Callable[[], Awaitable[TaskRecord]]] = {
        "completed": lambda: bridge.complete(record.task_id, RESULT),
        "failed": lambda: bridge.fail(record.task_id, ERROR),
        "cancelled": lambda: bridge.cancelled(record.task_id, status_message="stopped"),
    }
    seen = ["working"]
    revision = record.revision
    for make in [*steps, endings[ending]]:
        written = await make()
        assert written.revision > revision
        revision = written.revision
        assert await other.get(record.task_id) == written
        seen.append(written.task.status)
    live = ["working", "working", "input_required", "input_required", "working", "input_required"]
    assert seen == [*live, ending]
    stored = await other.get(record.task_id)
    assert stored is not None
    if ending == "completed":
        assert stored.task.result == {"resultType": "complete", **RESULT}
    if ending == "failed":
        assert stored.task.error == TaskError(code=-32603, message="boom")
        assert stored.task.statusMessage == "boom"


async def test_answer_with_nothing_outstanding_writes_nothing(bridge: TaskBridge) -> None:
    record = await bridge.create(owner="alice")
    asked = await bridge.require_input(record.task_id, {"a": ELICIT})
    same = await bridge.answer(record.task_id, ["not-issued"])
    assert same == asked
    assert await bridge.get(record.task_id) == asked


# -- refusals leave the stored value alone -----------------------------------------------


async def test_terminal_state_is_final_and_unchanged(bridge: TaskBridge) -> None:
    record = await bridge.create(owner="alice")
    done = await bridge.complete(record.task_id, RESULT)
    for attempt in (
        bridge.fail(record.task_id, ERROR),
        bridge.working(record.task_id),
        bridge.require_input(record.task_id, {"a": ELICIT}),
        bridge.cancelled(record.task_id),
        bridge.complete(record.task_id, RESULT),
    ):
        with pytest.raises(TerminalStateError):
            await attempt
    assert await bridge.get(record.task_id) == done


async def test_bad_payloads_are_refused_before_any_write(bridge: TaskBridge) -> None:
    record = await bridge.create(owner="alice")
    asked = await bridge.require_input(record.task_id, {"a": ELICIT})
    with pytest.raises(InvalidPayload):
        await bridge.require_input(record.task_id, {"b": {"method": "tools/call"}})
    with pytest.raises(InvalidPayload):
        await bridge.fail(record.task_id, {"message": "no code"})
    with pytest.raises(InputKeyReused):
        await bridge.require_input(record.task_id, {"a": {"method": "roots/list"}})
    assert await bridge.get(record.task_id) == asked


# -- concurrent writers ------------------------------------------------------------------


async def test_racing_terminal_writes_have_exactly_one_winner(
    bridge: TaskBridge, other: TaskBridge
) -> None:
    for _ in range(10):
        record = await bridge.create(owner="alice")
        assert await other.get(record.task_id) == record  # both now hold the same revision
        outcomes = await asyncio.gather(
            bridge.complete(record.task_id, RESULT),
            other.fail(record.task_id, ERROR),
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, TaskRecord)]
        losers = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(winners) == 1 and len(losers) == 1
        assert isinstance(losers[0], TerminalStateError)
        assert winners[0].revision == record.revision + 1
        assert await bridge.get(record.task_id) == winners[0]


async def test_concurrent_progress_updates_all_land(
    bridge: TaskBridge, other: TaskBridge, nats_url: str, server_id: str, bucket: str
) -> None:
    record = await bridge.create(owner="alice")
    async with (
        await TaskBridge.connect(nats_url, server_id, bucket=bucket) as third,
        await TaskBridge.connect(nats_url, server_id, bucket=bucket) as fourth,
    ):
        writers = [bridge, other, third, fourth]
        for w in writers:
            await w.get(record.task_id)
        written = await asyncio.gather(
            *(w.working(record.task_id, status_message=f"w{i}") for i, w in enumerate(writers))
        )
    revisions = sorted(r.revision for r in written)
    assert revisions == [record.revision + i for i in range(1, 5)]
    last = max(written, key=lambda r: r.revision)
    assert await bridge.get(record.task_id) == last


async def test_a_stale_bridge_rereads_and_succeeds(bridge: TaskBridge, other: TaskBridge) -> None:
    record = await bridge.create(owner="alice")
    moved = await other.working(record.task_id, status_message="from other")
    asked = await bridge.require_input(record.task_id, {"a": ELICIT})  # cache at record
    assert asked.revision == moved.revision + 1
    assert asked.task.inputRequests == {"a": ELICIT}
    assert await other.get(record.task_id) == asked


async def test_a_stale_bridge_sees_keys_issued_elsewhere(
    bridge: TaskBridge, other: TaskBridge
) -> None:
    record = await bridge.create(owner="alice")
    await other.require_input(record.task_id, {"a": ELICIT})
    done = await other.answer(record.task_id, ["a"])
    assert done.task.status == "working"
    with pytest.raises(InputKeyReused):
        await bridge.require_input(record.task_id, {"a": ELICIT})
    assert await bridge.get(record.task_id) == done


async def test_a_stale_bridge_answers_a_request_it_never_saw(
    bridge: TaskBridge, other: TaskBridge
) -> None:
    record = await bridge.create(owner="alice")
    asked = await other.require_input(record.task_id, {"q": ELICIT})
    answered = await bridge.answer(record.task_id, ["q"])  # its cache says working
    assert answered.revision == asked.revision + 1
    assert answered.task.status == "working"


async def test_a_stale_bridge_cannot_overwrite_a_terminal_state(
    bridge: TaskBridge, other: TaskBridge
) -> None:
    record = await bridge.create(owner="alice")
    done = await other.cancelled(record.task_id)
    with pytest.raises(TerminalStateError):
        await bridge.working(record.task_id, status_message="still going")
    assert await bridge.get(record.task_id) == done


# -- TTL ---------------------------------------------------------------------------------


async def test_message_ttl_is_the_remaining_lifetime(
    nc: Client, js: Any, server_id: str, bucket: str
) -> None:
    clock = FakeClock()
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket, clock=clock)
    record = await bridge.create(owner="alice", ttl_ms=600_000)
    assert (await raw(js, bucket, record.task_id)).headers["Nats-TTL"] == "600"
    clock.advance(seconds=100.5)
    await bridge.working(record.task_id)
    assert (await raw(js, bucket, record.task_id)).headers["Nats-TTL"] == "500"  # rounded up
    clock.advance(seconds=499.4)
    await bridge.working(record.task_id)
    assert (await raw(js, bucket, record.task_id)).headers["Nats-TTL"] == "1"


async def test_writing_past_the_ttl_raises_task_expired(
    nc: Client, js: Any, server_id: str, bucket: str
) -> None:
    clock = FakeClock()
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket, clock=clock)
    record = await bridge.create(owner="alice", ttl_ms=60_000)
    clock.advance(seconds=60)
    with pytest.raises(TaskExpired):
        await bridge.complete(record.task_id, RESULT)
    assert await bridge.get(record.task_id) == record


async def test_a_short_lived_task_disappears(bridge: TaskBridge) -> None:
    record = await bridge.create(owner="alice", ttl_ms=1_000)
    deadline = time.monotonic() + 10
    while await bridge.get(record.task_id) is not None:
        assert time.monotonic() < deadline, "the task outlived its TTL by 9 s"
        await asyncio.sleep(0.05)  # polling interval, not synchronisation
    with pytest.raises(TaskNotFound):
        await bridge.working(record.task_id)


def test_message_ttl_rounds_up_and_caps() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def task(ttl_ms: int | None) -> Any:
        return new_task("x" * 16, now, ttl_ms=ttl_ms, poll_interval_ms=None, status_message=None)

    assert message_ttl(task(None), now) is None
    assert message_ttl(task(1_500), now) == 2
    assert message_ttl(task(1_500), now + timedelta(milliseconds=1_499)) == 1
    with pytest.raises(TaskExpired):
        message_ttl(task(1_500), now + timedelta(milliseconds=1_500))
    # a lifetime near 2^53 ms would overflow the server's clock arithmetic
    assert message_ttl(task(2**53 - 1), now) == MAX_MESSAGE_TTL_S


# -- missing tasks, bad ids, lifecycle ----------------------------------------------------


async def test_unknown_tasks_are_not_found(bridge: TaskBridge) -> None:
    for task_id in ("00000000-0000-4000-8000-000000000000", "bad.id", "*", ""):
        assert await bridge.get(task_id) is None
        for write in (
            bridge.working(task_id),
            bridge.require_input(task_id, {"a": ELICIT}),
            bridge.complete(task_id, RESULT),
            bridge.fail(task_id, ERROR),
            bridge.cancelled(task_id),
            bridge.answer(task_id, ["a"]),
        ):
            with pytest.raises(TaskNotFound):
                await write


@pytest.mark.parametrize("how", ["delete", "purge"])
async def test_deleted_or_purged_tasks_are_gone(
    bridge: TaskBridge, js: Any, bucket: str, how: str
) -> None:
    record = await bridge.create(owner="alice")
    kv = await js.key_value(bucket)
    await getattr(kv, how)(record.task_id)
    assert await bridge.get(record.task_id) is None
    with pytest.raises(TaskNotFound):
        await bridge.working(record.task_id)  # its cache is stale; the CAS catches it


@pytest.mark.parametrize("bad", ["", "has space", "dot.ted", "x" * 65])
async def test_invalid_server_id_is_refused(nc: Client, nats_url: str, bad: str) -> None:
    with pytest.raises(ValueError):
        await TaskBridge.attach(nc, bad)
    with pytest.raises(ValueError):
        await TaskBridge.connect(nats_url, bad)


async def test_the_bridge_creates_its_resources(
    nc: Client, nats_url: str, server_id: str, bucket: str
) -> None:
    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket) as bridge:
        record = await bridge.create(owner="alice", ttl_ms=5_000)
    info = await nc.jetstream().stream_info(kv_stream(bucket))
    assert info.config.allow_msg_ttl is True
    assert info.config.max_msgs_per_subject == 1
    assert bridge._nc.is_closed  # connect() owned its connection
    attached = await TaskBridge.attach(nc, server_id, bucket=bucket)
    assert await attached.get(record.task_id) == record
    await attached.close()
    assert nc.is_connected  # attach() only borrowed it


class AckLosingPublisher(AckedPublisher):
    """Stores the write (or not), then reports the timeout a lost ack would cause."""

    def __init__(self, nc: Client, *, lands: bool) -> None:
        super().__init__(nc, timeout=5)
        self.lands = lands

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        if self.lands:
            await super().publish(subject, payload, headers)
        raise NatsTimeoutError()


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "lost"])
async def test_a_create_whose_ack_is_lost_reports_what_was_stored(
    nc: Client, js: Any, server_id: str, bucket: str, lands: bool
) -> None:
    bridge = await TaskBridge.attach(nc, server_id, bucket=bucket)
    bridge._store.publisher = AckLosingPublisher(nc, lands=lands)
    try:
        if lands:  # stored: the caller gets the task, and has no reason to create another
            record = await bridge.create(owner="alice")
            stored = await js.get_msg(kv_stream(bucket), subject=kv_subject(bucket, record.task_id))
            assert stored.seq == record.revision
            assert decode_envelope(record.task_id, stored.data).owner == "alice"
        else:  # never acked: retried under the same id, then given up on, by that id
            with pytest.raises(CreateOutcomeUnknown) as caught:
                await bridge.create(owner="alice", deadline_s=0.3)
            assert "TimeoutError" in str(caught.value) and caught.value.task_id in str(caught.value)
            assert (await js.stream_info(kv_stream(bucket))).state.messages == 0
    finally:
        await bridge.close()  # the ack-losing publisher with it
