"""The front door's upstream: an MCP server with one cheap tool, on the `mcp` 2.3.0 Python SDK.

An `MCPServer` with a single tool, `echo` (returns its `text` argument), over the SDK's
stateless Streamable HTTP transport on uvicorn with uvloop and httptools, as the hub runs.
Nothing else: no NATS, no tasks, so what a `tools/call` costs here is the SDK's request
cycle and the tool is free. The front-door scenario (bench/scenarios.py) calls it directly
and through `taskhub serve --upstream`, and the difference is what the hub adds.

Answer form: the SDK's default (`json_response=False`) answers every `tools/call` as an SSE
stream (`text/event-stream`, one `event: message` with the result, then the stream ends),
which the hub relays chunk by chunk; `--json-response` makes it answer `application/json`,
which the hub reads whole and checks before sending it on.

It counts every `POST /mcp` it receives and the connections they came on (`GET /stats`), so
the scenario can check that each request through the hub reached it and see whether the
hub's connection pool reuses its connections; it answers `/readyz` itself for the harness.

Run: `python -m bench.upstream --port N [--json-response]` (loopback only).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import msgspec
import uvicorn
import uvloop
from mcp.server.mcpserver import Context, MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.processes import raise_fd_limit

TOOL = "echo"
PROGRESS_TOOL = "echo_progress"


class Counted:
    """ASGI wrapper: counts `POST /mcp` and the client connections (address and port) they
    came on, answers `/readyz` and `/stats` itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests = 0
        self.clients: set[tuple[str, int]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/readyz":
                await _plain(send, 200, b"")
                return
            if path == "/stats":
                stats = {"requests": self.requests, "connections": len(self.clients)}
                await _plain(send, 200, msgspec.json.encode(stats))
                return
            self.requests += 1
            client = scope.get("client")
            if client:
                self.clients.add((client[0], client[1]))
        await self.app(scope, receive, send)


async def _plain(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("bench-upstream")

    @server.tool(name=TOOL, description="Returns its text.")
    def echo(text: str) -> str:
        return text

    @server.tool(name=PROGRESS_TOOL, description="Reports progress once, then returns its text.")
    async def echo_progress(text: str, ctx: Context) -> str:
        await ctx.report_progress(1, 1)  # commits the answer to SSE (a progressToken is sent)
        return text

    return server


def build_app(json_response: bool) -> Counted:
    app = build_server().streamable_http_app(stateless_http=True, json_response=json_response)
    return Counted(app)


async def serve(host: str, port: int, json_response: bool) -> None:
    config = uvicorn.Config(
        build_app(json_response),
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        # The peer, not X-Forwarded-For: the hub sends that, and /stats counts connections.
        proxy_headers=False,
        lifespan="on",
        backlog=4096,
    )
    await uvicorn.Server(config).serve()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--json-response", action="store_true", help="answer application/json, not SSE"
    )
    args = parser.parse_args()
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, args.json_response))


if __name__ == "__main__":
    main()
