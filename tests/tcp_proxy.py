"""A byte-level TCP proxy on 127.0.0.1 that can reset or stall every connection it carries.

The chaos run puts one in front of each hub for the SSE clients (client → proxy → hub) and
one per (hub, NATS node) pair for each hub's own NATS connection (hub → proxy → node), so
a fault can cut or freeze a client's streams or a hub's NATS link without touching the
processes; a partitionable cluster (tests/cluster.py) routes its nodes to each other
through them. It does not parse anything: `reset()` closes both sockets of every open
pair, `stall(s)` stops moving bytes in both directions for `s` seconds (data waits in
buffers). `cut()` lasts until `heal()`: reset, every connection is closed and every new
one refused; silent, bytes stop moving both ways and new connections wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class TcpProxy:
    def __init__(self, upstream_port: int, name: str = "") -> None:
        self.upstream_port = upstream_port
        self.name = name
        self.server: asyncio.Server | None = None
        self.port = 0
        self.resets = 0
        self._stalled_until = 0.0
        self._cut: str | None = None  # "reset" or "silent" until heal()
        self._healed = asyncio.Event()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    def reset(self) -> int:
        """Close every open connection (both sides); returns how many were open."""
        pairs = list(self._pairs)
        for pair in pairs:
            for writer in pair:
                transport = writer.transport
                with contextlib.suppress(Exception):
                    transport.abort()  # RST-like: no graceful FIN handshake
        self.resets += 1
        return len(pairs)

    def stall(self, seconds: float) -> None:
        """Stop forwarding bytes for `seconds` (new connections are accepted but wait)."""
        self._stalled_until = max(self._stalled_until, time.monotonic() + seconds)

    def cut(self, *, silent: bool = False) -> None:
        """Cut the link until `heal()`: closed and refused, or (silent) no byte moves."""
        self._cut = "silent" if silent else "reset"
        self._healed.clear()
        if not silent:
            self.reset()

    def heal(self) -> None:
        self._cut = None
        self._healed.set()

    @property
    def is_cut(self) -> bool:
        return self._cut is not None

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._carry(client_r, client_w)
        except asyncio.CancelledError:
            pass  # stop(): asyncio's connection callback must not see a cancelled task
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _carry(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._cut == "reset":
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream_port), 3.0
            )
        except (OSError, TimeoutError):
            client_w.transport.abort()
            return
        pair = (client_w, server_w)
        self._pairs.add(pair)
        up = asyncio.create_task(self._pipe(client_r, server_w))
        down = asyncio.create_task(self._pipe(server_r, client_w))
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            self._pairs.discard(pair)
            for writer in pair:
                with contextlib.suppress(Exception):
                    writer.close()

    async def _unstalled(self) -> None:
        """Return once no stall or silent cut is in force (polled: a stall may be extended)."""
        while True:
            if self._cut == "silent":
                await self._healed.wait()
                continue
            wait = self._stalled_until - time.monotonic()
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, 0.2))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await reader.read(65536)
                if not data:
                    with contextlib.suppress(Exception):
                        writer.write_eof()
                    return
                await self._unstalled()
                writer.write(data)
                await writer.drain()
