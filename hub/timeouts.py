"""Slow clients may not hold connections: headers and bodies have deadlines.

uvicorn arms its keep-alive timer only after a response, so a client that connects
and trickles its headers forever would keep the connection. This protocol arms the
same timer as soon as the connection is made; uvicorn cancels it once the headers are
complete, and re-arms it between requests. Bodies get their own deadline where they
are read (hub/app.py).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def guarded_protocol(header_timeout: float) -> type[HttpToolsProtocol]:
    """An httptools protocol that closes connections whose headers take too long."""

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(
                header_timeout, self.timeout_keep_alive_handler
            )

    return HeaderDeadlineProtocol
