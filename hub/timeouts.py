"""Slow clients may not hold connections: headers and bodies have deadlines.

uvicorn's only timer is the keep-alive one, armed after a response and cancelled by
the first byte that arrives, so a client that trickles its headers one byte at a time
would keep the connection forever. This protocol gives every request head its own
deadline, from the connection (or the request's first byte on a kept-alive
connection) to the end of its headers, and reuses the same span as the idle
keep-alive. Bodies get their own deadline where they are read (hub/app.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def guarded_protocol(header_timeout: float) -> type[HttpToolsProtocol]:
    """An httptools protocol that closes connections whose headers take too long."""

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = header_timeout  # type: ignore[assignment]
            self._header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_deadline is None:  # a later request on a kept-alive connection
                self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

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

    return HeaderDeadlineProtocol
