"""The MCP methods the hub serves, each a function of the hub, a request and a caller.

Requests arrive validated (hub/rpc/request.py); these functions only decide the answer.
Unknown, expired and foreign tasks get the very same error, so a caller learns
nothing about tasks it does not own (invariant 3, H46).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from bridge.vocabulary import SERVER_INFO_KEY, SUPPORTED_VERSIONS, TASKS_EXTENSION
from bridge.wire import MAX_URI_BYTES, CancelMessage, UpdateMessage, control_message_id, encode
from hub.admission.auth import Identity
from hub.admission.limits import retry_after
from hub.push.listen_stream import ListenStream
from hub.push.sse_frames import ack_frame
from hub.push.subscriber import EndReason, Subscriber
from hub.rpc import jsonrpc
from hub.rpc.request import LIST_CHANGED_FILTERS, Request
from hub.runtime import Hub
from hub.store.snapshot import TaskSnapshot
from hub.store.source import StoreUnavailable

DISCOVER_TTL_MS = 3_600_000

_SERVER_META = {SERVER_INFO_KEY: jsonrpc.SERVER_INFO}
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
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": {"extensions": {TASKS_EXTENSION: {}}},
            "instructions": "Task status hub: poll tasks/get or subscribe with "
            "subscriptions/listen (notifications.taskIds).",
            "ttlMs": DISCOVER_TTL_MS,
            "cacheScope": "public",
        },
    )


def merge_discover(answer: Any) -> bytes:
    """An upstream's `server/discover` answer with what the hub adds merged in: the tasks
    extension, and `listChanged` (and `resources.subscribe`) for each of the upstream's
    tools, prompts and resources, since the hub delivers those events (docs/fleet-events.md).

    Everything else stays the upstream's: its versions, capabilities, instructions, server
    info and caching hints (`ttlMs`, `cacheScope`). An error answer passes unchanged.
    """
    result = answer.get("result") if isinstance(answer, dict) else None
    if isinstance(result, dict):
        capabilities = result.get("capabilities")
        if not isinstance(capabilities, dict):
            capabilities = result["capabilities"] = {}
        extensions = capabilities.get("extensions")
        if not isinstance(extensions, dict):
            extensions = capabilities["extensions"] = {}
        extensions[TASKS_EXTENSION] = {}
        for name in ("tools", "prompts", "resources"):
            offered = capabilities.get(name)
            if isinstance(offered, dict):
                offered["listChanged"] = True
                if name == "resources":
                    offered["subscribe"] = True
    return msgspec.json.encode(answer)


async def find_task(hub: Hub, task_id: str, principal: str) -> TaskSnapshot | None:
    """The caller's task, or None when it is unknown, expired or someone else's."""
    try:
        cached = hub.cache.get(task_id) is not None
        snapshot = await hub.source.read_through(task_id)
        if snapshot is not None and snapshot.owner != principal:
            # Same timing class as an unknown task, which costs one store read: a
            # cached foreign task must not answer faster than a missing one (H46),
            # nor an uncached one (just read through) slower.
            if cached:
                await hub.source.read_store(task_id)
            return None
    except StoreUnavailable as exc:
        raise jsonrpc.internal_error(str(exc)) from exc
    return snapshot


async def tasks_get(hub: Hub, request: Request, principal: str) -> bytes:
    """`tasks/get` (H37–H42) from the snapshot, read through to NATS on a miss."""
    assert request.task_id is not None
    snapshot = await find_task(hub, request.task_id, principal)
    pace_poll(hub, principal, request.task_id, snapshot)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    return get_result(request.id, snapshot)


def tasks_get_cached(
    hub: Hub, request_id: jsonrpc.RequestId, task_id: str, principal: str
) -> bytes | None:
    """`tasks/get` of the caller's own cached task, answered in place; None (nothing
    done) for every other case, which `tasks_get` answers with its store read."""
    snapshot = hub.cache.get(task_id)
    if snapshot is None or snapshot.owner != principal:
        return None
    pace_poll(hub, principal, task_id, snapshot)
    return get_result(request_id, snapshot)


def get_result(request_id: jsonrpc.RequestId, snapshot: TaskSnapshot) -> bytes:
    # One join (not four concatenations); the task's closing brace closes the result.
    request = (b'{"jsonrpc":"2.0","id":', jsonrpc.encode_id(request_id), _GET_RESULT_HEAD)
    return b"".join((*request, snapshot.body[1:], b"}"))


def pace_poll(hub: Hub, principal: str, task_id: str, snapshot: TaskSnapshot | None) -> None:
    """429 for a caller polling one task faster than its pollIntervalMs (D20).

    Unknown and foreign tasks are paced too, at the default interval, so the answer
    never tells them apart.
    """
    if hub.config.poll_burst == 0:
        return
    interval_ms = snapshot.poll_interval_ms if snapshot is not None else None
    interval = None if interval_ms is None else interval_ms / 1000
    wait = hub.polls.admit(principal, task_id, interval, time.monotonic())
    if wait > 0:
        hub.metrics.limited.inc(1, "poll_rate")
        raise jsonrpc.rate_limited(
            f"Polling faster than the task's pollIntervalMs; retry in {wait:.1f}s",
            retry_after(wait),
        )


async def tasks_update(hub: Hub, request: Request, principal: str) -> bytes:
    """`tasks/update` (H47–H50): forward the answers to the owning server, durably.

    Stored for the owner is enough for the ack (H47 allows it before the effect), but the
    hub then waits, at most `--update-wait` seconds, until its snapshot shows the answered
    keys taken (D24), so the caller's next `tasks/get` reads its own update. The server
    ignores keys that are not outstanding (H49). The client's token never travels upstream,
    only its principal (H54).
    """
    assert request.task_id is not None and request.input_responses is not None
    snapshot = await find_task(hub, request.task_id, principal)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    if not snapshot.terminal:  # nothing can change a terminal task
        message = UpdateMessage(snapshot.task_id, request.input_responses, principal)
        await _forward(hub, snapshot, encode(message), request)
        await _until_taken(hub, snapshot.task_id, set(request.input_responses))
    return jsonrpc.complete_ack(request.id)


async def _until_taken(hub: Hub, task_id: str, keys: set[str]) -> None:
    """Until the snapshot has none of `keys` outstanding (answered, or never asked: H49),
    the task is gone, or `--update-wait` ran out; the ack stands either way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + hub.config.update_wait
    while True:
        waiter = hub.next_change(task_id)  # before the check: no revision slips between
        try:
            current = hub.cache.get(task_id)
            remaining = deadline - loop.time()
            if current is None or not keys & _outstanding(current) or remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await waiter
        finally:
            waiter.cancel()


