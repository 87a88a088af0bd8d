"""A request on its way to an upstream (the front door): what goes with it and who runs it.

The endpoint (hub/mcp/endpoint.py) checks a request and makes a `Forwarding` of it; the ASGI
path calls it, the connection runs it in place (hub/http/connection.py `InPlaceCycle`): on
callbacks (hub/front_door/forward_now.py) while it can, else as a task. Either way
`Upstream` (hub/front_door/upstream.py) does the work and the outcome is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from starlette.types import Receive, Scope, Send

from hub.front_door import forward_now
from hub.front_door.upstream import Record, Upstream
from hub.http.cors import adding_headers
from hub.metrics import Metrics
from hub.rpc import jsonrpc

if TYPE_CHECKING:
    from hub.http.connection import InPlaceCycle

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

    def start_in_place(self, cycle: InPlaceCycle) -> None:
        """On the connection itself (hub/http/connection.py): on callbacks while it can
        (hub/front_door/forward_now.py), else as a task, which the connection cancels when
        the client leaves."""
        extra = self.extra_headers or []
        args = (self.body, self.request_id, self.outgoing.lines, self.outgoing.caller, self.record)
        if not forward_now.start(self.upstream, cycle, *args, extra, self):
            cycle.run(self.counted(self.upstream.forward(adding_headers(cycle.send, extra), *args)))

    def tally(self, outcome: str) -> None:
        self.metrics.upstream_requests.inc(1, self.upstream.spec.label, outcome)

    async def counted(self, answer: Coroutine[Any, Any, str]) -> None:
        """`answer`'s outcome counted, or `client_gone` when it is cancelled."""
        try:
            outcome = await answer
        except asyncio.CancelledError:
            self.tally("client_gone")
            raise
        self.tally(outcome)
