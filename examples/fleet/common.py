"""What both fleet servers share: a lifespan that runs task tools on a bridge, and `main`.

Each server process has its own server id, because the control subject names one process:
the tool body waiting for an answer lives there and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from bridge import TaskBridge
from bridge.events import DEFAULT_SERVICE
from bridge.mcp_server import TaskTools

Connect = Callable[[], Awaitable[TaskBridge]]
# After SIGTERM, how long open requests (a listen stream, a long inline tool call) may run
# before uvicorn cancels them; without a bound a client holding a stream stops nothing.
SHUTDOWN_GRACE_S = 3
Lifespan = Callable[[MCPServer[Any]], AbstractAsyncContextManager[dict[str, Any]]]


def task_lifespan(tasks: TaskTools, connect: Connect) -> Lifespan:
    """An MCPServer lifespan: open the bridge, run task tools on it, close it at the end."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        bridge = await connect()
        try:
            async with tasks.serving(bridge):
                yield {}
        finally:
            await bridge.close()

    return lifespan


class ReadyFileServer(uvicorn.Server):
    """uvicorn that writes its URL to a file once it listens (the port may be 0), and
    exits 0 after a SIGTERM/SIGINT stop instead of re-raising the signal."""

    def __init__(self, config: uvicorn.Config, ready_file: Path | None) -> None:
        super().__init__(config)
        self.ready_file = ready_file

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.ready_file is not None:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            temporary = self.ready_file.with_suffix(".tmp")
            temporary.write_text(f"http://{host}:{port}/mcp\n")
            os.replace(temporary, self.ready_file)  # readers never see half a URL

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def strip_header_whitespace(app: ASGIApp) -> ASGIApp:
    """Spaces and tabs around a header value are not part of it (RFC 9110 §5.5).

    uvicorn's httptools parser keeps trailing ones and the SDK compares `Mcp-Name` as
    received, so `Mcp-Name: greet  ` would not match `greet` (the conformance suite's
    http-header-validation checks it)."""

    async def stripped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [(name, value.strip(b" \t")) for name, value in scope["headers"]]
            scope = {**scope, "headers": headers}
        await app(scope, receive, send)

    return stripped


def main(
    name: str,
    build: Callable[[Connect, str], MCPServer[Any]],
    argv: Sequence[str] | None,
    *,
    prog: str | None = None,
) -> None:
    """The command line of a server on the bridge: `build(connect, service)` makes it."""
    parser = argparse.ArgumentParser(prog=prog or f"python -m examples.fleet.{name}")
    parser.add_argument("--nats-url", required=True, help="the NATS the hub reads")
    parser.add_argument("--server-id", default=f"{name}-1", help="unique per process")
    parser.add_argument("--bucket", default="mcp-tasks")
    parser.add_argument(
        "--service",
        default=DEFAULT_SERVICE,
        help="its name at the hub (--upstream NAME=URL), for fleet change events",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument("--ready-file", type=Path, help="write the server's URL here")
    parser.add_argument(
        "--shutdown-grace",
        type=int,
        default=SHUTDOWN_GRACE_S,
        help="seconds open requests get after SIGTERM before they are cut",
    )
    args = parser.parse_args(argv)

    def connect() -> Awaitable[TaskBridge]:
        return TaskBridge.connect(args.nats_url, server_id=args.server_id, bucket=args.bucket)

    # 2026-07-28 requests are served statelessly whatever the flag; it keeps legacy
    # (initialize) clients sessionless too, as a horizontally scaled fleet needs.
    app = build(connect, args.service).streamable_http_app(stateless_http=True, host=args.host)
    config = uvicorn.Config(
        strip_header_whitespace(app),
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=args.shutdown_grace,
        lifespan="on",
    )
    asyncio.run(ReadyFileServer(config, args.ready_file).serve())
