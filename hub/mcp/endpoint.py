"""`POST /mcp`: Streamable HTTP 2026-07-28, stateless, with no framework in the way.

Checks run in the order of docs/protocol.md#validation-order, all before any SSE byte: method
(405, CORS preflight), Origin (403), credentials (401), body (413/408), then the
message itself (hub/rpc/request.py) and its method (hub/mcp/handlers.py). Every check but the
body read and the dispatch is a plain function returning either what the next step
needs or the finished `Reply`, so the same code serves two entries:

- `__call__`, the ASGI app, for everything;
- `answer_now`, for the connection (hub/http/connection.py) once a whole request has
  arrived: it answers what needs no I/O (a `tasks/get` of the caller's own cached
  task, `server/discover`, every refusal) without starting an ASGI task, and declines
  the rest, before any side effect, to `__call__`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import Receive, Scope, Send

from hub.admission.auth import AuthError, Identity, credentials_from
from hub.front_door import forwarding
from hub.front_door.forward_call import Forwarding, Outgoing
from hub.front_door.forwarding import TrustedProxies
from hub.front_door.upstream import Answer, Upstream, UpstreamError
from hub.front_door.upstream_tasks import Caller, PassThrough
from hub.http.connection import WholeResponse, connection_of
from hub.http.cors import adding_headers, is_preflight, preflight_headers
from hub.http.cors import response_headers as cors_response_headers
from hub.mcp import handlers
from hub.push.listen_stream import ListenStream
from hub.push.subscriber import Subscriber
from hub.rpc import jsonrpc
from hub.rpc.request import (
    LEGACY_METHODS,
    METHODS,
    Forward,
    Notification,
    Request,
    RequestError,
    parse_request,
    plain_tasks_get,
)
from hub.rpc.routing_headers import encode_headers, header_map
from hub.runtime import Hub
from hub.store.snapshot import TaskSnapshot
from hub.store.source import StoreUnavailable

# The methods answered in place when cached (by their Mcp-Method header, a hint only:
# the app's path checks it against the body), and a missing header, which gets its error.
_ANSWERED_NOW = frozenset({"tasks/get", "server/discover", "subscriptions/listen", None})
# The hub's own methods that need I/O: the app's path (at an upstream's endpoint, every
# other method is forwarded, and a forward is started in place).
_HUBS_OWN = (METHODS | LEGACY_METHODS) - _ANSWERED_NOW
ANONYMOUS = Identity("anonymous", None)  # every caller when authentication is off
JSON = (b"content-type", b"application/json")
# The headers of most replies. Never changed: a connection encodes it once, by identity.
JSON_ONLY: list[tuple[bytes, bytes]] = [JSON]
RawHeaders = list[tuple[bytes, bytes]]


class Reply(WholeResponse, frozen=True, gc=False):
    """A finished answer, with the outcome and method labels for the request metric."""

    outcome: str
    method: str = "-"


class BodyError(Exception):
    """The body could not be read whole: too large (413) or too slow (408)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Responder = ListenStream | Forwarding


