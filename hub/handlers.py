"""The MCP methods the hub serves, each a function of the hub, a request and a caller.

Requests arrive validated (hub/protocol.py); these functions only decide the answer.
Unknown, expired and foreign tasks get the very same error, so a caller learns
nothing about tasks it does not own (invariant 3, H46).
"""

from __future__ import annotations

import hashlib

import msgspec

from bridge.wire import CancelMessage, UpdateMessage, encode
from hub import jsonrpc
from hub.cache import TaskSnapshot
from hub.fanout import Subscriber
from hub.nats_source import StoreUnavailable
from hub.protocol import Request
from hub.runtime import Hub
from hub.sse import ListenStream, ack_frame

SUPPORTED_VERSIONS = ["2026-07-28"]
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
DISCOVER_TTL_MS = 3_600_000

_SERVER_META = {jsonrpc.META_SERVER_INFO_KEY: jsonrpc.SERVER_INFO}
# tasks/get = envelope + this + the task's own bytes after its "{" (spliced, not re-encoded).
_GET_RESULT_HEAD = (
    b',"result":{"resultType":"complete","_meta":' + msgspec.json.encode(_SERVER_META) + b","
)


def discover(request: Request) -> bytes:
    """`server/discover` (H26–H29): tasks is the only capability the hub offers."""
    return jsonrpc.encode_result(
        request.id,
        {
            "resultType": "complete",
            "supportedVersions": SUPPORTED_VERSIONS,
            "capabilities": {"extensions": {TASKS_EXTENSION: {}}},
            "instructions": "Task status hub: poll tasks/get or subscribe with "
            "subscriptions/listen (notifications.taskIds).",
            "ttlMs": DISCOVER_TTL_MS,
            "cacheScope": "public",
        },
    )


async def find_task(hub: Hub, task_id: str, principal: str) -> TaskSnapshot | None:
    """The caller's task, or None when it is unknown, expired or someone else's."""
    try:
        snapshot = await hub.source.read_through(task_id)
    except StoreUnavailable as exc:
        raise jsonrpc.internal_error(str(exc)) from exc
    if snapshot is None or snapshot.owner != principal:
        return None
    return snapshot


async def tasks_get(hub: Hub, request: Request, principal: str) -> bytes:
    """`tasks/get` (H37–H42) from the snapshot, read through to NATS on a miss."""
    assert request.task_id is not None
    snapshot = await find_task(hub, request.task_id, principal)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    return (
        b'{"jsonrpc":"2.0","id":'
        + jsonrpc.encode_id(request.id)
        + _GET_RESULT_HEAD
        + snapshot.body[1:]  # the task's closing brace closes the result
        + b"}"
    )


async def tasks_update(hub: Hub, request: Request, principal: str) -> bytes:
    """`tasks/update` (H47–H50): forward the answers to the owning server, durably.

    The ack means "stored for the owner", not "applied" (§4.5: eventually consistent);
    the server ignores keys that are not outstanding (H49). The client's token never
    travels upstream, only its principal (H54).
    """
    assert request.task_id is not None and request.input_responses is not None
    snapshot = await find_task(hub, request.task_id, principal)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    if not snapshot.terminal:  # nothing can change a terminal task
        message = UpdateMessage(snapshot.task_id, request.input_responses, principal)
        await _forward(hub, snapshot, encode(message), request)
    return jsonrpc.complete_ack(request.id)


async def tasks_cancel(hub: Hub, request: Request, principal: str) -> bytes:
    """`tasks/cancel` (H51–H53): cooperative; a terminal task is acked unchanged (§8 item 23)."""
    assert request.task_id is not None
    snapshot = await find_task(hub, request.task_id, principal)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    if not snapshot.terminal:
        message = CancelMessage(snapshot.task_id, principal)
        await _forward(hub, snapshot, encode(message), request)
    return jsonrpc.complete_ack(request.id)


async def _forward(hub: Hub, snapshot: TaskSnapshot, data: bytes, request: Request) -> None:
    # The same request retried (same caller, id and content) is de-duplicated by JetStream.
    digest = hashlib.blake2b(digest_size=16)
    for part in (jsonrpc.encode_id(request.id), snapshot.owner.encode(), data):
        digest.update(len(part).to_bytes(4, "big") + part)
    try:
        await hub.source.publish_control(snapshot.server, data, digest.hexdigest())
    except StoreUnavailable as exc:
        raise jsonrpc.internal_error(str(exc)) from exc


async def subscriptions_listen(hub: Hub, request: Request, principal: str) -> ListenStream:
    """`subscriptions/listen` (H55–H65, §8 items 16–18).

    Follow the requested tasks *before* reading their state, so a change landing in
    between is queued rather than lost (§8 item 17); the ack then names the granted
    subset and the current states follow it.
    """
    requested = list(request.task_ids or ())
    subscriber = Subscriber(jsonrpc.encode_id(request.id), requested)
    hub.fanout.subscribe(subscriber)
    try:
        granted: list[str] = []
        for task_id in requested:
            snapshot = await find_task(hub, task_id, principal)
            if snapshot is not None:
                granted.append(task_id)
                subscriber.offer(snapshot)
        hub.fanout.narrow(subscriber, granted)
        # A terminal state never changes (§8 item 18): send it once, follow no further.
        for task_id in granted:
            if subscriber.backlog[task_id].terminal:
                hub.fanout.unfollow(subscriber, task_id)
    except BaseException:
        hub.fanout.unsubscribe(subscriber)
        raise
    if hub.closing:
        subscriber.close()
    first = ack_frame(subscriber.subscription_id, granted if request.task_ids is not None else None)
    return ListenStream(
        subscriber,
        first,
        keepalive=hub.config.keepalive,
        send_timeout=hub.config.send_timeout,
        metrics=hub.metrics,
        on_close=hub.fanout.unsubscribe,
    )
