"""`GET /operator/stream`: every task a caller may see, then every change, as SSE
(docs/dashboard.md). The dashboard and `taskhub tail` read it.

Operators (a token with the operator claim) see every task and the fleet's servers; anyone
else their own tasks, the rule of `tasks/get` (and on an open hub, the servers too). The
stream is a viewer (hub/push/viewer.py) on the fan-out, written by the listen stream's writer
(hub/push/listen_stream.py), so it coalesces, keeps alive, drops a reader that stopped reading and
says goodbye on shutdown exactly as a listen stream does. Its first states are read from the
cache in the same turn that registers it, so no change falls between them.
"""

from __future__ import annotations

import time
from typing import get_args

from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bridge.wire import Status
from hub.admission.auth import Identity
from hub.admission.limits import retry_after
from hub.http.cors import adding_headers, response_headers
from hub.mcp.task_reads import identify_reader, json_error
from hub.push.listen_stream import ListenStream
from hub.push.subscriber import Subscriber
from hub.push.viewer import TaskFilter, Viewer, sse_event
from hub.rpc import jsonrpc
from hub.runtime import Hub

STATUSES: tuple[str, ...] = get_args(Status)
FILTERS = ("server", "status", "owner")


class QueryError(ValueError):
    pass


def parse_filter(query: QueryParams) -> TaskFilter:
    """`server`, `status` and `owner`, each repeated or comma-separated (raises QueryError)."""
    unknown = sorted(set(query.keys()) - set(FILTERS))
    if unknown:
        raise QueryError(f"unknown query parameter {unknown[0]!r}; use {', '.join(FILTERS)}")
    values: dict[str, frozenset[str] | None] = {}
    for name in FILTERS:
        given = [value.strip() for raw in query.getlist(name) for value in raw.split(",")]
        if any(not value for value in given):
            raise QueryError(f"empty value in {name!r}")
        values[name] = frozenset(given) if given else None
    statuses = values["status"]
    if statuses is not None and not statuses <= set(STATUSES):
        bad = sorted(statuses - set(STATUSES))[0]
        raise QueryError(f"unknown status {bad!r}; one of {', '.join(STATUSES)}")
    return TaskFilter(values["server"], statuses, values["owner"])


def hello(identity: Identity, operator: bool, task_filter: TaskFilter, hub: Hub) -> bytes:
    return sse_event(
        "hello",
        {
            "principal": identity.principal,
            "operator": operator,
            "filters": task_filter.describe(),
            "silentAfterMs": round(hub.config.silent_after * 1000),
            "at": round(time.time() * 1000),
        },
    )


class OperatorStream:
    """The ASGI app of the route: refusals as JSON errors, else a viewer's SSE stream."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        cors = response_headers(headers.get("origin"), frozenset(self.hub.config.cors_origins))
        admitted = self._admit(scope, headers, cors)
        if isinstance(admitted, Response):
            return await admitted(scope, receive, send)
        stream = self._open(*admitted)
        raw_cors = [(name.encode(), value.encode("latin-1")) for name, value in cors.items()]
        await stream(scope, receive, adding_headers(send, raw_cors))

    def _admit(
        self, scope: Scope, headers: Headers, cors: dict[str, str]
    ) -> Response | tuple[Identity, bool, TaskFilter]:
        """The caller, whether an operator, and the filter in force; or the refusal. A
        stream slot is taken last, once nothing else can refuse."""
        hub = self.hub
        if scope["method"] != "GET":
            return json_error(405, jsonrpc.INVALID_REQUEST, "Use GET", {"allow": "GET", **cors})
        identity = identify_reader(hub, headers, cors)
        if isinstance(identity, Response):
            return identity
        try:
            task_filter = parse_filter(QueryParams(scope.get("query_string", b"")))
        except QueryError as exc:
            return json_error(400, jsonrpc.INVALID_PARAMS, str(exc), cors)
        operator = identity.operator
        if not operator:
            owners = task_filter.owners
            if owners is not None and owners != {identity.principal}:
                message = "filtering by another owner needs the operator claim"
                return json_error(403, jsonrpc.INVALID_PARAMS, message, cors)
            task_filter = TaskFilter(
                task_filter.servers, task_filter.statuses, frozenset({identity.principal})
            )
        if not hub.ready:
            message = "the hub is not ready (NATS unreachable or catching up); retry"
            return json_error(503, jsonrpc.INTERNAL_ERROR, message, {"retry-after": "1", **cors})
        refusal = hub.streams.acquire(identity.principal)
        if refusal is not None:
            hub.metrics.limited.inc(1, "streams")
            back_off = {"retry-after": retry_after(5), **cors}
            return json_error(
                429, jsonrpc.RATE_LIMITED, f"Too many open streams: {refusal}", back_off
            )
        return identity, operator, task_filter

    def _open(self, identity: Identity, operator: bool, task_filter: TaskFilter) -> ListenStream:
        """Register the viewer and read its first states in one turn (nothing between)."""
        hub = self.hub
        # The servers' health is the operators'; an open hub has none, so it is everyone's
        # there (counts and server ids, no task an owner could not see anyway).
        fleet = operator or hub.authenticator is None
        frames = hub.fanout.task_events
        viewer = Viewer(task_filter, fleet, frames)
        first = viewer.initial(hub.cache.live())
        hub.fanout.subscribe_viewer(viewer)

        def release(viewer: Subscriber) -> None:
            hub.fanout.unsubscribe(viewer)
            hub.streams.release(identity.principal)

        frame = (
            hello(identity, operator, task_filter, hub)
            + frames.join(first)
            + sse_event("synced", {"tasks": len(first)})
            + hub.fleet_frame(fleet)
        )
        return ListenStream(
            viewer,
            frame,
            metrics=hub.metrics,
            on_close=release,
            ends_at=identity.expires_at,  # the stream lives no longer than its token
        )