class McpEndpoint:
    """One MCP endpoint: the hub's own methods, and with an `upstream` all the others too."""

    def __init__(self, hub: Hub, upstream: Upstream | None = None) -> None:
        self.hub = hub
        self.upstream = upstream
        self.config = hub.config
        self.cors_origins = frozenset(hub.config.cors_origins)
        self.trusted = TrustedProxies(hub.config.trusted_proxies)
        self.heads = forwarding.OutgoingHeads(self.trusted)  # what each client head sends on

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cors, responder = await self._answer(scope, receive, send)
        if responder is not None:
            # Run here, not in _answer: a stream lives for hours, the request's headers
            # and parsed params need not. It answers on `send` itself, so its response
            # needs the CORS headers too.
            await responder(scope, receive, adding_headers(send, cors))

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[RawHeaders, Responder | None]:
        """Answer the request, or return what will (a listen stream, a forward) and its CORS."""
        headers = header_map(scope["headers"])
        cors, admitted = self._admit(scope["method"], headers)
        if isinstance(admitted, Reply):
            result: Reply | Responder = admitted
        else:
            result = await self._serve(scope, receive, headers, cors, admitted)
        if isinstance(result, ListenStream):
            self.hub.metrics.requests.inc(1, "subscriptions/listen", "ok")
            return cors, result
        if isinstance(result, Forwarding):
            return cors, result
        await self._reply(scope, send, result)
        return cors, None

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        headers: Mapping[str, str],
        cors: RawHeaders,
        identity: Identity,
    ) -> Reply | Responder:
        config = self.config
        head = list(scope["headers"])  # as checked: a chunked body's trailers never join it
        try:
            body = await read_body(scope, receive, config.max_body_bytes, config.body_timeout)
        except BodyError as exc:
            return _body_refused(exc, cors)
        request = self._parse(headers, body, cors)
        if isinstance(request, Reply):
            return request
        if isinstance(request, Forward):
            return self._forwarding(scope, head, headers, identity, request, body)
        try:
            if request.method == "server/discover" and self.upstream is not None:
                outgoing = self._outgoing(scope, head, identity)
                return await self._discover_upstream(outgoing, body, request, cors)
            meta = request.params.get("_meta")
            if request.task_id is not None and await self._upstreams_task(request.task_id):
                outgoing = self._outgoing(scope, head, identity)
                caller = self._caller(outgoing, identity, headers, meta)
                return await self._upstream_task(request, body, caller, cors)
            kept = None
            if request.method == "subscriptions/listen" and self.config.upstreams:
                outgoing = self._outgoing(scope, head, identity)
                kept = KeptListen(self, self._caller(outgoing, identity, headers, meta))
            answer = await self._dispatch(request, identity, kept)
        except jsonrpc.RpcError as err:
            return _error(request.id, err, cors, request.method)
        except PassThrough as passed:
            return _passed(passed.answer, cors, request.method)
        return answer if isinstance(answer, ListenStream) else _ok(request.method, answer, cors)

    # -- tasks an upstream keeps (hub/front_door/upstream_tasks.py) ---------------------------

    async def _upstreams_task(self, task_id: str) -> bool:
        return await upstreams_task(self.hub, task_id, self.upstream)

    def _caller(
        self, outgoing: Outgoing, identity: Identity, headers: Mapping[str, str], meta: Any
    ) -> Caller:
        credential = self.hub.upstream_tasks.credential(headers)
        meta = meta if isinstance(meta, dict) else {}
        return Caller(identity, credential, outgoing.headers, outgoing.caller, meta)

    async def _upstream_task(
        self, request: Request, body: bytes, caller: Caller, cors: RawHeaders
    ) -> Reply:
        assert request.task_id is not None
        tasks = self.hub.upstream_tasks
        if request.method == "tasks/get":
            kept = tasks.kept.get(request.task_id)
            snapshot = None if kept is None else kept.snapshot
            handlers.pace_poll(self.hub, caller.identity.principal, request.task_id, snapshot)
            snapshot = await tasks.get(request.task_id, caller, self.upstream)
            return _ok(request.method, handlers.get_result(request.id, snapshot), cors)
        answer = await tasks.steer(request.task_id, body, request.id, caller, self.upstream)
        return _passed(answer, cors, request.method)

    def _forwarding(
        self,
        scope: Scope,
        head: RawHeaders,
        headers: Mapping[str, str],
        identity: Identity,
        request: Forward,
        body: bytes,
        extra_headers: RawHeaders | None = None,
    ) -> Forwarding:
        assert self.upstream is not None
        outgoing = self._outgoing(scope, head, identity)
        record = None
        if request.method == "tools/call":

            def caller() -> Caller:
                return self._caller(outgoing, identity, headers, None)

            record = self.hub.upstream_tasks.recorder(self.upstream, caller)
        metrics = self.hub.metrics
        return Forwarding(self.upstream, body, request.id, outgoing, metrics, record, extra_headers)

    def _outgoing(self, scope: Scope, head: RawHeaders, identity: Identity) -> Outgoing:
        """The head to send upstream and the caller to count the request against."""
        client = scope.get("client")
        sent = self.heads.of(head, client[0] if client else None, scope["scheme"])
        caller = caller_of(self.hub, identity, scope, self.trusted)
        return Outgoing(sent.headers, caller, sent.lines)

    async def _discover_upstream(
        self, outgoing: Outgoing, body: bytes, request: Request, cors: RawHeaders
    ) -> Reply:
        """The upstream's own discover result, with the hub's capabilities merged in."""
        assert self.upstream is not None
        try:
            answer = await self.upstream.ask(body, outgoing.headers, outgoing.caller, request.id)
        except UpstreamError as exc:
            self.hub.metrics.upstream_requests.inc(1, self.upstream.spec.label, exc.fault)
            raise exc.rpc_error(self.upstream.spec.label) from None
        except jsonrpc.RpcError:  # the caller's requests in flight are at their limit
            self.hub.metrics.upstream_requests.inc(1, self.upstream.spec.label, "limited")
            raise
        self.hub.metrics.upstream_requests.inc(1, self.upstream.spec.label, "ok")
        if answer.message is None:  # a 4xx without a JSON-RPC body: as it came
            return _passed(answer, cors, request.method)
        merged = handlers.merge_discover(answer.message)
        kept = [(k, v) for k, v in answer.headers if k != b"content-type"]
        return Reply(answer.status, merged, [JSON, *kept, *cors], "ok", request.method)

    def answer_now(
        self, headers: Mapping[str, str], body: bytes, scope: Scope
    ) -> Reply | ListenStream | Forwarding | None:
        """The reply to a whole `POST` request (`headers` by lower-case name), the listen
        stream to run on its connection if no I/O is needed, or the forward to run on it;
        else None, with nothing done that `__call__` would then do again. `scope` holds
        what a forward needs of the request: its raw `headers`, `client` and `scheme`."""
        reply = self._reply_now(headers, body, scope)
        if isinstance(reply, Forwarding):
            return reply
        if reply is not None:
            metrics = self.hub.metrics
            if isinstance(reply, ListenStream):
                metrics.requests.inc(1, "subscriptions/listen", "ok")
            else:
                metrics.requests.inc(1, reply.method, reply.outcome)
            metrics.answered_in_place.inc()
        return reply

    def _reply_now(
        self, headers: Mapping[str, str], body: bytes, scope: Scope
    ) -> Reply | ListenStream | Forwarding | None:
        method = headers.get("mcp-method")
        if method not in _ANSWERED_NOW and (self.upstream is None or method in _HUBS_OWN):
            return None  # not worth reading twice: the app reads it (and checks the header)
        cors, identity = self._admit("POST", headers)
        if isinstance(identity, Reply):
            return identity
        if len(body) > self.config.max_body_bytes:
            return _body_refused(_too_large(self.config.max_body_bytes), cors)
        plain = plain_tasks_get(headers, body)
        if plain is not None:  # a poll: the common case, read in one pass
            reply = self._get_now(*plain, identity, cors, headers)
            if reply is not None:
                return reply
        request = self._parse(headers, body, cors)
        if isinstance(request, Reply):
            return request
        if isinstance(request, Forward):
            head = scope["headers"]
            return self._forwarding(scope, head, headers, identity, request, body, cors)
        try:
            answer = self._dispatch_now(request, identity)
        except jsonrpc.RpcError as err:
            return _error(request.id, err, cors, request.method)
        if isinstance(answer, ListenStream):
            answer.extra_headers = cors  # as `adding_headers` adds them on the ASGI path
            return answer
        return None if answer is None else _ok(request.method, answer, cors)

    # -- the steps -----------------------------------------------------------------------

    def _admit(
        self, method: str, headers: Mapping[str, str]
    ) -> tuple[RawHeaders, Identity | Reply]:
        """Method, Origin and credentials: the CORS headers for the answer, and who is
        asking or the refusal."""
        origin = headers.get("origin")
        if origin is None and method == "POST" and self.hub.authenticator is None:
            return [], ANONYMOUS  # the usual case, with nothing to check
        cors = [] if origin is None else self._cors(origin)
        return cors, self._identify(method, headers, origin, cors)

    def _identify(
        self, method: str, headers: Mapping[str, str], origin: str | None, cors: RawHeaders
    ) -> Identity | Reply:
        if method != "POST":  # H2
            if is_preflight(method, headers):
                allowed = preflight_headers(origin, self.cors_origins)
                return Reply(204 if allowed else 403, b"", encode_headers(allowed), "preflight")
            return Reply(405, b"", [(b"allow", b"POST"), *cors], "405")
        if origin is not None and not self.config.origin_allowed(origin):  # H4
            err = jsonrpc.RpcError(jsonrpc.INVALID_REQUEST, "Origin not allowed", http_status=403)
            return _error(None, err, cors, outcome="403")
        try:
            return authenticate(self.hub, "POST", headers, self.cors_origins)
        except AuthError as exc:  # H67: the RFC 6750 challenge, and the same in JSON-RPC
            message = "Unauthorized" + (f": {exc.description}" if exc.description else "")
            err = jsonrpc.RpcError(jsonrpc.UNAUTHORIZED, message, http_status=exc.status)
            challenge = [(b"www-authenticate", exc.www_authenticate().encode()), *cors]
            return _error(None, err, challenge, outcome=str(exc.status))

    def _parse(
        self, headers: Mapping[str, str], body: bytes, cors: RawHeaders
    ) -> Request | Forward | Reply:
        try:
            message = parse_request(headers, body, upstream=self.upstream is not None)
        except RequestError as exc:
            return _error(exc.request_id, exc.error, cors, _method_label(exc.method))
        if isinstance(message, Notification):  # H6
            return Reply(202, b"", cors, "accepted", "notification")
        return message  # a Request, or a Forward

    async def _dispatch(
        self, request: Request, identity: Identity, kept: KeptListen | None = None
    ) -> bytes | ListenStream:
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
            service = None if self.upstream is None else self.upstream.spec.label
            return await handlers.subscriptions_listen(hub, request, identity, service, kept)
        raise jsonrpc.method_not_found(request.method)

    def _dispatch_now(self, request: Request, identity: Identity) -> bytes | ListenStream | None:
        if request.method == "server/discover" and self.upstream is None:
            return handlers.discover(request)
        if request.method == "tasks/get":
            assert request.task_id is not None
            return handlers.tasks_get_cached(
                self.hub, request.id, request.task_id, identity.principal
            )
        if request.method == "subscriptions/listen":
            service = None if self.upstream is None else self.upstream.spec.label
            events = request.list_changed or request.resource_uris is not None
            if events and service is not None and service not in self.hub.events.announcing:
                return None  # the upstream's own listen may be held for it: the app's path
            return handlers.subscriptions_listen_cached(self.hub, request, identity, service)
        return None

    def _get_now(
        self,
        request_id: jsonrpc.RequestId,
        task_id: str,
        identity: Identity,
        cors: RawHeaders,
        headers: Mapping[str, str],
    ) -> Reply | None:
        try:
            answer = handlers.tasks_get_cached(self.hub, request_id, task_id, identity.principal)
            if answer is None and self.config.upstreams:
                answer = self._kept_get_now(request_id, task_id, identity, headers)
        except jsonrpc.RpcError as err:
            return _error(request_id, err, cors, "tasks/get")
        return None if answer is None else _ok("tasks/get", answer, cors)

    def _kept_get_now(
        self,
        request_id: jsonrpc.RequestId,
        task_id: str,
        identity: Identity,
        headers: Mapping[str, str],
    ) -> bytes | None:
        """An upstream's task, when its cached state is fresh and the caller's to read."""
        if self.hub.cache.get(task_id) is not None:
            return None
        snapshot = self.hub.upstream_tasks.cached(task_id, identity, headers)
        if snapshot is None:
            return None
        handlers.pace_poll(self.hub, identity.principal, task_id, snapshot)
        return handlers.get_result(request_id, snapshot)

    def _cors(self, origin: str) -> RawHeaders:
        return encode_headers(cors_response_headers(origin, self.cors_origins))

    async def _reply(self, scope: Scope, send: Send, reply: Reply) -> None:
        self.hub.metrics.requests.inc(1, reply.method, reply.outcome)
        await respond(scope, send, reply.status, reply.body, reply.headers)