def _outstanding(snapshot: TaskSnapshot) -> set[str]:
    """The input keys the task still waits for."""
    if snapshot.status != "input_required":
        return set()
    requests = msgspec.json.decode(snapshot.body).get("inputRequests")
    return set(requests) if isinstance(requests, dict) else set()


async def tasks_cancel(hub: Hub, request: Request, principal: str) -> bytes:
    """`tasks/cancel` (H51–H53): cooperative; a terminal task is acked unchanged (D23)."""
    assert request.task_id is not None
    snapshot = await find_task(hub, request.task_id, principal)
    if snapshot is None:
        raise jsonrpc.task_not_found()
    if not snapshot.terminal:
        message = CancelMessage(snapshot.task_id, principal)
        await _forward(hub, snapshot, encode(message), request)
    return jsonrpc.complete_ack(request.id)


def _grant_events(
    hub: Hub, request: Request, principal: str, service: str | None
) -> dict[str, Any]:
    """The fleet event filters this stream gets, as the ack names them: none without an
    upstream; the list-changed ones asked for; the resource URIs the resource rule allows."""
    if service is None:
        return {}
    granted: dict[str, Any] = {
        field: True for field, kind in LIST_CHANGED_FILTERS.items() if kind in request.list_changed
    }
    if request.resource_uris is not None:
        granted["resourceSubscriptions"] = [
            uri
            for uri in request.resource_uris
            if 0 < len(uri.encode()) <= MAX_URI_BYTES and hub.resource_rule(principal, service, uri)
        ]
    return granted


async def _forward(hub: Hub, snapshot: TaskSnapshot, data: bytes, request: Request) -> None:
    msg_id = control_message_id(jsonrpc.encode_id(request.id), snapshot.owner, data)
    try:
        await hub.source.publish_control(snapshot.server, data, msg_id)
    except StoreUnavailable as exc:
        raise jsonrpc.internal_error(str(exc)) from exc


class UpstreamKept(Protocol):
    """A listen stream's access to the tasks upstreams keep (hub/mcp/endpoint.py's KeptListen)."""

    async def grant(self, task_id: str) -> TaskSnapshot | None: ...

    def follow(self, task_id: str) -> Callable[[], None]: ...

    def follow_events(
        self, subscriber: Subscriber, granted: dict[str, Any]
    ) -> Callable[[], None]: ...


