"""The hub's HTTP connections: uvicorn's httptools protocol plus what the hub needs.

Deadlines. uvicorn's only timer is the keep-alive one, armed after a response and
cancelled by the first byte that arrives, so a client that trickles its headers one
byte at a time would keep the connection forever. Here a connection owes a complete
request head within `--header-timeout` of being opened or of its previous response
(which also bounds an idle keep-alive). One sweep per server, four times per deadline,
closes the overdue, instead of two timers armed and cancelled per request. Bodies get
their own deadline where they are read (hub/app.py).

Direct writes. ASGI's `send` is a coroutine, and uvicorn writes a response's head and
body in two system calls; pushing a frame through it costs a task wake-up per stream
and frame, which with thousands of streams following one task is most of the hub's
CPU. Each request's scope carries this connection's `Connection` under
`extensions["taskhub.connection"]`: `respond` writes a whole small response in one
call, and `channel` opens a `DirectChannel` through which the fan-out writes chunks of
a streaming body straight to the socket while the socket takes them, and which learns
at once when the connection is lost. A stream whose socket buffer is full goes back to
awaiting `send`, which waits for the drain. Both keep uvicorn's request cycle in the
state its own `send` would leave it in. Under another ASGI server the extension is
absent and everything takes the ordinary path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

CONNECTION = "taskhub.connection"
RawHeaders = list[tuple[bytes, bytes]]
# The app's `answer_now(scope, body)`: (status, body, headers, ...) or None to decline.
AnswerNow = Callable[[Scope, bytes], "tuple[Any, ...] | None"]


class DirectChannel:
    """Chunks of one chunked response body, written without the ASGI `send` coroutine."""

    __slots__ = ("_cycle", "on_lost")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self.on_lost: Callable[[], None] | None = None  # called once the connection is gone

    @property
    def writable(self) -> bool:
        """True while a write goes straight out: the response started chunked, is not
        finished, the client is there and the socket buffer is below its high-water mark."""
        cycle = self._cycle
        return (
            cycle.chunked_encoding is True
            and not cycle.response_complete
            and not cycle.disconnected
            and not cycle.flow.write_paused
        )

    @property
    def finished(self) -> bool:
        return self._cycle.response_complete or self._cycle.disconnected

    def write(self, data: bytes) -> None:
        """One HTTP/1.1 chunk; only while `writable`."""
        self._cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def abort(self) -> None:
        """Drop the connection now (a client that stopped reading)."""
        self._cycle.transport.abort()

    def lost(self) -> None:
        if self.on_lost is not None:
            self.on_lost()


class Connection:
    """What a request's app may do with its connection beyond ASGI (see the module doc)."""

    __slots__ = ("_channels", "_protocol")

    def __init__(self, protocol: HttpToolsProtocol) -> None:
        self._protocol = protocol
        self._channels: list[DirectChannel] = []

    def _cycle_of(self, scope: Scope) -> RequestResponseCycle | None:
        cycle = self._protocol.cycle
        # A request pipelined behind this one has no cycle of its own yet: ASGI it is.
        return cycle if cycle is not None and cycle.scope is scope else None

    def respond(self, scope: Scope, status: int, headers: RawHeaders, body: bytes) -> bool:
        """The whole response in one write, as uvicorn's `send` would frame it; False
        (nothing written) when it must go through `send` instead."""
        cycle = self._cycle_of(scope)
        if cycle is None or cycle.response_started or cycle.disconnected or cycle.flow.write_paused:
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        parts = [STATUS_LINE[status]]
        closing = False
        for name, value in (*cycle.default_headers, *headers):
            parts += (name, b": ", value, b"\r\n")
            if name == b"connection" and b"close" in value.lower():
                closing = True
        if not cycle.keep_alive and not closing:  # the client asked to close (or HTTP/1.0)
            parts.append(b"connection: close\r\n")
        cycle.keep_alive = cycle.keep_alive and not closing
        if status not in (204, 304):  # RFC 9110 §8.6: no Content-Length on these
            parts.append(b"content-length: %d\r\n" % len(body))
        parts += (b"\r\n", b"" if cycle.scope["method"] == "HEAD" else body)
        cycle.transport.write(b"".join(parts))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()
        return True

    def body_received(self, scope: Scope) -> bool:
        """True when the whole request body is already here: reading it cannot stall."""
        cycle = self._cycle_of(scope)
        return cycle is not None and not cycle.more_body

    def channel(self, scope: Scope) -> DirectChannel | None:
        """A direct channel for this request's streaming body, or None (use `send`)."""
        cycle = self._cycle_of(scope)
        if cycle is None:
            return None
        channel = DirectChannel(cycle)
        self._channels = [c for c in self._channels if not c.finished]
        self._channels.append(channel)
        return channel

    def lost(self) -> None:
        channels, self._channels = self._channels, []
        for channel in channels:
            channel.lost()


