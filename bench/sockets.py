"""Loopback client sockets for the load generators: no Nagle, and closed with a reset.

SO_LINGER 0 closes with a reset and no TIME_WAIT, so repeated storms of 10k connections
never exhaust the loopback's ephemeral ports.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

_LINGER_RESET = struct.pack("ii", 1, 0)


async def connect(port: int, factory: Any) -> tuple[asyncio.Transport, Any]:
    """A connection to 127.0.0.1:`port` with the protocol `factory` makes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        transport, proto = await loop.create_connection(factory, sock=sock)
    except BaseException:
        sock.close()
        raise
    return transport, proto