def authenticate(
    hub: Hub,
    method: str,
    headers: Mapping[str, str],
    cors_origins: frozenset[str],
    *,
    read_only: bool = False,
) -> Identity:
    """Who is asking (raises AuthError): anonymous without authentication, else the
    principal of the credentials (H67; cookies only from an allowed origin, on POST or
    on a `read_only` route's GET)."""
    authenticator = hub.authenticator
    if authenticator is None:
        return ANONYMOUS
    config = hub.config
    credentials = credentials_from(
        method,
        headers,
        own_origin=config.own_origin,
        allowed_origins=cors_origins,
        read_only=read_only,
    )
    if credentials is None:
        raise AuthError.missing()
    return authenticator.authenticate(credentials[0])


async def upstreams_task(hub: Hub, task_id: str, upstream: Upstream | None) -> bool:
    """Whether the task is one an upstream keeps (hub/front_door/upstream_tasks.py): never one the
    snapshot holds; one the hub recorded; or, at an upstream's endpoint, any the store does
    not hold."""
    if hub.cache.get(task_id) is not None or not hub.config.upstreams:
        return False
    if hub.upstream_tasks.holds(task_id):
        return True
    if upstream is None:
        return False
    try:
        return await hub.source.read_through(task_id) is None
    except StoreUnavailable:
        return False  # the snapshot's path answers: the store is away


