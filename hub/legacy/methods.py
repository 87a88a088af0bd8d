"""The 2025-11-25 task methods, served from the hub's snapshot and control path.

Each is a function of the hub, the caller's principal and the request's params, returning
the legacy result or raising `RpcError`. Ownership works as on the modern side: unknown,
expired and foreign tasks are the same -32602 (H46). `tasks/result` lives in
hub/legacy/results.py, since it streams.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from typing import Any

import msgspec

from bridge.wire import CancelMessage, control_message_id, encode
from hub.legacy.vocabulary import legacy_status, legacy_task
from hub.mcp.handlers import find_task
from hub.rpc import jsonrpc
from hub.runtime import Hub
from hub.store.snapshot import TaskSnapshot
from hub.store.source import StoreUnavailable

LIST_PAGE = 50
CANCEL_WAIT_S = 10.0  # tasks/cancel waits this long for the server to cancel


def task_id_of(params: dict[str, Any]) -> str:
    task_id = params.get("taskId")
    if not isinstance(task_id, str):
        raise jsonrpc.invalid_params("params.taskId must be a string")
    return task_id


async def owned(hub: Hub, params: dict[str, Any], principal: str) -> TaskSnapshot:
    snapshot = await find_task(hub, task_id_of(params), principal)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    return snapshot


def decoded(snapshot: TaskSnapshot) -> dict[str, Any]:
    task: dict[str, Any] = msgspec.json.decode(snapshot.body)
    return task


async def tasks_get(hub: Hub, params: dict[str, Any], principal: str) -> dict[str, Any]:
    return legacy_task(decoded(await owned(hub, params, principal)))


def tasks_list(
    hub: Hub, params: dict[str, Any], principal: str, kept: list[TaskSnapshot] | None = None
) -> dict[str, Any]:
    """The caller's tasks (and the `kept` ones upstreams keep for it), oldest first,
    `LIST_PAGE` at a time; the cursor names the last task of the page before (opaque to the
    client; a malformed one is -32602)."""
    after = _cursor_position(params.get("cursor"))
    by_id = {task["taskId"]: task for task in map(decoded, kept or ())}
    by_id.update((task["taskId"], task) for task in map(decoded, hub.cache.owned_by(principal)))
    tasks = sorted(
        (((task["createdAt"], task_id), task) for task_id, task in by_id.items()),
        key=lambda item: item[0],
    )
    page = [(key, task) for key, task in tasks if after is None or key > after][: LIST_PAGE + 1]
    result: dict[str, Any] = {"tasks": [legacy_task(task) for _, task in page[:LIST_PAGE]]}
    if len(page) > LIST_PAGE:
        result["nextCursor"] = _cursor(page[LIST_PAGE - 1][0])
    return result


def _cursor(key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(list(key))).decode()


def _cursor_position(cursor: Any) -> tuple[str, str] | None:
    if cursor is None:
        return None
    try:
        key = msgspec.json.decode(base64.urlsafe_b64decode(str(cursor).encode()))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        key = None
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key)):
        raise jsonrpc.invalid_params("Invalid cursor")
    return key[0], key[1]


async def tasks_cancel(
    hub: Hub, params: dict[str, Any], principal: str, request_id: Any
) -> dict[str, Any]:
    """Ask the owning server to cancel, then wait (at most `CANCEL_WAIT_S`) until the task
    is terminal, and answer the Task as it then is. A terminal task is -32602 under
    2025-11-25, unlike the modern ack."""
    snapshot = await owned(hub, params, principal)
    if snapshot.terminal:
        status = legacy_status(decoded(snapshot))
        raise jsonrpc.invalid_params(f"Cannot cancel task: already in terminal status '{status}'")
    data = encode(CancelMessage(snapshot.task_id, principal))
    msg_id = control_message_id(jsonrpc.encode_id(request_id), principal, data)
    try:
        await hub.source.publish_control(snapshot.server, data, msg_id)
    except StoreUnavailable as exc:
        raise jsonrpc.internal_error(str(exc)) from exc
    final = await until_terminal(hub, snapshot.task_id, CANCEL_WAIT_S)
    return legacy_task(decoded(final or snapshot))


async def until_terminal(hub: Hub, task_id: str, timeout: float | None) -> TaskSnapshot | None:
    """The task once terminal, or as it is when `timeout` ran out (None: it went away)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        waiter = hub.next_change(task_id)  # before the check: no revision slips between
        try:
            current = hub.current(task_id)  # the snapshot's, or an upstream's own
            if current is None or current.terminal:
                return current
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return current
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await waiter
        finally:
            waiter.cancel()
