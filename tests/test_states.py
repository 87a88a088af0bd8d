"""bridge/states.py: every edge of the state machine, every payload rule, no NATS."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from bridge import states
from bridge.states import (
    BridgeEnvelope,
    IllegalTransition,
    InputKeyReused,
    InvalidPayload,
    TerminalStateError,
)
from bridge.wire import TERMINAL, DetailedTask, TaskError, check_task, decode_envelope, encode

NOW = datetime(2026, 11, 30, 23, 4, 7, 123456, tzinfo=UTC)
LATER = NOW + timedelta(seconds=5)
TASK_ID = "0f0e0d0c-0b0a-4909-8807-060504030201"
STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
ELICIT: dict[str, Any] = {
    "method": "elicitation/create",
    "params": {"message": "Name?", "requestedSchema": {"type": "object", "properties": {}}},
}
SAMPLE: dict[str, Any] = {
    "method": "sampling/createMessage",
    "params": {"messages": [], "maxTokens": 10},
}
RESULT: dict[str, Any] = {"content": [{"type": "text", "text": "done"}], "isError": False}
ERROR = {"code": -32603, "message": "boom"}

# docs/protocol.md#status-transitions, self-loops included; nothing leaves a terminal state.
LEGAL = {
    ("working", "working"),
    ("working", "input_required"),
    ("working", "completed"),
    ("working", "failed"),
    ("working", "cancelled"),
    ("input_required", "working"),
    ("input_required", "input_required"),
    ("input_required", "completed"),
    ("input_required", "failed"),
    ("input_required", "cancelled"),
}


def checked(task: DetailedTask) -> DetailedTask:
    """Every task the state machine produces must be a valid wire task."""
    check_task(task)
    return task


def seed(**kwargs: Any) -> DetailedTask:
    options: dict[str, Any] = {"ttl_ms": 60_000, "poll_interval_ms": 2_000, "status_message": None}
    options.update(kwargs)
    return checked(states.new_task(TASK_ID, NOW, **options))


def in_status(status: str) -> DetailedTask:
    """A task in `status`, reached by legal steps from the seed."""
    task = seed(status_message="started")
    if status == "working":
        return task
    if status == "input_required":
        return states.to_input_required(task, {"k0": ELICIT}, NOW, issued_keys=frozenset())
    return TARGETS[status](task)


TARGETS: dict[str, Callable[[DetailedTask], DetailedTask]] = {
    "working": lambda t: states.to_working(t, LATER),
    "input_required": lambda t: states.to_input_required(
        t, {"fresh": ELICIT}, LATER, issued_keys=frozenset({"k0"})
    ),
    "completed": lambda t: states.to_completed(t, RESULT, LATER),
    "failed": lambda t: states.to_failed(t, ERROR, LATER),
    "cancelled": lambda t: states.to_cancelled(t, LATER),
}
VARIANT = {"input_required": "inputRequests", "completed": "result", "failed": "error"}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(STATUSES, STATUSES)))
def test_transition_table(source: str, target: str) -> None:
    task = in_status(source)
    if (source, target) not in LEGAL:
        error = TerminalStateError if source in TERMINAL else IllegalTransition
        with pytest.raises(error):
            TARGETS[target](task)
        return
    after = checked(TARGETS[target](task))
    assert after.status == target
    assert after.taskId == task.taskId
    assert after.createdAt == task.createdAt
    assert after.lastUpdatedAt == states.format_timestamp(LATER)
    assert (after.ttlMs, after.pollIntervalMs) == (60_000, 2_000)
    for field in ("inputRequests", "result", "error"):
        assert (getattr(after, field) is not UNSET) == (VARIANT.get(target) == field)


def test_every_exit_from_a_terminal_state_is_refused() -> None:
    for source in TERMINAL:
        task = in_status(source)
        for target in STATUSES:
            with pytest.raises(TerminalStateError):
                TARGETS[target](task)
        assert states.answer(task, ["k0"], LATER) is task


def test_error_hierarchy() -> None:
    assert issubclass(TerminalStateError, IllegalTransition)
    assert issubclass(IllegalTransition, ValueError)
    assert issubclass(InputKeyReused, InvalidPayload)
    assert issubclass(InvalidPayload, ValueError)


# -- timestamps and the seed -------------------------------------------------------------


def test_format_timestamp_is_utc_milliseconds_with_z() -> None:
    assert states.format_timestamp(NOW) == "2026-11-30T23:04:07.123Z"
    plus_two = timezone(timedelta(hours=2))
    assert states.format_timestamp(datetime(2026, 1, 1, 2, 0, tzinfo=plus_two)) == (
        "2026-01-01T00:00:00.000Z"
    )
    stamp = states.format_timestamp(NOW)
    assert stamp.endswith("Z")
    assert datetime.fromisoformat(stamp) == NOW.replace(microsecond=123000)


def test_format_timestamp_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError):
        states.format_timestamp(datetime(2026, 1, 1))


def test_new_task_is_working_with_equal_timestamps() -> None:
    task = seed(status_message="queued")
    assert task.status == "working"
    assert task.createdAt == task.lastUpdatedAt == "2026-11-30T23:04:07.123Z"
    assert (task.ttlMs, task.pollIntervalMs, task.statusMessage) == (60_000, 2_000, "queued")


def test_new_task_omits_unset_optionals_but_always_has_ttl() -> None:
    task = seed(ttl_ms=None, poll_interval_ms=None)
    raw = msgspec.json.decode(encode(task))
    assert raw["ttlMs"] is None
    assert "pollIntervalMs" not in raw and "statusMessage" not in raw


@pytest.mark.parametrize("field", ["ttl_ms", "poll_interval_ms"])
@pytest.mark.parametrize("value", [-1, 2**53])
def test_new_task_refuses_out_of_range_durations(field: str, value: int) -> None:
    with pytest.raises(ValueError):
        seed(**{field: value})


# -- completed ---------------------------------------------------------------------------


def test_completed_adds_result_type() -> None:
    result: dict[str, Any] = {"content": []}
    task = checked(states.to_completed(seed(), result, LATER))
    assert task.result == {"resultType": "complete", "content": []}
    assert result == {"content": []}  # the caller's dict is left alone


def test_completed_keeps_an_existing_result_type() -> None:
    task = states.to_completed(seed(), {"resultType": "custom", "x": 1}, LATER)
    assert task.result == {"resultType": "custom", "x": 1}


def test_tool_error_result_is_completed_not_failed() -> None:
    result = {"content": [{"type": "text", "text": "nope"}], "isError": True}
    task = checked(states.to_completed(seed(), result, LATER))
    assert task.status == "completed"
    assert task.result is not UNSET and task.result["isError"] is True


@pytest.mark.parametrize("bad", [None, [], "done", 3])
def test_completed_needs_a_result_object(bad: Any) -> None:
    with pytest.raises(InvalidPayload):
        states.to_completed(seed(), bad, LATER)


# -- failed ------------------------------------------------------------------------------


def test_failed_defaults_status_message_to_the_error_message() -> None:
    task = checked(states.to_failed(seed(status_message="running"), ERROR, LATER))
    assert task.error == TaskError(code=-32603, message="boom")
    assert task.statusMessage == "boom"


def test_failed_keeps_an_explicit_status_message_and_error_data() -> None:
    error = TaskError(code=-32000, message="upstream", data={"retry": True})
    task = checked(states.to_failed(seed(), error, LATER, status_message="gave up"))
    assert task.statusMessage == "gave up"
    assert task.error is not UNSET and task.error.data == {"retry": True}


@pytest.mark.parametrize(
    "bad",
    [
        None,
        {},
        {"message": "no code"},
        {"code": -1},
        {"code": "1", "message": "m"},
        {"code": True, "message": "m"},
        {"code": 1.5, "message": "m"},
        "boom",
    ],
)
def test_failed_needs_a_json_rpc_error(bad: Any) -> None:
    with pytest.raises(InvalidPayload):
        states.to_failed(seed(), bad, LATER)


# -- input_required ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {},
        None,
        ["k"],
        {"k": "elicitation/create"},
        {"k": {"method": "tools/call", "params": {}}},
        {"k": {"params": {}}},
        {"k": {"method": "elicitation/create"}},
        {"k": {"method": "sampling/createMessage", "params": []}},
        {"k": {"method": "roots/list", "params": "x"}},
        {"": ELICIT},
        {1: ELICIT},
    ],
)
def test_input_requests_are_validated(bad: Any) -> None:
    with pytest.raises(InvalidPayload):
        states.to_input_required(seed(), bad, LATER, issued_keys=frozenset())


def test_all_three_input_methods_are_accepted() -> None:
    requests: dict[str, dict[str, Any]] = {"a": ELICIT, "b": SAMPLE, "c": {"method": "roots/list"}}
    task = checked(states.to_input_required(seed(), requests, LATER, issued_keys=frozenset()))
    assert task.inputRequests == requests


def test_new_requests_join_the_outstanding_ones() -> None:
    first = states.to_input_required(seed(), {"a": ELICIT}, NOW, issued_keys=frozenset())
    both = states.to_input_required(first, {"b": SAMPLE}, LATER, issued_keys=frozenset({"a"}))
    assert both.inputRequests == {"a": ELICIT, "b": SAMPLE}


def test_repeating_an_outstanding_request_unchanged_is_idempotent() -> None:
    first = states.to_input_required(seed(), {"a": ELICIT}, NOW, issued_keys=frozenset())
    again = states.to_input_required(first, {"a": ELICIT}, LATER, issued_keys=frozenset({"a"}))
    assert again.inputRequests == {"a": ELICIT}


def test_an_outstanding_key_cannot_point_to_another_request() -> None:
    first = states.to_input_required(seed(), {"a": ELICIT}, NOW, issued_keys=frozenset())
    with pytest.raises(InputKeyReused):
        states.to_input_required(first, {"a": SAMPLE}, LATER, issued_keys=frozenset({"a"}))


def test_input_keys_are_unique_over_the_whole_life_of_the_task() -> None:
    envelope = BridgeEnvelope(owner="alice", server="srv", task=seed())

    def step(task: DetailedTask) -> None:
        nonlocal envelope
        envelope = states.with_task(envelope, checked(task))

    def issued() -> frozenset[str]:
        return frozenset(envelope.issuedInputKeys)

    step(states.to_input_required(envelope.task, {"a": ELICIT}, NOW, issued_keys=issued()))
    step(states.answer(envelope.task, ["a"], NOW))
    assert envelope.task.status == "working"
    step(states.to_working(envelope.task, LATER, status_message="thinking"))
    with pytest.raises(InputKeyReused):
        states.to_input_required(envelope.task, {"a": ELICIT}, LATER, issued_keys=issued())
    step(states.to_input_required(envelope.task, {"b": SAMPLE}, LATER, issued_keys=issued()))
    assert envelope.issuedInputKeys == ["a", "b"]


def test_with_task_remembers_keys_once_in_issue_order() -> None:
    envelope = BridgeEnvelope(owner="o", server="s", task=seed(), issuedInputKeys=["z"])
    task = states.to_input_required(
        seed(), {"b": ELICIT, "z": SAMPLE}, NOW, issued_keys=frozenset()
    )
    after = states.with_task(envelope, task)
    assert after.issuedInputKeys == ["z", "b"]
    assert envelope.issuedInputKeys == ["z"]
    assert (after.owner, after.server, after.task) == ("o", "s", task)


# -- answer ------------------------------------------------------------------------------


def asking(*keys: str) -> DetailedTask:
    requests = {key: ELICIT for key in keys}
    return checked(
        states.to_input_required(
            seed(), requests, NOW, issued_keys=frozenset(), status_message="need input"
        )
    )


def test_partial_answer_stays_input_required() -> None:
    task = checked(states.answer(asking("a", "b", "c"), ["a", "c"], LATER))
    assert task.status == "input_required"
    assert task.inputRequests == {"b": ELICIT}
    assert task.statusMessage == "need input"
    assert task.lastUpdatedAt == states.format_timestamp(LATER)


def test_full_answer_goes_back_to_working() -> None:
    task = checked(states.answer(asking("a", "b"), ["b", "a"], LATER))
    assert task.status == "working"
    assert task.inputRequests is UNSET
    assert task.statusMessage is UNSET  # it described the input request


def test_keys_not_outstanding_are_ignored() -> None:
    task = asking("a")
    assert states.answer(task, ["nope", "also-not"], LATER) is task
    mixed = states.answer(task, ["nope", "a"], LATER)
    assert mixed.status == "working"


def test_answer_on_a_task_not_waiting_for_input_changes_nothing() -> None:
    for status in ("working", "completed", "failed", "cancelled"):
        task = in_status(status)
        assert states.answer(task, ["k0"], LATER) is task


def test_answer_refuses_a_bare_string() -> None:
    with pytest.raises(TypeError):
        states.answer(asking("ab"), "ab", LATER)


# -- statusMessage -----------------------------------------------------------------------


def test_status_message_is_kept_within_a_status_and_cleared_on_change() -> None:
    task = seed(status_message="step 1")
    assert states.to_working(task, LATER).statusMessage == "step 1"
    assert states.to_working(task, LATER, status_message="step 2").statusMessage == "step 2"
    assert states.to_completed(task, RESULT, LATER).statusMessage is UNSET
    done = states.to_completed(task, RESULT, LATER, status_message="all done")
    assert done.statusMessage == "all done"


# -- a random walk: the invariants hold whatever the order of calls ----------------------

OPS = ("work", "ask", "answer", "complete", "fail", "cancel")


@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 3)), max_size=25))
def test_random_walks_keep_every_invariant(ops: list[tuple[str, int]]) -> None:
    envelope = BridgeEnvelope(owner="o", server="s", task=seed())
    counter = itertools.count()
    for op, n in ops:
        task = envelope.task
        issued = frozenset(envelope.issuedInputKeys)
        try:
            if op == "work":
                after = states.to_working(task, LATER)
            elif op == "ask":
                fresh = {f"k{next(counter)}": ELICIT for _ in range(n + 1)}
                after = states.to_input_required(task, fresh, LATER, issued_keys=issued)
            elif op == "answer":
                after = states.answer(task, [f"k{i}" for i in range(n * 2)], LATER)
            elif op == "complete":
                after = states.to_completed(task, RESULT, LATER)
            elif op == "fail":
                after = states.to_failed(task, ERROR, LATER)
            else:
                after = states.to_cancelled(task, LATER)
        except TerminalStateError:
            assert task.status in TERMINAL
            continue
        assert task.status not in TERMINAL or after is task
        new = states.with_task(envelope, checked(after))
        assert len(new.issuedInputKeys) == len(set(new.issuedInputKeys))
        # the hub's own decoder accepts what the bridge would store
        assert decode_envelope(TASK_ID, encode(new)).task == after
        envelope = new
