"""A request on its way to an upstream (the front door): what goes with it and who runs it.

The endpoint (hub/mcp/endpoint.py) checks a request and makes a `Forwarding` of it; the ASGI
path calls it, the connection runs it in place (hub/http/connection.py `InPlaceCycle`), and
either way `Upstream.forward` (hub/front_door/upstream.py) does the work and the outcome is counted.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from starlette.types import Receive, Scope, Send

from hub.front_door.upstream import Record, Upstream
from hub.http.cors import adding_headers
from hub.metrics import Metrics
from hub.rpc import jsonrpc

RawHeaders = list[tuple[bytes, bytes]]


class Outgoing(NamedTuple):
    """What goes upstream with a request: the head the hub makes of the client's (its
    fields, and as encoded lines), and the caller whose requests in flight it counts
    against (forwarding.py)."""

    headers: RawHeaders
    caller: str
    lines: bytes


class Forwarding(NamedTuple):
    """A request on its way to the upstream, which answers on `send` itself."""

    upstream: Upstream
    body: bytes
    request_id: jsonrpc.RequestId | None
    outgoing: Outgoing
    metrics: Metrics
    record: Record | None = None  # what sees a task the answer creates
    extra_headers: RawHeaders | None = None  # CORS, when it runs on the connection

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI path: ended when `receive` says the client left."""
        outgoing = self.outgoing
        outcome = await self.upstream.forward_until_gone(
            receive, send, self.body, self.request_id, outgoing.lines, outgoing.caller, self.record
        )
        self.metrics.upstream_requests.inc(1, self.upstream.spec.label, outcome)

    async def run_in_place(self, send: Send) -> None:
        """On the connection itself (hub/http/connection.py), which cancels it when the client
        leaves."""
        label = self.upstream.spec.label
        try:
            outcome = await self.upstream.forward(
                adding_headers(send, self.extra_headers or []),
                self.body,
                self.request_id,
                self.outgoing.lines,
                self.outgoing.caller,
                self.record,
            )
        except asyncio.CancelledError:
            self.metrics.upstream_requests.inc(1, label, "client_gone")
            raise
        self.metrics.upstream_requests.inc(1, label, outcome)
