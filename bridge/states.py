"""The task state machine (docs/protocol.md#status-transitions) as pure functions.

No I/O and no clock: the caller passes `now`, so every rule is testable without NATS, and
whatever these functions return already passes `wire.check_task`. Terminal states are
final (`TerminalStateError`); input keys are unique over a task's whole life, which is
why the envelope remembers every key ever issued (`BridgeEnvelope.issuedInputKeys`).

statusMessage: replaced when a new one is given; kept while the status stays the same;
cleared when the status changes, since a message describes the status it was written for
(a `failed` task defaults it to the error message, H40).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from msgspec import UNSET

from bridge.wire import TERMINAL, DetailedTask, Envelope, Status, TaskError

INPUT_METHODS: frozenset[str] = frozenset(
    {"elicitation/create", "sampling/createMessage", "roots/list"}
)
_MAX_SAFE = 2**53 - 1

# The edges of docs/protocol.md#status-transitions, with the live states' self-loops (progress).
_LIVE: frozenset[str] = frozenset({"working", "input_required"})


class IllegalTransition(ValueError):
    """A status change the state machine forbids."""


class TerminalStateError(IllegalTransition):
    """The task is already completed, failed or cancelled; it never changes again."""


class InvalidPayload(ValueError):
    """inputRequests, result or error does not have the shape the spec requires."""


class InputKeyReused(InvalidPayload):
    """An inputRequests key that this task already issued once (H45)."""


class BridgeEnvelope(Envelope):
    """The KV value as the bridge writes it: contract 3's envelope plus its own memory.

    `issuedInputKeys` lists every inputRequests key ever issued for the task; readers that
    do not know the field ignore it (contract 3).
    """

    issuedInputKeys: list[str] = msgspec.field(default_factory=list)


def format_timestamp(dt: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and a trailing Z: 2026-11-30T23:04:07.123Z."""
    if dt.tzinfo is None:
        raise ValueError("timestamps need a time zone; pass an aware datetime")
    # isoformat is C, cheaper than the strftime route: every write formats a timestamp.
    return dt.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def _check_duration(name: str, value: int | None) -> None:
    if value is not None and not 0 <= value <= _MAX_SAFE:
        raise ValueError(f"{name} must be an integer in 0..2^53-1, got {value!r}")


def new_task(
    task_id: str,
    now: datetime,
    *,
    ttl_ms: int | None,
    poll_interval_ms: int | None,
    status_message: str | None,
) -> DetailedTask:
    """The seed state of a task: `working`, created and last updated `now`."""
    _check_duration("ttl_ms", ttl_ms)
    _check_duration("poll_interval_ms", poll_interval_ms)
    stamp = format_timestamp(now)
    return DetailedTask(
        taskId=task_id,
        status="working",
        createdAt=stamp,
        lastUpdatedAt=stamp,
        ttlMs=ttl_ms,
        statusMessage=UNSET if status_message is None else status_message,
        pollIntervalMs=UNSET if poll_interval_ms is None else poll_interval_ms,
    )


def _next(
    task: DetailedTask,
    status: Status,
    now: datetime,
    status_message: str | None,
    *,
    input_requests: dict[str, dict[str, Any]] | None = None,
    result: dict[str, Any] | None = None,
    error: TaskError | None = None,
) -> DetailedTask:
    """The shared step: check the edge, carry ttlMs/pollIntervalMs, set one variant field."""
    if task.status in TERMINAL:
        raise TerminalStateError(f"task is {task.status}; terminal states are final")
    if task.status not in _LIVE:  # unreachable with a typed task; guards decoded input
        raise IllegalTransition(f"no transition from {task.status!r} to {status!r}")
    if status_message is not None:
        message: str | msgspec.UnsetType = status_message
    elif status == task.status:
        message = task.statusMessage
    else:
        message = UNSET
    return DetailedTask(
        taskId=task.taskId,
        status=status,
        createdAt=task.createdAt,
        lastUpdatedAt=format_timestamp(now),
        ttlMs=task.ttlMs,
        statusMessage=message,
        pollIntervalMs=task.pollIntervalMs,
        inputRequests=UNSET if input_requests is None else input_requests,
        result=UNSET if result is None else result,
        error=UNSET if error is None else error,
    )


def to_working(
    task: DetailedTask, now: datetime, *, status_message: str | None = None
) -> DetailedTask:
    """working → working (progress) or input_required → working (input no longer needed)."""
    return _next(task, "working", now, status_message)


