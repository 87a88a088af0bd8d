"""`tasks/get`, `tasks/update` and `tasks/cancel` at a fleet server, with the hub's semantics.

A server that advertises `io.modelcontextprotocol/tasks` must serve the extension's methods
itself, so a client pointed at any one server can follow the tasks it was handed there.
Each answer comes from the KV stream leader (`TaskBridge.get`), never from this process's
memory, so a task created on one replica is found on every other (read-your-create), and
`tasks/update` / `tasks/cancel` go to the owning server's control subject exactly as the hub
forwards them: whichever replica runs the body gets them, this one included.

Unknown, expired and foreign tasks get the same error and cost the same one leader read
(H46). Unlike the hub, a server does not pace polls (D20): the hub exists to absorb them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, RequestParams

from bridge.bridge import TaskBridge
from bridge.task_context import missing_capability
from bridge.vocabulary import TASK_NOT_FOUND, TASKS_EXTENSION
from bridge.wire import (
    TERMINAL,
    CancelMessage,
    InvalidEnvelope,
    TaskRecord,
    UpdateMessage,
    control_message_id,
    encode,
    expires_at,
)

COMPLETE: dict[str, Any] = {"resultType": "complete"}  # the tasks/update and cancel ack
# tasks/update waits up to this long for the owner to take the answers, so the caller's next
# tasks/get shows them taken (D24, read-your-update); past it, the ack is only eventual (H47).
UPDATE_APPLIED_WAIT_S = 2.0


class TaskIdParams(RequestParams):
    """`tasks/get` and `tasks/cancel` params."""

    task_id: str


class UpdateTaskParams(TaskIdParams):
    """`tasks/update` params: answers keyed by the input request they answer."""

    input_responses: dict[str, Any]


def task_not_found() -> MCPError:
    """H42/H46: unknown, expired and foreign tasks all get exactly this error."""
    return MCPError(INVALID_PARAMS, TASK_NOT_FOUND)


def undeclared() -> MCPError:
    """H31: -32021 for a tasks/* request whose own `_meta` did not declare the extension."""
    return missing_capability(
        {"extensions": {TASKS_EXTENSION: {}}}, "Missing required client capability"
    )


def store_unavailable(exc: BaseException) -> MCPError:
    """H70: the store cannot answer; never the exception's text, only its kind."""
    return MCPError(INTERNAL_ERROR, f"task store unavailable: {type(exc).__name__}")


def expired(record: TaskRecord, now: float) -> bool:
    """Past createdAt + ttlMs (the KV message TTL may not have removed it yet)."""
    until = expires_at(record.task.createdAt, record.task.ttlMs)
    return until is not None and now >= until


def get_result(record: TaskRecord) -> dict[str, Any]:
    """The flat DetailedTask plus `resultType: "complete"`, as the hub answers tasks/get."""
    task: dict[str, Any] = msgspec.to_builtins(record.task)
    return {**COMPLETE, **task}


async def find_task(bridge: TaskBridge, task_id: str, principal: str) -> TaskRecord:
    """The caller's live task from the leader, or the one not-found error for every other."""
    try:
        record = await bridge.get(task_id)
    except InvalidEnvelope:
        record = None  # the hub rejects a malformed value too: there is no such task
    except Exception as exc:
        raise store_unavailable(exc) from exc
    if record is None or record.owner != principal or expired(record, time.time()):
        raise task_not_found()
    return record


async def tasks_get(bridge: TaskBridge, task_id: str, principal: str) -> dict[str, Any]:
    """`tasks/get` (H37–H42)."""
    return get_result(await find_task(bridge, task_id, principal))


async def tasks_update(
    bridge: TaskBridge,
    task_id: str,
    responses: dict[str, Any],
    principal: str,
    request_id: Any,
) -> dict[str, Any]:
    """`tasks/update` (H47–H50): stored for the owning server, not yet applied; the owner
    ignores keys that are not outstanding (H49)."""
    record = await find_task(bridge, task_id, principal)
    if record.task.status not in TERMINAL:  # nothing can change a terminal task
        message = UpdateMessage(record.task_id, responses, principal)
        await forward(bridge, record, encode(message), request_id)
        await until_taken(bridge, record, set(responses))
    return dict(COMPLETE)


def outstanding(record: TaskRecord | None) -> set[str]:
    """The input keys `record` still waits for."""
    if record is None or record.task.status != "input_required":
        return set()
    requests = record.task.inputRequests
    return set(requests) if isinstance(requests, dict) else set()


async def until_taken(bridge: TaskBridge, record: TaskRecord, keys: set[str]) -> None:
    """Wait (bounded) until none of `keys` is outstanding any more: the owner has taken the
    answers, or ignored keys that were not outstanding to begin with (H49)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + UPDATE_APPLIED_WAIT_S
    delay = 0.005
    current: TaskRecord | None = record
    while outstanding(current) & keys and loop.time() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)
        try:
            current = await bridge.get(record.task_id)
        except Exception:  # the ack stands: the update is stored whatever the read says
            return


async def tasks_cancel(
    bridge: TaskBridge, task_id: str, principal: str, request_id: Any
) -> dict[str, Any]:
    """`tasks/cancel` (H51–H53): cooperative; a terminal task is acked unchanged (D23)."""
    record = await find_task(bridge, task_id, principal)
    if record.task.status not in TERMINAL:
        message = CancelMessage(record.task_id, principal)
        await forward(bridge, record, encode(message), request_id)
    return dict(COMPLETE)


async def forward(bridge: TaskBridge, record: TaskRecord, data: bytes, request_id: Any) -> None:
    """Queue a control message for the task's server; returns once JetStream stored it.

    The same request retried (same caller, id and content) is stored once, as at the hub.
    """
    msg_id = control_message_id(msgspec.json.encode(request_id), record.owner, data)
    try:
        await bridge.forward(record.server, data, msg_id)
    except Exception as exc:
        raise store_unavailable(exc) from exc
