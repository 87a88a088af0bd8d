"""Wiring: the ASGI application, its lifespan, and the `POST /mcp` endpoint.

`/mcp` is a plain ASGI callable reached before any Starlette layer, so the JSON-RPC
fast path pays for no framework: read the body, validate (hub/protocol.py), dispatch
(hub/handlers.py), answer. Starlette serves the health, readiness and metrics routes.
Checks run in the order of the wire digest §2.5, all before any SSE byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from hub import handlers, jsonrpc
from hub.auth import AuthError, Identity, credentials_from
from hub.config import Config
from hub.connection import connection_of
from hub.cors import is_preflight, preflight_headers
from hub.cors import response_headers as cors_response_headers
from hub.protocol import Notification, Request, RequestError, parse_request
from hub.runtime import Hub
from hub.sse import ListenStream

log = logging.getLogger("taskhub.http")

ANONYMOUS = "anonymous"
KNOWN_METHODS = {
    "server/discover",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "subscriptions/listen",
}
JSON = (b"content-type", b"application/json")
RawHeaders = list[tuple[bytes, bytes]]


class BodyError(Exception):
    """The body could not be read whole: too large (413) or too slow (408)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _respond(scope: Scope, send: Send, status: int, body: bytes, headers: RawHeaders) -> None:
    """A complete response: in one write where the connection allows (hub/connection.py)."""
    connection = connection_of(scope)
    if connection is not None and connection.respond(scope, status, headers, body):
        return
    if status not in (204, 304):
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _encode_headers(headers: dict[str, str]) -> RawHeaders:
    return [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]


class McpEndpoint:
    """`POST /mcp`, Streamable HTTP 2026-07-28, stateless."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.config = hub.config
        self.cors_origins = frozenset(hub.config.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        cors = [] if origin is None else self._cors(origin)
        outcome, method, stream = await self._handle(scope, receive, send, headers, origin, cors)
        self.hub.metrics.requests.inc(1, method, outcome)
        if stream is not None:
            # Run outside _handle: a stream lives for hours, the request's body need not.
            await stream(scope, receive, _adding(send, cors))

    def _cors(self, origin: str) -> RawHeaders:
        return _encode_headers(cors_response_headers(origin, self.cors_origins))

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Headers,
        origin: str | None,
        cors: RawHeaders,
    ) -> tuple[str, str, ListenStream | None]:
        """Answer one request, or return the listen stream that answers it; with the
        outcome and method for the metrics."""
        config = self.config
        if scope["method"] != "POST":  # H2
            if is_preflight(scope["method"], headers):
                allowed = preflight_headers(origin, self.cors_origins)
                await _respond(scope, send, 204 if allowed else 403, b"", _encode_headers(allowed))
                return "preflight", "-", None
            await _respond(scope, send, 405, b"", [(b"allow", b"POST"), *cors])
            return "405", "-", None
        if origin is not None and not config.origin_allowed(origin):  # H4
            err = jsonrpc.RpcError(jsonrpc.INVALID_REQUEST, "Origin not allowed", http_status=403)
            await _error(scope, send, None, err, cors)
            return "403", "-", None
        try:
            identity = self._authenticate(headers)
        except AuthError as exc:  # H67
            await _unauthorized(scope, send, exc, cors)
            return str(exc.status), "-", None
        try:
            body = await _read_body(scope, receive, config.max_body_bytes, config.body_timeout)
        except BodyError as exc:
            err = jsonrpc.RpcError(jsonrpc.INVALID_REQUEST, str(exc), http_status=exc.status)
            # 408: hang up (RFC 9110 §15.5.9), or the slow client keeps the connection by
            # trickling on. Not 413: a client still sending would get a reset, not the answer.
            close = [(b"connection", b"close")] if exc.status == 408 else []
            await _error(scope, send, None, err, [*close, *cors])
            return str(exc.status), "-", None
        try:
            message = parse_request(headers, body)
        except RequestError as exc:
            await _error(scope, send, exc.request_id, exc.error, cors)
            return str(exc.error.code), _method_label(exc.method), None
        if isinstance(message, Notification):  # H6
            await _respond(scope, send, 202, b"", cors)
            return "accepted", "notification", None
        try:
            answer = await self._dispatch(message, identity)
        except jsonrpc.RpcError as err:
            await _error(scope, send, message.id, err, cors)
            return str(err.code), message.method, None
        if isinstance(answer, ListenStream):
            return "ok", message.method, answer
        await _respond(scope, send, 200, answer, [JSON, *cors])
        return "ok", message.method, None

    def _authenticate(self, headers: Headers) -> Identity:
        authenticator = self.hub.authenticator
        if authenticator is None:
            return Identity(ANONYMOUS, None)
        credentials = credentials_from(
            "POST",
            headers,
            own_origin=self.config.own_origin,
            allowed_origins=frozenset(self.config.cors_origins),
        )
        if credentials is None:
            raise AuthError.missing()
        return authenticator.authenticate(credentials[0])

    async def _dispatch(self, request: Request, identity: Identity) -> bytes | ListenStream:
        hub, principal = self.hub, identity.principal
        if request.method == "server/discover":
            return handlers.discover(request)
        if request.method == "tasks/get":
            return await handlers.tasks_get(hub, request, principal)
        if request.method == "tasks/update":
            return await handlers.tasks_update(hub, request, principal)
        if request.method == "tasks/cancel":
            return await handlers.tasks_cancel(hub, request, principal)
        if request.method == "subscriptions/listen":
            return await handlers.subscriptions_listen(hub, request, identity)
        raise jsonrpc.method_not_found(request.method)


def _adding(send: Send, headers: RawHeaders) -> Send:
    """`send`, with `headers` added to the response start."""
    if not headers:
        return send

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return send_with_headers


def _method_label(method: str | None) -> str:
    """Keep the metric's label set bounded: unknown methods share one label."""
    return method if method in KNOWN_METHODS else "-"