def _check_request(key: object, request: object) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidPayload(f"inputRequests keys must be non-empty strings, got {key!r}")
    if not isinstance(request, Mapping):
        raise InvalidPayload(f"inputRequests[{key!r}] must be an object")
    if request.get("method") not in INPUT_METHODS:
        raise InvalidPayload(
            f"inputRequests[{key!r}].method must be one of {sorted(INPUT_METHODS)}"
        )
    params = request.get("params", UNSET)
    if params is UNSET and request["method"] == "roots/list":
        return  # roots/list takes no parameters
    if not isinstance(params, Mapping):
        raise InvalidPayload(f"inputRequests[{key!r}].params must be an object")


def to_input_required(
    task: DetailedTask,
    input_requests: Mapping[str, Mapping[str, Any]],
    now: datetime,
    *,
    issued_keys: frozenset[str],
    status_message: str | None = None,
) -> DetailedTask:
    """Ask the client for input: add `input_requests` to the outstanding ones.

    Requests already outstanding stay outstanding (tasks/get lists every one, H38). A key
    in `issued_keys` may not be issued again, except to repeat an outstanding request
    unchanged, which keeps a retried call idempotent.
    """
    if not isinstance(input_requests, Mapping) or not input_requests:
        raise InvalidPayload("input_required needs a non-empty inputRequests object")
    outstanding = dict(task.inputRequests) if task.inputRequests is not UNSET else {}
    for key, request in input_requests.items():
        _check_request(key, request)
        if key in outstanding and outstanding[key] == request:
            continue
        if key in issued_keys or key in outstanding:
            raise InputKeyReused(f"input key {key!r} was already issued for this task")
        outstanding[key] = dict(request)
    return _next(task, "input_required", now, status_message, input_requests=outstanding)


def to_completed(
    task: DetailedTask,
    result: Mapping[str, Any],
    now: datetime,
    *,
    status_message: str | None = None,
) -> DetailedTask:
    """The request's result, e.g. a CallToolResult; `isError: true` is still completed."""
    if not isinstance(result, Mapping):
        raise InvalidPayload("completed needs a result object")
    # 2026-07-28 requires resultType on every result; a tool may predate that.
    normalised = {"resultType": "complete", **result}
    return _next(task, "completed", now, status_message, result=normalised)


def to_failed(
    task: DetailedTask,
    error: TaskError | Mapping[str, Any],
    now: datetime,
    *,
    status_message: str | None = None,
) -> DetailedTask:
    """A JSON-RPC error raised by the underlying request (and only that, H39)."""
    if not isinstance(error, TaskError):
        try:
            error = msgspec.convert(error, TaskError)
        except msgspec.ValidationError as exc:
            raise InvalidPayload(f"failed needs a JSON-RPC error object: {exc}") from None
    message = error.message if status_message is None else status_message
    return _next(task, "failed", now, message, error=error)


def to_cancelled(
    task: DetailedTask, now: datetime, *, status_message: str | None = None
) -> DetailedTask:
    return _next(task, "cancelled", now, status_message)


def answer(task: DetailedTask, keys: Iterable[str], now: datetime) -> DetailedTask:
    """Drop the answered keys; back to working once nothing is outstanding.

    Keys that are not outstanding are ignored (H49), and so is a task that
    is not input_required: the same task object comes back when nothing changed.
    """
    if isinstance(keys, str):
        raise TypeError("keys must be an iterable of keys, not one string")
    if task.status != "input_required" or task.inputRequests is UNSET:
        return task
    answered = set(keys)
    remaining = {k: v for k, v in task.inputRequests.items() if k not in answered}
    if len(remaining) == len(task.inputRequests):
        return task
    if not remaining:
        return _next(task, "working", now, None)
    return _next(task, "input_required", now, None, input_requests=remaining)


def with_task(envelope: BridgeEnvelope, task: DetailedTask) -> BridgeEnvelope:
    """The envelope carrying `task`, with any newly issued input keys remembered."""
    issued = list(envelope.issuedInputKeys)
    if task.inputRequests is not UNSET:
        seen = set(issued)
        issued.extend(k for k in task.inputRequests if k not in seen)
    return BridgeEnvelope(
        owner=envelope.owner, server=envelope.server, task=task, issuedInputKeys=issued
    )
