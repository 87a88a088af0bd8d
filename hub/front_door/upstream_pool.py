"""The one HTTP client every upstream shares, and what each caller may take of it.

At most `--max-forwards-per-caller` requests of one caller in flight (429 past it), and
over every caller at most `--max-upstream-buffer-bytes` of answers read whole
(docs/front-door.md#limits). Connections are pooled by hub/front_door/upstream_http.py.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from hub.admission.limits import ByteBudget, StreamLimiter
from hub.front_door.forwarding import AnswerHeads
from hub.front_door.upstream_http import HIGH_WATER, Client
from hub.rpc import jsonrpc

POOL_CONNECTIONS = 1024  # per hub process, over all upstreams; an SSE reply holds one
POOL_KEEPALIVE = 64  # idle connections kept for reuse
# An idle connection is dropped before an upstream would close it (uvicorn and Node close
# after 5 s, gunicorn after 2 s). Reusing one that the upstream is closing at that moment
# fails the request with a reset (a 502 to the client).
POOL_KEEPALIVE_EXPIRY = 1.0  # seconds
READ_SIZE = HIGH_WATER  # what one answer may hold unread: less free in the budget is none


class Pool:
    """The one HTTP client every upstream shares, and what each caller may take of it;
    opened and closed with the app."""

    def __init__(
        self,
        timeout: float,
        *,
        max_per_caller: int = 100,
        buffer_bytes: int = 256 << 20,
    ) -> None:
        self.timeout = timeout
        # No total beyond the pool's own: one caller's share is the limit here.
        self.in_flight = StreamLimiter(sys.maxsize, max_per_caller, "forwarded requests in flight")
        self.buffer = ByteBudget(buffer_bytes)
        self.answer_heads = AnswerHeads()  # what the upstreams' answer heads come to
        # A free connection, the connection and the answer's head within `timeout` (and a
        # JSON body, `Upstream`); an SSE answer may rightly stay quiet for minutes.
        self.client = Client(
            max_connections=POOL_CONNECTIONS,
            max_idle=POOL_KEEPALIVE,
            idle_expiry=POOL_KEEPALIVE_EXPIRY,
            tick=min(1.0, timeout / 4),  # how late past `timeout` a request may be failed
        )

    def admit(self, caller: str) -> jsonrpc.RpcError | None:
        """Take one of `caller`'s slots for a request in flight (`release` gives it back),
        or the 429 it gets when it holds all of them, or when the hub holds all the answer
        bytes it may (an upstream should not do work whose answer would be dropped)."""
        if self.buffer.held + READ_SIZE > self.buffer.limit:
            return jsonrpc.rate_limited(
                "the hub holds as many upstream answer bytes as it may; retry shortly", "1"
            )
        refusal = self.in_flight.acquire(caller)
        return None if refusal is None else jsonrpc.rate_limited(refusal, "1")

    def release(self, caller: str) -> None:
        self.in_flight.release(caller)

    @contextlib.contextmanager
    def slot(self, caller: str) -> Iterator[None]:
        """`admit` and `release` around a block; the 429 is raised."""
        refusal = self.admit(caller)
        if refusal is not None:
            raise refusal
        try:
            yield
        finally:
            self.release(caller)

    async def close(self) -> None:
        await self.client.close()
