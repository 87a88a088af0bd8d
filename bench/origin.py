"""The origin baseline: what a user has without the hub, on the `mcp` 2.3.0 Python SDK.

An `MCPServer` with a tasks extension that serves `tasks/get` itself, from a dict in
memory, over the SDK's stateless Streamable HTTP transport (JSON responses, the SDK's
fastest mode) on uvicorn with uvloop and httptools, as the hub runs. The dict is fed by
the same bucket watch as the raw ceiling, so all three servers answer the same states;
a real origin would hold its tasks because it runs them, which costs it no less.

It also counts every `POST /mcp` it receives (`GET /stats`): with the hub in front,
that count is the poll load the fleet no longer sees.

Run: `python -m bench.origin --nats-url URL --bucket NAME --port N` (loopback only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import msgspec
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.processes import reference_server_main
from bench.watch import BucketWatch
from bridge.vocabulary import TASKS_EXTENSION


class TaskIdParams(RequestParams):
    task_id: str


class _Envelope(msgspec.Struct):
    task: dict[str, Any]


_envelope_decoder = msgspec.json.Decoder(_Envelope)


class TaskMemory:
    """The origin's own tasks, as plain dicts (what an SDK handler returns)."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}

    def put(self, key: str, data: bytes) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            self.tasks[key] = _envelope_decoder.decode(data).task

    def delete(self, key: str) -> None:
        self.tasks.pop(key, None)


class TasksGet(Extension):
    """The tasks extension, reduced to the one method a poller needs."""

    identifier = TASKS_EXTENSION

    def __init__(self, memory: TaskMemory) -> None:
        self.memory = memory

    def methods(self) -> Sequence[MethodBinding]:
        return [MethodBinding("tasks/get", TaskIdParams, self._get)]

    async def _get(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any]:
        task = self.memory.tasks.get(params.task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return {"resultType": "complete", **task}


class Counted:
    """ASGI wrapper: counts `POST /mcp`, answers `/readyz` and `/stats` itself."""

    def __init__(self, app: ASGIApp, watch: BucketWatch) -> None:
        self.app = app
        self.watch = watch
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/readyz":
                await _plain(send, 200 if self.watch.ready.is_set() else 503, b"")
                return
            if path == "/stats":
                await _plain(send, 200, msgspec.json.encode({"requests": self.requests}))
                return
            self.requests += 1
        await self.app(scope, receive, send)


async def _plain(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_app(memory: TaskMemory, watch: BucketWatch) -> Counted:
    server: MCPServer[Any] = MCPServer("bench-origin", extensions=[TasksGet(memory)])
    app = server.streamable_http_app(stateless_http=True, json_response=True)
    return Counted(app, watch)


async def serve(nats_url: str, bucket: str, host: str, port: int) -> None:
    memory = TaskMemory()
    watch = BucketWatch(memory.put, memory.delete)
    await watch.start(nats_url, bucket)
    config = uvicorn.Config(
        build_app(memory, watch),
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="on",
        backlog=4096,
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await watch.close()


def main() -> None:
    reference_server_main("python -m bench.origin", __doc__, serve)


if __name__ == "__main__":
    main()
