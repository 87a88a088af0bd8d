"""The hub's HTTP connections: uvicorn's httptools protocol plus two things it lacks.

Deadlines. uvicorn's only timer is the keep-alive one, armed after a response and
cancelled by the first byte that arrives, so a client that trickles its headers one
byte at a time would keep the connection forever. Every request head here has its own
deadline, from the connection (or the request's first byte on a kept-alive connection)
to the end of its headers, and the idle keep-alive uses the same span. Bodies get
their own deadline where they are read (hub/app.py).

A direct channel. ASGI's `send` is a coroutine, so pushing a frame through it costs a
task wake-up per stream and frame; with thousands of streams following one task that
is most of the hub's CPU. Each request's scope carries a `DirectChannel` under
`extensions["taskhub.direct"]` through which the fan-out writes chunks of a streaming
body straight to the socket while the socket takes them, and learns at once when the
connection is lost. A stream whose socket buffer is full goes back to awaiting `send`,
which waits for the drain. Under another ASGI server the extension is absent and every
write takes the ordinary path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

DIRECT_CHANNEL = "taskhub.direct"


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


def direct_channel(scope: Scope) -> DirectChannel | None:
    channel = scope.get("extensions", {}).get(DIRECT_CHANNEL)
    return channel if isinstance(channel, DirectChannel) else None


def hub_protocol(header_timeout: float) -> type[HttpToolsProtocol]:
    """An httptools protocol with header deadlines and direct channels."""

    class HubProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = header_timeout  # type: ignore[assignment]
            self._header_deadline: asyncio.TimerHandle | None = None
            self._channels: list[DirectChannel] = []

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_deadline is None:  # a later request on a kept-alive connection
                self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            previous = self.cycle
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is None or cycle is previous:  # an upgrade: no request cycle
                return
            channel = DirectChannel(cycle)
            cycle.scope.setdefault("extensions", {})[DIRECT_CHANNEL] = channel  # type: ignore[assignment]
            # Usually one; a request pipelined behind a stream keeps the stream's channel.
            self._channels = [c for c in self._channels if not c.finished]
            self._channels.append(channel)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)
            channels, self._channels = self._channels, []
            for channel in channels:
                channel.lost()

        def _arm_header_deadline(self) -> None:
            self._header_deadline = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return HubProtocol