def caller_of(hub: Hub, identity: Identity, scope: Scope, trusted: TrustedProxies) -> str:
    """Whose share of the front door a request takes (`--max-forwards-per-caller`): the
    principal with authentication, else the client's address (behind `trusted` proxies,
    the one they vouch for)."""
    if hub.authenticator is not None:
        return identity.principal
    client = scope.get("client")
    return forwarding.caller_address(scope["headers"], client[0] if client else None, trusted)


async def respond(scope: Scope, send: Send, status: int, body: bytes, headers: RawHeaders) -> None:
    """A complete response: in one write where the connection allows (hub/http/connection.py)."""
    connection = connection_of(scope)
    if connection is not None and connection.respond(scope, status, headers, body):
        return
    if status not in (204, 304):
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _ok(method: str, answer: bytes, cors: RawHeaders) -> Reply:
    return Reply(200, answer, [JSON, *cors] if cors else JSON_ONLY, "ok", method)


def _error(
    request_id: jsonrpc.RequestId | None,
    err: jsonrpc.RpcError,
    extra: RawHeaders,
    method: str = "-",
    outcome: str | None = None,
) -> Reply:
    headers = [JSON, *encode_headers(err.headers), *extra]
    body = jsonrpc.encode_error(request_id, err)
    return Reply(err.http_status, body, headers, outcome or str(err.code), method)


