"""The 2025-11-25 door's side of tasks an upstream keeps (docs/front-door.md).

The door translates its `tasks/get`, `tasks/cancel`, `tasks/result`, `tasks/list` and the
answers to input requests for such a task into the modern requests
`hub/front_door/upstream_tasks.py` serves: read through its cache with the caller's own credential,
steered at the upstream, followed by polling while a `tasks/result` waits. The rules are the modern
door's: a task is read only for a caller the upstream answered, and a credential only while its
request is being served.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec

from hub.admission.auth import Identity
from hub.front_door.upstream import Upstream
from hub.front_door.upstream_tasks import Caller, PassThrough, own_request_headers
from hub.rpc import jsonrpc
from hub.runtime import Hub
from hub.store.snapshot import TaskSnapshot

RawHeaders = list[tuple[bytes, bytes]]


def caller(hub: Hub, principal: str, headers: Mapping[str, str], slot: str) -> Caller:
    """The legacy caller as the modern door would see it: its principal, its credential's
    hash, and the head the door sends upstream (it forwards `Authorization` only)."""
    head: RawHeaders = [(b"mcp-protocol-version", b"2026-07-28")]
    if "authorization" in headers:
        head.append((b"authorization", headers["authorization"].encode("latin-1")))
    credential = hub.upstream_tasks.credential(headers)
    return Caller(Identity(principal, None), credential, head, slot)


async def get(hub: Hub, task_id: str, who: Caller, upstream: Upstream | None) -> TaskSnapshot:
    """The task's state for `who`, or the legacy error."""
    try:
        return await hub.upstream_tasks.get(task_id, who, upstream)
    except PassThrough as passed:
        raise refused(passed) from None


async def steer(
    hub: Hub, method: str, params: dict[str, Any], who: Caller, upstream: Upstream | None
) -> None:
    """A modern `tasks/update` or `tasks/cancel` of the task, sent upstream for `who`;
    raises the upstream's error."""
    task_id = params["taskId"]
    body = msgspec.json.encode(
        {"jsonrpc": "2.0", "id": "taskhub-legacy", "method": method, "params": params}
    )
    headers = own_request_headers(who.headers, method.encode(), task_id)
    modern = Caller(who.identity, who.credential, headers, who.caller, who.meta)
    answer = await hub.upstream_tasks.steer(task_id, body, "taskhub-legacy", modern, upstream)
    if answer.status in (401, 403):
        raise refused(PassThrough(answer))
    error = (answer.message or {}).get("error")
    if isinstance(error, dict):
        raise jsonrpc.RpcError(
            int(error.get("code", jsonrpc.INTERNAL_ERROR)), str(error.get("message"))
        )


@contextlib.asynccontextmanager
async def followed(hub: Hub, task_id: str, who: Caller) -> AsyncIterator[None]:
    """Poll the task for `who` while the block runs (a `tasks/result`, a cancel's wait)."""
    unfollow = hub.upstream_tasks.follow(task_id, who)
    try:
        yield
    finally:
        unfollow()


def listed(hub: Hub, who: Caller) -> list[TaskSnapshot]:
    return hub.upstream_tasks.visible(who)


def refused(passed: PassThrough) -> jsonrpc.RpcError:
    status = passed.answer.status
    return jsonrpc.RpcError(
        jsonrpc.UNAUTHORIZED, f"Upstream refused the credential (HTTP {status})", http_status=status
    )