async def subscriptions_listen(
    hub: Hub,
    request: Request,
    identity: Identity,
    service: str | None = None,
    kept: UpstreamKept | None = None,
) -> ListenStream:
    """`subscriptions/listen` (H55–H65, D16–D18).

    Follow the requested tasks *before* reading their state, so a change landing in
    between is queued rather than lost (D17); the ack then names the granted
    subset and the current states follow it. At an upstream's endpoint (`service`), the
    fleet event filters are granted too (docs/fleet-events.md). A task the snapshot does
    not hold may be one an upstream keeps (`kept`): granted, and polled while followed.
    """
    principal = identity.principal
    _check_listen_limits(hub, request)
    subscriber, events, release = _subscribe(hub, request, principal, service)
    unfollows: list[Callable[[], None]] = []
    try:
        if events and kept is not None:  # list changes of an upstream not announcing on NATS
            unfollows.append(kept.follow_events(subscriber, events))
        granted: list[str] = []
        for task_id in request.task_ids or ():
            snapshot = await find_task(hub, task_id, principal)
            if snapshot is None and kept is not None:
                snapshot = await kept.grant(task_id)
                if snapshot is not None and not snapshot.terminal:
                    unfollows.append(kept.follow(task_id))
            if snapshot is not None:
                granted.append(task_id)
                subscriber.offer(snapshot)
        _follow_granted(hub, subscriber, granted)
    except BaseException:
        release(subscriber)
        for unfollow in unfollows:
            unfollow()
        raise
    if unfollows:
        release = _also(release, unfollows)
    return _listen_stream(hub, request, identity, subscriber, granted, events, release)


def subscriptions_listen_cached(
    hub: Hub, request: Request, identity: Identity, service: str | None = None
) -> ListenStream | None:
    """`subscriptions_listen` when every task it names is cached and the caller's, so
    nothing needs reading (nor waiting for: following and reading are one step); None,
    with nothing done, otherwise."""
    principal = identity.principal
    _check_listen_limits(hub, request)
    snapshots = [hub.cache.get(task_id) for task_id in request.task_ids or ()]
    if not all(snapshot is not None and snapshot.owner == principal for snapshot in snapshots):
        return None  # a store read decides (and times) the answer: `subscriptions_listen`
    subscriber, events, release = _subscribe(hub, request, principal, service)
    granted = list(request.task_ids or ())
    try:
        for snapshot in snapshots:
            assert snapshot is not None
            subscriber.offer(snapshot)
        _follow_granted(hub, subscriber, granted)
        return _listen_stream(hub, request, identity, subscriber, granted, events, release)
    except BaseException:  # nothing left behind for the app's path, which then answers
        release(subscriber)
        raise


def _also(
    release: Callable[[Subscriber], None], unfollows: list[Callable[[], None]]
) -> Callable[[Subscriber], None]:
    def release_all(subscriber: Subscriber) -> None:
        release(subscriber)
        for unfollow in unfollows:
            unfollow()

    return release_all


def _check_listen_limits(hub: Hub, request: Request) -> None:
    limit = hub.config.max_task_ids
    for name, count in (
        ("taskIds", len(request.task_ids or ())),
        ("resourceSubscriptions", len(request.resource_uris or ())),
    ):
        if count > limit:
            hub.metrics.limited.inc(1, "task_ids")
            raise jsonrpc.invalid_params(f"Too many {name}: at most {limit} per subscription")


def _subscribe(
    hub: Hub, request: Request, principal: str, service: str | None
) -> tuple[Subscriber, dict[str, Any], Callable[[Subscriber], None]]:
    """A stream slot, the subscriber following its tasks and events, and its release."""
    refusal = hub.streams.acquire(principal)
    if refusal is not None:
        hub.metrics.limited.inc(1, "streams")
        raise jsonrpc.rate_limited(f"Too many open streams: {refusal}", "5")
    subscriber = Subscriber(jsonrpc.encode_id(request.id), request.task_ids or ())
    hub.fanout.subscribe(subscriber)
    events = _grant_events(hub, request, principal, service)
    if events:
        hub.fanout.follow_events(
            subscriber,
            service or "",
            principal,
            [kind for field, kind in LIST_CHANGED_FILTERS.items() if events.get(field)],
            events.get("resourceSubscriptions", ()),
        )

    def release(subscriber: Subscriber) -> None:
        hub.fanout.unsubscribe(subscriber)
        hub.streams.release(principal)

    return subscriber, events, release


def _follow_granted(hub: Hub, subscriber: Subscriber, granted: list[str]) -> None:
    hub.fanout.narrow(subscriber, granted)
    # A terminal state never changes (D18): send it once, follow no further.
    for task_id in granted:
        if subscriber.backlog[task_id].terminal:
            hub.fanout.unfollow(subscriber, task_id)


def _listen_stream(
    hub: Hub,
    request: Request,
    identity: Identity,
    subscriber: Subscriber,
    granted: list[str],
    events: dict[str, Any],
    release: Callable[[Subscriber], None],
) -> ListenStream:
    if hub.closing:
        subscriber.finish(EndReason.SHUTDOWN)
    first = ack_frame(
        subscriber.subscription_id,
        granted if request.task_ids is not None else None,
        events,
    )
    return ListenStream(
        subscriber,
        first,
        metrics=hub.metrics,
        on_close=release,
        ends_at=identity.expires_at,  # the stream lives no longer than its token
    )