def connection_of(scope: Scope) -> Connection | None:
    connection = scope.get("extensions", {}).get(CONNECTION)
    return connection if isinstance(connection, Connection) else None


def hub_protocol(header_timeout: float) -> type[HttpToolsProtocol]:
    """An httptools protocol with header deadlines and direct writes."""
    period = min(1.0, header_timeout / 4)

    class HubProtocol(HttpToolsProtocol):
        # One sweep over this server's connections instead of two timers per request.
        _sweeper: asyncio.Task[None] | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Loop time since which the connection owes us a complete request head:
            # from the connection, or from the previous response (the idle keep-alive).
            self._waiting_since: float | None = None
            self._connection = Connection(self)
            self._extensions = {CONNECTION: self._connection}
            # Answering in place: the app's hook, the read in progress, the held request.
            self._answer_now: AnswerNow | None = getattr(self.app, "answer_now", None)
            self._reading = False
            self._held: tuple[RequestResponseCycle, Any] | None = None

        def data_received(self, data: bytes) -> None:
            self._reading = True
            try:
                super().data_received(data)
            finally:
                self._reading = False
                held, self._held = self._held, None
                if held is not None:  # its body is still on the way: the app reads it
                    super()._start_asgi_task(*held)

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
            # A POST /mcp request waits for the rest of this read: if its body is in it,
            # on_message_complete may answer it without an ASGI task at all.
            if (
                self._reading
                and self._held is None
                and self._answer_now is not None
                and app is self.app
                and cycle.scope["method"] == "POST"
                and cycle.scope["path"] == "/mcp"
            ):
                self._held = (cycle, app)
                return
            super()._start_asgi_task(cycle, app)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            held = self._held
            if held is None or held[0] is not self.cycle:
                return
            self._held = None
            if not self._answered(held[0]):
                super()._start_asgi_task(*held)

        def _answered(self, cycle: RequestResponseCycle) -> bool:
            assert self._answer_now is not None
            if cycle.response_started or cycle.disconnected or cycle.flow.write_paused:
                return False  # respond() could not write: leave it all to the app
            scope = cast(Scope, cycle.scope)
            try:
                reply = self._answer_now(scope, bytes(cycle.body))
            except Exception:
                self.logger.exception("answering in place failed; the app answers instead")
                return False
            if reply is None:
                return False
            status, body, headers = reply[0], reply[1], reply[2]
            return self._connection.respond(scope, status, headers, body)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._waiting_since = self.loop.time()
            cls = type(self)
            if cls._sweeper is None or cls._sweeper.done():
                cls._sweeper = self.loop.create_task(self._sweep(self.connections))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope["extensions"] = self._extensions  # type: ignore[typeddict-item]
            if self._waiting_since is None:  # a head pipelined behind a complete one
                self._waiting_since = self.loop.time()

        def on_headers_complete(self) -> None:
            self._waiting_since = None
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            # uvicorn's, with the deadline above in place of its keep-alive timer.
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            elif self._waiting_since is None:
                self._waiting_since = self.loop.time()

        def connection_lost(self, exc: Exception | None) -> None:
            self._waiting_since = None
            super().connection_lost(exc)
            self._connection.lost()

        @staticmethod
        async def _sweep(connections: set[Any]) -> None:
            """Close connections that owe a request head for longer than the deadline;
            ends with the last connection (the next one starts it again)."""
            loop = asyncio.get_running_loop()
            while connections:
                await asyncio.sleep(period)
                overdue = loop.time() - header_timeout
                for protocol in list(connections):
                    since = getattr(protocol, "_waiting_since", None)
                    if since is not None and since <= overdue:
                        protocol._waiting_since = None
                        if not protocol.transport.is_closing():
                            protocol.transport.close()

    return HubProtocol
