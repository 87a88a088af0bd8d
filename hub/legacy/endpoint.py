"""`/legacy/mcp`: session-based Streamable HTTP 2025-11-25, for clients of the old tasks.

The adapter's one boundary (docs/legacy.md): legacy requests come in here, are answered
from the same snapshot and control path as the modern ones, or translated
(hub/legacy/vocabulary.py) and sent to the upstream as modern requests; nothing legacy
reaches `/mcp`, and a modern request here is refused. What it serves:

- POST `initialize` (no session yet): opens a session (hub/legacy/sessions.py) and
  answers its id in `Mcp-Session-Id`; every later request must carry it (400 without,
  404 for an unknown, ended or foreign one: initialize again);
- errors as the TypeScript SDK 1.x server sends them (hub/legacy/errors.py): a method's
  at 200, in the answer's own framing; the transport's refusals with their status;
- POST requests: `ping`, `tasks/get`, `tasks/list`, `tasks/cancel`, `tasks/result`
  (hub/legacy/methods.py, results.py), and with an upstream `tools/*`, `prompts/*`,
  `resources/*`, `completion/complete`, `logging/setLevel`, translated;
- POST notifications: 202; POST responses (answers to our input requests): 202, and the
  answer goes to the owning server as a `tasks/update`;
- GET: the session's stream of `notifications/tasks/status`, resumable with
  `Last-Event-ID` on any replica (hub/legacy/notifications.py);
- DELETE: ends the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.types import Receive, Scope, Send

from bridge.wire import UpdateMessage, control_message_id, encode
from hub.admission.auth import AuthError, Identity
from hub.front_door.forwarding import TrustedProxies
from hub.front_door.upstream import Upstream, UpstreamError
from hub.front_door.upstream_tasks import REQUEST_META, Caller
from hub.http.cors import is_preflight, preflight_headers
from hub.http.cors import response_headers as cors_response_headers
from hub.legacy import errors, kept, methods
from hub.legacy.errors import Refusal
from hub.legacy.notifications import status_stream
from hub.legacy.results import parse_input_request_id, stream_error, stream_result
from hub.legacy.sessions import Session, Sessions, SessionUnavailable
from hub.legacy.vocabulary import (
    LEGACY_VERSION,
    TASKS_CAPABILITY,
    created_result,
    is_modern_request,
    legacy_status,
    legacy_task,
    legacy_tools,
    modern_params,
    plain_result,
)
from hub.mcp.endpoint import BodyError, Reply, authenticate, caller_of, read_body, upstreams_task
from hub.mcp.handlers import find_task
from hub.rpc import jsonrpc
from hub.rpc.routing_headers import encode_header_value, encode_headers, header_map
from hub.runtime import Hub
from hub.store.source import StoreUnavailable

RawHeaders = list[tuple[bytes, bytes]]
JSON = (b"content-type", b"application/json")
SESSION_HEADER = "mcp-session-id"
# Methods sent on to the upstream, and the param its Mcp-Name header carries.
FORWARDED: dict[str, str | None] = {
    "tools/call": "name",
    "tools/list": None,
    "prompts/list": None,
    "prompts/get": "name",
    "resources/list": None,
    "resources/templates/list": None,
    "resources/read": "uri",
    "completion/complete": None,
    "logging/setLevel": None,
}


class LegacyEndpoint:
    def __init__(
        self, hub: Hub, sessions: Sessions, upstream: Upstream | None, modern_path: str
    ) -> None:
        self.hub = hub
        self.sessions = sessions
        self.upstream = upstream
        self.modern_path = modern_path  # named in the errors that send a client there
        self.config = hub.config
        self.cors_origins = frozenset(hub.config.cors_origins)
        self.trusted = TrustedProxies(hub.config.trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope["headers"])
        origin = headers.get("origin")
        cors = [] if origin is None else self._cors(origin)
        method = scope["method"]
        if method not in ("POST", "GET", "DELETE"):
            if is_preflight(method, headers):
                allowed = preflight_headers(origin, self.cors_origins)
                encoded = encode_headers(allowed)
                await _respond(send, 204 if allowed else 403, b"", encoded)
                return
            refusal = errors.method_not_allowed()
            await _respond(send, 405, refusal.body(), [JSON, *refusal.headers, *cors])
            return
        request_id: Any = None  # set once the message is read, if it is a request
        rpc_method: Any = None
        label = "-"
        outcome = "ok"
        try:
            identity = self._admit(headers, origin, method)
            version = headers.get("mcp-protocol-version")
            if version is not None and version.strip() != LEGACY_VERSION:
                raise errors.unsupported_version(version.strip(), self.modern_path)
            if method == "DELETE":
                session = await self._session(headers, identity)
                await self.sessions.end(session)
                await _respond(send, 204, b"", cors)
                return
            if method == "GET":
                await self._get(headers, identity, receive, send, cors)
                return
            errors.check_post_head(headers)
            try:
                body = await read_body(
                    scope, receive, self.config.max_body_bytes, self.config.body_timeout
                )
            except BodyError as exc:
                if exc.status == 413:
                    raise errors.too_large(self.config.max_body_bytes) from None
                raise errors.too_slow(str(exc)) from None
            message = errors.check_message(body)
            rpc_method = message.get("method")
            if rpc_method is not None:
                request_id = message.get("id")  # None for a notification
            label = _label(rpc_method)
            caller = caller_of(self.hub, identity, scope, self.trusted)
            await self._post(message, headers, identity, caller, receive, send, cors)
        except Refusal as refusal:
            outcome = str(refusal.status)
            await _respond(send, refusal.status, refusal.body(), [JSON, *refusal.headers, *cors])
        except jsonrpc.RpcError as err:
            outcome = str(err.code)
            if request_id is None or errors.keeps_status(err):
                # Credentials, back-off, or no request to answer (a response we took).
                error = jsonrpc.encode_error(request_id, err)
                extra = [JSON, *encode_headers(err.headers), *cors]
                await _respond(send, err.http_status, error, extra)
            elif rpc_method == "tasks/result":  # answered on an event stream, its errors too
                await stream_error(send, request_id, err, cors)
            else:
                await _respond(send, 200, errors.method_error(request_id, err), [JSON, *cors])
        except SessionUnavailable as exc:
            outcome = "503"
            unavailable = errors.sessions_unavailable(str(exc))
            await _respond(send, 503, unavailable.body(), [JSON, *cors])
        finally:
            self.hub.metrics.requests.inc(1, label, outcome)

    # -- admission -----------------------------------------------------------------------

    def _admit(self, headers: Mapping[str, str], origin: str | None, method: str) -> Identity:
        if origin is not None and not self.config.origin_allowed(origin):
            raise errors.invalid_origin(origin)
        try:
            return authenticate(self.hub, method, headers, self.cors_origins)
        except AuthError as exc:
            # The SDK's transport has no authentication: the hub's own 401, as on /mcp.
            message = "Unauthorized" + (f": {exc.description}" if exc.description else "")
            challenge = [(b"www-authenticate", exc.www_authenticate().encode())]
            raise Refusal(exc.status, jsonrpc.UNAUTHORIZED, message, challenge) from None

    def misdirected(self, host: str | None) -> Reply:
        """The answer to a `Host` an open hub does not serve (hub/app.py): the SDK's."""
        refusal = errors.invalid_host(host)
        return Reply(refusal.status, refusal.body(), [JSON], str(refusal.status))

    async def _session(self, headers: Mapping[str, str], identity: Identity) -> Session:
        session_id = headers.get(SESSION_HEADER)
        if session_id is None:
            raise errors.session_required()
        session = await self.sessions.find(session_id.strip(), identity.principal)
        if session is None:
            raise errors.session_not_found()
        return session

    # -- GET -----------------------------------------------------------------------------

    async def _get(
        self,
        headers: Mapping[str, str],
        identity: Identity,
        receive: Receive,
        send: Send,
        cors: RawHeaders,
    ) -> None:
        errors.check_get_accept(headers)
        session = await self._session(headers, identity)
        raw = headers.get("last-event-id")
        last_event_id = None
        if raw is not None:
            if not raw.strip().isdigit():
                raise errors.invalid_event_id()
            last_event_id = int(raw)
        await status_stream(self.hub, session, last_event_id, receive, send, cors)

    # -- POST ----------------------------------------------------------------------------

    async def _post(
        self,
        message: dict[str, Any],
        headers: Mapping[str, str],
        identity: Identity,
        caller: str,
        receive: Receive,
        send: Send,
        cors: RawHeaders,
    ) -> None:
        method = message.get("method")
        params: dict[str, Any] = message.get("params", {})  # an object (errors.check_message)
        if method is not None and "id" in message and is_modern_request(params):
            raise jsonrpc.invalid_request(
                "This is the 2025-11-25 endpoint; send 2026-07-28 requests to " + self.modern_path
            )
        if method == "initialize" and "id" in message:
            await self._initialize(message["id"], params, identity, send, cors)
            return
        session = await self._session(headers, identity)
        if method is None:  # a response: the answer to one of our input requests
            await self._input_answer(message, session, headers, caller)
            await _respond(send, 202, b"", cors)
            return
        if "id" not in message:  # a notification (initialized, cancelled, ...)
            await _respond(send, 202, b"", cors)
            return
        request_id = message["id"]
        principal = session.principal
        if method == "tasks/result":
            task_id = methods.task_id_of(params)
            if await upstreams_task(self.hub, task_id, self.upstream):
                who = kept.caller(self.hub, principal, headers, caller)
                await kept.get(self.hub, task_id, who, self.upstream)  # the caller's to read
                async with kept.followed(self.hub, task_id, who):
                    await stream_result(self.hub, task_id, request_id, receive, send, cors)
                return
            snapshot = await methods.owned(self.hub, params, principal)
            await stream_result(self.hub, snapshot.task_id, request_id, receive, send, cors)
            return
        result = await self._call(str(method), request_id, params, session, headers, caller)
        await _respond(send, 200, jsonrpc.encode_result(request_id, result), [JSON, *cors])

    async def _initialize(
        self,
        request_id: Any,
        params: dict[str, Any],
        identity: Identity,
        send: Send,
        cors: RawHeaders,
    ) -> None:
        capabilities = params.get("capabilities")
        client_info = params.get("clientInfo")
        if not isinstance(capabilities, dict):
            raise jsonrpc.invalid_params("initialize: params.capabilities must be an object")
        session = await self.sessions.open(
            identity.principal, capabilities, client_info if isinstance(client_info, dict) else None
        )
        server: dict[str, Any] = {"tasks": TASKS_CAPABILITY}
        instructions = None
        if self.upstream is not None:
            server.update({"tools": {}, "prompts": {}, "resources": {}})
            instructions = f"Tools of {self.upstream.spec.label} through the taskhub."
        result: dict[str, Any] = {
            "protocolVersion": LEGACY_VERSION,
            "capabilities": server,
            "serverInfo": jsonrpc.SERVER_INFO,
        }
        if instructions:
            result["instructions"] = instructions
        session_header = (b"mcp-session-id", session.id.encode())
        expose = (b"access-control-expose-headers", b"Mcp-Session-Id")
        answer = jsonrpc.encode_result(request_id, result)
        await _respond(
            send, 200, answer, [JSON, session_header, *([expose] if cors else []), *cors]
        )

    async def _call(
        self,
        method: str,
        request_id: Any,
        params: dict[str, Any],
        session: Session,
        headers: Mapping[str, str],
        caller: str,
    ) -> dict[str, Any]:
        hub, principal = self.hub, session.principal
        try:
            if method == "ping":
                return {}
            if method in ("tasks/get", "tasks/cancel"):
                task_id = methods.task_id_of(params)
                if await upstreams_task(hub, task_id, self.upstream):
                    who = kept.caller(hub, principal, headers, caller)
                    return await self._kept_call(method, task_id, who)
            if method == "tasks/get":
                return await methods.tasks_get(hub, params, principal)
            if method == "tasks/list":
                who = kept.caller(hub, principal, headers, caller)
                return methods.tasks_list(hub, params, principal, kept.listed(hub, who))
            if method == "tasks/cancel":
                return await methods.tasks_cancel(hub, params, principal, request_id)
        except StoreUnavailable as exc:
            raise jsonrpc.internal_error(str(exc)) from exc
        if method in FORWARDED and self.upstream is not None:
            return await self._forward(method, request_id, params, session, headers, caller)
        raise jsonrpc.method_not_found(method)

    async def _kept_call(self, method: str, task_id: str, who: Caller) -> dict[str, Any]:
        """`tasks/get` or `tasks/cancel` of a task an upstream keeps (hub/legacy/kept.py)."""
        hub = self.hub
        snapshot = await kept.get(hub, task_id, who, self.upstream)
        if method == "tasks/get":
            return legacy_task(methods.decoded(snapshot))
        if snapshot.terminal:  # as for the snapshot's tasks: -32602 under 2025-11-25
            status = legacy_status(methods.decoded(snapshot))
            raise jsonrpc.invalid_params(
                f"Cannot cancel task: already in terminal status '{status}'"
            )
        params = {"taskId": task_id, "_meta": REQUEST_META}
        await kept.steer(hub, "tasks/cancel", params, who, self.upstream)
        async with kept.followed(hub, task_id, who):
            final = await methods.until_terminal(hub, task_id, methods.CANCEL_WAIT_S)
        return legacy_task(methods.decoded(final or snapshot))

    async def _forward(
        self,
        method: str,
        request_id: Any,
        params: dict[str, Any],
        session: Session,
        headers: Mapping[str, str],
        caller: str,
    ) -> dict[str, Any]:
        """Send a legacy request upstream as a modern one; translate its answer back."""
        assert self.upstream is not None
        modern, wants_task = modern_params(params, session.capabilities, session.client_info)
        body = msgspec.json.encode(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": modern}
        )
        out: RawHeaders = [
            JSON,
            (b"accept", b"application/json, text/event-stream"),
            (b"mcp-protocol-version", b"2026-07-28"),
            (b"mcp-method", method.encode()),
        ]
        name_param = FORWARDED[method]
        if name_param is not None and isinstance(params.get(name_param), str):
            out.append((b"mcp-name", encode_header_value(params[name_param]).encode()))
        if "authorization" in headers:
            out.append((b"authorization", headers["authorization"].encode("latin-1")))
        label = self.upstream.spec.label
        try:
            answer = await self.upstream.exchange(body, out, request_id, caller)
        except UpstreamError as exc:
            self.hub.metrics.upstream_requests.inc(1, label, exc.fault)
            raise exc.rpc_error(label) from None
        except jsonrpc.RpcError:  # the caller's requests in flight are at their limit
            self.hub.metrics.upstream_requests.inc(1, label, "limited")
            raise
        self.hub.metrics.upstream_requests.inc(1, label, "ok")
        if not isinstance(answer, dict):
            raise jsonrpc.internal_error(f"upstream {label} answered no JSON-RPC message")
        if "error" in answer:
            error = answer["error"]
            if error.get("code") == jsonrpc.MISSING_CAPABILITY and method == "tools/call":
                # The tool runs only as a task: 2025-11-25 says so with -32601.
                raise jsonrpc.RpcError(
                    jsonrpc.METHOD_NOT_FOUND, "Task augmentation required for tools/call requests"
                )
            raise jsonrpc.RpcError(
                int(error.get("code", -32603)), str(error.get("message")), error.get("data")
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise jsonrpc.internal_error(f"upstream {label} answered no result")
        kind = result.get("resultType")
        if kind == "task" and wants_task:
            who = kept.caller(self.hub, session.principal, headers, caller)
            await self.hub.upstream_tasks.created(self.upstream, result, who)
            return created_result(result)
        if kind in (None, "complete"):
            return legacy_tools(result) if method == "tools/list" else plain_result(result)
        raise jsonrpc.internal_error(
            f"upstream {label} answered resultType {kind!r}: no 2025-11-25 client can follow it"
        )

    async def _input_answer(
        self, message: dict[str, Any], session: Session, headers: Mapping[str, str], caller: str
    ) -> None:
        """A client's response to an input request of `tasks/result`: a `tasks/update`."""
        parsed = parse_input_request_id(message.get("id"))
        if parsed is None or not isinstance(message.get("result"), dict):
            return  # not ours, or an error answer: the task stays waiting for input
        task_id, key = parsed
        if await upstreams_task(self.hub, task_id, self.upstream):
            who = kept.caller(self.hub, session.principal, headers, caller)
            params = {
                "taskId": task_id,
                "inputResponses": {key: message["result"]},
                "_meta": REQUEST_META,
            }
            await kept.steer(self.hub, "tasks/update", params, who, self.upstream)
            return
        snapshot = await find_task(self.hub, task_id, session.principal)
        if snapshot is None or snapshot.terminal:
            return
        data = encode(UpdateMessage(task_id, {key: message["result"]}, session.principal))
        msg_id = control_message_id(jsonrpc.encode_id(message["id"]), session.principal, data)
        try:
            await self.hub.source.publish_control(snapshot.server, data, msg_id)
        except StoreUnavailable as exc:
            raise jsonrpc.internal_error(str(exc)) from exc

    def _cors(self, origin: str) -> RawHeaders:
        allowed = cors_response_headers(origin, self.cors_origins)
        return encode_headers(allowed)


# The request metric's labels for the door: its own methods, the rest under one label.
_LABELS = frozenset(
    {"initialize", "ping", "tasks/get", "tasks/list", "tasks/cancel", "tasks/result", *FORWARDED}
)


def _label(method: Any) -> str:
    if method is None:
        return "legacy response"
    return f"legacy {method}" if method in _LABELS else "legacy -"


async def _respond(send: Send, status: int, body: bytes, headers: RawHeaders) -> None:
    if status not in (204, 304):
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
