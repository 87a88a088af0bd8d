"""Wiring: the Starlette application, its lifespan, and the `POST /mcp` endpoint.

`/mcp` is a plain ASGI callable so the JSON-RPC fast path pays for no framework
layers: read the body, validate (hub/protocol.py), dispatch (hub/handlers.py),
answer. Checks run in the order of the wire digest §2.5, all before any SSE byte.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from hub import handlers, jsonrpc
from hub.config import Config
from hub.protocol import Notification, RequestError, parse_request
from hub.runtime import Hub

log = logging.getLogger("taskhub.http")

ANONYMOUS = "anonymous"
LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1"}
KNOWN_METHODS = {
    "server/discover",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "subscriptions/listen",
}
JSON_HEADERS = [(b"content-type", b"application/json")]


def origin_allowed(origin: str | None) -> bool:
    """H4: browsers send Origin; only loopback pages may call a hub by default."""
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in LOOPBACK_HOSTS


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class McpEndpoint:
    """`POST /mcp`, Streamable HTTP 2026-07-28, stateless."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = self.hub.metrics
        if scope["method"] != "POST":  # H2
            await _respond(send, 405, b"", [(b"allow", b"POST")])
            return
        headers = Headers(scope=scope)
        if not origin_allowed(headers.get("origin")):
            await _error(
                send,
                None,
                jsonrpc.RpcError(jsonrpc.INVALID_REQUEST, "Origin not allowed", http_status=403),
            )
            metrics.requests.inc(1, "-", "forbidden")
            return
        body = await _read_body(receive, self.hub.config.max_body_bytes)
        if body is None:
            await _error(
                send,
                None,
                jsonrpc.RpcError(
                    jsonrpc.INVALID_REQUEST, "Request body too large", http_status=413
                ),
            )
            metrics.requests.inc(1, "-", "too_large")
            return
        try:
            message = parse_request(headers, body)
        except RequestError as exc:
            await _error(send, exc.request_id, exc.error)
            metrics.requests.inc(1, _method_label(exc.method), str(exc.error.code))
            return
        if isinstance(message, Notification):  # H6
            await _respond(send, 202, b"", [])
            metrics.requests.inc(1, "notification", "accepted")
            return
        principal = ANONYMOUS
        try:
            if message.method == "server/discover":
                answer = handlers.discover(message)
            elif message.method == "tasks/get":
                answer = await handlers.tasks_get(self.hub, message, principal)
            elif message.method == "tasks/update":
                answer = await handlers.tasks_update(self.hub, message, principal)
            elif message.method == "tasks/cancel":
                answer = await handlers.tasks_cancel(self.hub, message, principal)
            elif message.method == "subscriptions/listen":
                stream = await handlers.subscriptions_listen(self.hub, message, principal)
                metrics.requests.inc(1, message.method, "ok")
                await stream(scope, receive, send)
                return
            else:
                raise jsonrpc.method_not_found(message.method)
        except jsonrpc.RpcError as err:
            await _error(send, message.id, err)
            metrics.requests.inc(1, message.method, str(err.code))
            return
        await _respond(send, 200, answer, JSON_HEADERS)
        metrics.requests.inc(1, message.method, "ok")


def _method_label(method: str | None) -> str:
    """Keep the metric's label set bounded: unknown methods share one label."""
    return method if method in KNOWN_METHODS else "-"


async def _error(send: Send, request_id: jsonrpc.RequestId | None, err: jsonrpc.RpcError) -> None:
    headers = [*JSON_HEADERS, *((k.encode(), v.encode()) for k, v in err.headers.items())]
    await _respond(send, err.http_status, jsonrpc.encode_error(request_id, err), headers)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it exceeds `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def create_app(config: Config, nats_url: str, hub: Hub | None = None) -> Starlette:
    """The hub as an ASGI app; `hub` may be passed in to share it with the caller."""
    hub = hub or Hub(config, nats_url)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        log.info("hub serving bucket %r", config.bucket)
        try:
            yield
        finally:
            await hub.stop()

    async def healthz(request: HttpRequest) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: HttpRequest) -> Response:
        if hub.ready:
            return PlainTextResponse("ready\n")
        return PlainTextResponse("not ready\n", status_code=503)

    async def metrics(request: HttpRequest) -> Response:
        return Response(hub.metrics.render(), media_type="text/plain; version=0.0.4")

    app = Starlette(
        routes=[
            Route("/mcp", McpEndpoint(hub)),  # every HTTP method: non-POST gets 405 there
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ],
        lifespan=lifespan,
    )
    app.state.hub = hub
    return app