async def _error(
    scope: Scope,
    send: Send,
    request_id: jsonrpc.RequestId | None,
    err: jsonrpc.RpcError,
    cors: RawHeaders,
) -> None:
    headers = [JSON, *_encode_headers(err.headers), *cors]
    await _respond(scope, send, err.http_status, jsonrpc.encode_error(request_id, err), headers)


async def _unauthorized(scope: Scope, send: Send, exc: AuthError, cors: RawHeaders) -> None:
    """401 (or 400) with the RFC 6750 challenge; the body says the same in JSON-RPC terms."""
    message = "Unauthorized" + (f": {exc.description}" if exc.description else "")
    err = jsonrpc.RpcError(jsonrpc.UNAUTHORIZED, message, http_status=exc.status)
    headers = [(b"www-authenticate", exc.www_authenticate().encode()), *cors]
    await _error(scope, send, None, err, headers)


async def _read_body(scope: Scope, receive: Receive, limit: int, timeout: float) -> bytes:
    """The whole request body, within `limit` bytes and `timeout` seconds (slowloris)."""
    connection = connection_of(scope)
    if connection is not None and connection.body_received(scope):
        return await _collect(receive, limit)  # it came with the headers: nothing to wait for
    try:
        async with asyncio.timeout(timeout):
            return await _collect(receive, limit)
    except TimeoutError:
        raise BodyError(408, f"Request body not received within {timeout:g}s") from None


async def _collect(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyError(413, f"Request body larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


class HubApp:
    """`/mcp` straight to its endpoint; the few other routes and the lifespan to Starlette."""

    def __init__(self, mcp: McpEndpoint, rest: Starlette) -> None:
        self.mcp = mcp
        self.rest = rest
        self.hub = mcp.hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp":
            await self.mcp(scope, receive, send)  # every HTTP method: non-POST gets 405 there
        else:
            await self.rest(scope, receive, send)


def create_app(config: Config, nats_url: str, hub: Hub | None = None) -> HubApp:
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

    rest = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ],
        lifespan=lifespan,
    )
    return HubApp(McpEndpoint(hub), rest)