def _passed(answer: Answer, cors: RawHeaders, method: str) -> Reply:
    """An upstream's answer as it came (its status, head and body)."""
    return Reply(answer.status, answer.body, [*answer.headers, *cors], str(answer.status), method)


class KeptListen:
    """A listen stream's access to the tasks upstreams keep (handlers.subscriptions_listen):
    grant one the caller may follow, and have the hub poll it on the caller's behalf."""

    def __init__(self, endpoint: McpEndpoint, caller: Caller) -> None:
        self.endpoint = endpoint
        self.caller = caller

    async def grant(self, task_id: str) -> TaskSnapshot | None:
        endpoint = self.endpoint
        if not await endpoint._upstreams_task(task_id):
            return None
        try:
            return await endpoint.hub.upstream_tasks.get(task_id, self.caller, endpoint.upstream)
        except (jsonrpc.RpcError, PassThrough):
            return None

    def follow(self, task_id: str) -> Callable[[], None]:
        return self.endpoint.hub.upstream_tasks.follow(task_id, self.caller)

    def follow_events(self, subscriber: Subscriber, granted: dict[str, Any]) -> Callable[[], None]:
        upstream = self.endpoint.upstream
        if upstream is None:
            return _nothing
        return self.endpoint.hub.upstream_events.follow(upstream, subscriber, granted, self.caller)


def _nothing() -> None:
    return None


def _body_refused(exc: BodyError, cors: RawHeaders) -> Reply:
    err = jsonrpc.RpcError(jsonrpc.INVALID_REQUEST, str(exc), http_status=exc.status)
    # 408: hang up (RFC 9110 §15.5.9), or the slow client keeps the connection by
    # trickling on. Not 413: a client still sending would get a reset, not the answer.
    close = [(b"connection", b"close")] if exc.status == 408 else []
    return _error(None, err, [*close, *cors], outcome=str(exc.status))


def _too_large(limit: int) -> BodyError:
    return BodyError(413, f"Request body larger than {limit} bytes")


def _method_label(method: str | None) -> str:
    """Keep the metric's label set bounded: unknown methods share one label."""
    return method if method in METHODS else "-"


async def read_body(scope: Scope, receive: Receive, limit: int, timeout: float) -> bytes:
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
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
