"""A poll-only MCP Tasks server that keeps its tasks in its own memory and writes no NATS.

It stands in for the servers the hub fronts without a bridge (C#, Go, TypeScript …): the
task state lives here only, so clients follow it by polling `tasks/get` at this server
(through the hub's front door or directly). Stateless Streamable HTTP 2026-07-28, one
JSON-RPC request per POST, answered `application/json`; with `sse=True`, `tools/call`
is answered as a one-event `text/event-stream`, as the `mcp` SDK answers by default.

Tools `slow`, `ask` and `fail` answer a caller that declares `io.modelcontextprotocol/tasks`
in the request's own `_meta` (H30) with a flat CreateTaskResult; asyncio timers move each
task along, and `OwnStoreServer.set_status` lets a test move one from outside. With
`tokens`, a task belongs to the bearer token that created it and is "not found" for any
other (H46). `GET /stats` counts requests per method; `POST /reset-stats` zeroes it.

Only the wire types (`bridge.wire`) and names (`bridge.vocabulary`) are shared with the hub.

Run: python -m examples.own_store.server --port N [--token T ...] [--sse]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bridge.wire import Status, TaskError
from examples.own_store.rpc import (
    COMPLETE_ACK,
    Checked,
    RequestId,
    RpcError,
    accepts_event_stream,
    check_call,
    encode_error,
    encode_response,
    encode_result,
    invalid_params,
    read_call,
    task_result,
    unauthorized,
)
from examples.own_store.tasks import (
    DISCOVER_RESULT,
    TOOLS,
    TOOLS_LIST_RESULT,
    TaskStore,
    Tool,
    Work,
    tool_result,
)

DEFAULT_TTL_MS = 60_000
DEFAULT_POLL_INTERVAL_MS = 500
# After SIGTERM, how long open requests (a long inline `slow`) may run before uvicorn
# cancels them; without a bound, a client holding a connection keeps the process alive.
SHUTDOWN_GRACE_S = 2

# Keys of the stats that are not methods: requests refused before a method was read.
UNAUTHORIZED_KEY = "(unauthorized)"
INVALID_KEY = "(invalid)"

# -- HTTP ------------------------------------------------------------------------------------

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# JSON may carry these raw, but line splitters such as `str.splitlines` cut a `data:` line there.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def sse_event(data: bytes) -> bytes:
    text = data.decode()
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return b"event: message\ndata: " + text.encode() + b"\n\n"


def json_response(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(body, status, headers, media_type="application/json")


def error_response(request_id: RequestId | None, err: RpcError) -> Response:
    return json_response(encode_error(request_id, err), err.http_status, err.headers)


class OwnStoreServer:
    """The server as an ASGI app (the object itself, or `.app`), with its store and counters.

    `tokens`: when given, every request needs `Authorization: Bearer <one of them>` and each
    task belongs to the token that created it; None runs open, every task shared.
    `ttl_ms` (None: unlimited) and `poll_interval_ms` (None: not advertised) go on every task;
    `sse=True` answers `tools/call` as an event stream when the client's Accept allows it.
    """

    def __init__(
        self,
        *,
        tokens: Collection[str] | None = None,
        ttl_ms: int | None = DEFAULT_TTL_MS,
        poll_interval_ms: int | None = DEFAULT_POLL_INTERVAL_MS,
        sse: bool = False,
    ) -> None:
        self.tokens = None if tokens is None else frozenset(tokens)
        self.sse = sse
        self.store = TaskStore(ttl_ms, poll_interval_ms)
        self.stats: Counter[str] = Counter()
        self._handlers: dict[str, Callable[[Checked], bytes]] = {
            "server/discover": self._discover,
            "tools/list": self._tools_list,
            "tasks/get": self._tasks_get,
            "tasks/update": self._tasks_update,
            "tasks/cancel": self._tasks_cancel,
        }
        self.app = Starlette(
            routes=[
                Route("/mcp", self._mcp, methods=["POST"]),
                Route("/stats", self._stats, methods=["GET"]),
                Route("/reset-stats", self._reset_stats, methods=["POST"]),
                Route("/readyz", self._ready, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # -- the test hooks ------------------------------------------------------------------------

    def set_status(
        self,
        task_id: str,
        status: Status,
        *,
        message: str | None = None,
        input_requests: dict[str, dict[str, Any]] | None = None,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Move a task from outside; its own timers stop, so the caller drives it from here.

        Raises KeyError for a task that is not stored (or expired), TerminalTask for a
        terminal one, ValueError when the variant field does not fit `status` (H39).
        """
        entry = self.store.live(task_id)
        if entry is None:
            raise KeyError(task_id)
        task_error = None if error is None else msgspec.convert(error, TaskError)
        self.store.change(
            entry,
            status,
            message=message,
            input_requests=input_requests,
            result=result,
            error=task_error,
        )
        self.store.stop(entry)  # only once the change stands: a refused one leaves all as it was

    def task(self, task_id: str) -> dict[str, Any] | None:
        """A live task's DetailedTask as JSON values, whoever owns it; None if there is none."""
        entry = self.store.live(task_id)
        return None if entry is None else json.loads(entry.encoded)

    def reset_stats(self) -> None:
        self.stats.clear()

    # -- HTTP --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self.store.close()

    async def _stats(self, _: Request) -> Response:
        return json_response(msgspec.json.encode(dict(self.stats)))

    async def _reset_stats(self, _: Request) -> Response:
        self.reset_stats()
        return Response(status_code=204)

    async def _ready(self, _: Request) -> Response:
        return Response(status_code=204)

    async def _mcp(self, request: Request) -> Response:
        """Steps in the order of docs/protocol.md#validation-order: auth, envelope, headers."""
        headers = request.headers
        try:
            caller = self._caller(headers)
        except RpcError as err:
            self.stats[UNAUTHORIZED_KEY] += 1
            return error_response(None, err)
        try:
            call = read_call(await request.body())
        except RpcError as err:
            self.stats[INVALID_KEY] += 1
            return error_response(err.request_id, err)
        self.stats[call.method] += 1
        if call.id is None:
            return Response(status_code=202)  # H6: notifications are accepted and ignored
        try:
            checked = check_call(headers, call, caller)
            if checked.method != "tools/call":
                return json_response(
                    encode_response(checked.id, self._handlers[checked.method](checked))
                )
            work = self._tools_call(checked)  # bad params are answered before any stream starts
            if self.sse and accepts_event_stream(headers):
                return self._event_stream(checked.id, work)
            return json_response(encode_response(checked.id, await work()))
        except RpcError as err:
            return error_response(call.id, err)

    def _caller(self, headers: Headers) -> str:
        """Whose request this is: its bearer token, or "" on an open server."""
        if self.tokens is None:
            return ""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        # A test server: a set lookup, not a constant-time comparison.
        if scheme.lower() != "bearer" or token not in self.tokens:
            raise unauthorized(presented=bool(token))
        return token

    def _event_stream(self, request_id: RequestId, work: Work) -> Response:
        """The head at once, then one `message` event with the answer, then the end."""

        async def events() -> AsyncIterator[bytes]:
            try:
                body = encode_response(request_id, await work())
            except RpcError as err:  # the 200 head is out: the error travels as the event
                body = encode_error(request_id, err)
            yield sse_event(body)

        return StreamingResponse(events(), headers=SSE_HEADERS, media_type="text/event-stream")

    # -- methods -----------------------------------------------------------------------------

    def _discover(self, _: Checked) -> bytes:
        return DISCOVER_RESULT

    def _tools_list(self, _: Checked) -> bytes:
        return TOOLS_LIST_RESULT

    def _tools_call(self, checked: Checked) -> Work:
        """Validate the call now; return the work that answers it."""
        name = checked.params.get("name")
        arguments = checked.params.get("arguments", {})
        if not isinstance(name, str):
            raise invalid_params("params.name must be a string")
        if not isinstance(arguments, dict):
            raise invalid_params("params.arguments must be an object")
        tool = TOOLS.get(name)
        if tool is None:
            raise invalid_params(f"Unknown tool: {name[:120]}")
        try:
            args = msgspec.convert(arguments, tool.args)
        except msgspec.ValidationError as exc:
            # A tool execution error, as the SDK answers bad arguments; it costs no task.
            text = f"Invalid arguments for tool {name}: {exc}"
            invalid = encode_result(tool_result(text, isError=True))
            return lambda: _at_once(invalid)
        if checked.declared:  # H33: a task only for a caller that declared the extension
            entry = self.store.create(checked.caller)
            created = task_result("task", entry.encoded)  # the seed, before the body moves it
            tool.start(self.store, entry, args)
            return lambda: _at_once(created)
        return lambda: _inline(tool, args)

    def _tasks_get(self, checked: Checked) -> bytes:
        entry = self.store.find(checked.task_id, checked.caller)
        return task_result("complete", entry.encoded)

    def _tasks_update(self, checked: Checked) -> bytes:
        entry = self.store.find(checked.task_id, checked.caller)
        self.store.answer(entry, checked.input_responses)
        return COMPLETE_ACK

    def _tasks_cancel(self, checked: Checked) -> bytes:
        entry = self.store.find(checked.task_id, checked.caller)
        self.store.cancel(entry)
        return COMPLETE_ACK


async def _at_once(body: bytes) -> bytes:
    return body


async def _inline(tool: Tool, args: Any) -> bytes:
    return encode_result(await tool.run(args))


# -- as a process --------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn that exits 0 after SIGTERM/SIGINT instead of re-raising the signal."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.own_store.server",
        description="A poll-only MCP Tasks server with its own in-memory store.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--token", action="append", help="accept this bearer token (repeatable); none: open"
    )
    parser.add_argument("--poll-interval-ms", type=int, default=DEFAULT_POLL_INTERVAL_MS)
    parser.add_argument("--ttl-ms", type=int, default=DEFAULT_TTL_MS)
    parser.add_argument("--sse", action="store_true", help="answer tools/call as an event stream")
    parser.add_argument(
        "--shutdown-grace",
        type=int,
        default=SHUTDOWN_GRACE_S,
        help="seconds open requests get after SIGTERM before they are cut",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    server = OwnStoreServer(
        tokens=args.token,
        ttl_ms=args.ttl_ms,
        poll_interval_ms=args.poll_interval_ms,
        sse=args.sse,
    )
    config = uvicorn.Config(
        server,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=args.shutdown_grace,
    )
    asyncio.run(_Server(config).serve())


if __name__ == "__main__":
    main()
