"""The legacy door's errors, in the shapes the 2025-11-25 TypeScript SDK server sends.

A 2025-11-25 client learns an error's code only where `@modelcontextprotocol/sdk` 1.x puts
it, so the door answers in the SDK server's two shapes (docs/legacy.md#errors):

- an error of a method (the request was read and its method refused it) is a JSON-RPC
  error at HTTP 200 with the request's id, its message in the SDK's `McpError` form
  `MCP error <code>: …`. The 1.x client raises an `McpError` with the code, and a tool
  that shows only the message (the Inspector CLI) still shows it; a non-2xx status would
  leave the client an HTTP error without the code;
- a refusal of the transport (method, Origin, Host, headers, session, body, framing) is a
  `Refusal`: the SDK transport's status, code and message, with `"id": null`.

Credentials and back-off keep their HTTP status (`keeps_status`): a client or a proxy acts
on the status of those, not on the body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from hub.legacy.vocabulary import LEGACY_VERSION
from hub.rpc import jsonrpc
from hub.rpc.jsonrpc import RpcError, shorten

RawHeaders = list[tuple[bytes, bytes]]
# The SDK transport's codes: -32000 for what JSON-RPC has no code for, -32001 for a session.
TRANSPORT_ERROR = -32000
SESSION_NOT_FOUND = -32001


# -- errors of methods --------------------------------------------------------------------


def mcp_message(code: Any, message: str) -> str:
    """`message` as an SDK 1.x server sends an `McpError`'s: `MCP error <code>: <message>`."""
    prefix = f"MCP error {code}: "
    return message if message.startswith(prefix) else prefix + message


def keeps_status(err: RpcError) -> bool:
    """Credentials refused (401/403 with the challenge) and back-off (429 or 503 with
    `Retry-After`) travel with their status; every other error of a method at 200."""
    return err.code == jsonrpc.UNAUTHORIZED or "Retry-After" in err.headers


def method_error(request_id: jsonrpc.RequestId, err: RpcError) -> bytes:
    """The JSON-RPC error response to a request, as the SDK server sends it."""
    return jsonrpc.encode_error(
        request_id, RpcError(err.code, mcp_message(err.code, err.message), err.data)
    )


def error_object(error: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-RPC error object (a failed task's own) with its message in the `McpError` form."""
    message = error.get("message")
    return {**error, "message": mcp_message(error.get("code"), str(message or ""))}


# -- refusals of the transport ------------------------------------------------------------


class Refusal(Exception):
    """A request refused before any method ran, with its HTTP status."""

    def __init__(
        self, status: int, code: int, message: str, headers: RawHeaders | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or []

    def body(self) -> bytes:
        """The SDK transport's body: the id is null, whatever the request's was."""
        error = {"code": self.code, "message": self.message}
        return msgspec.json.encode({"jsonrpc": "2.0", "error": error, "id": None})


def method_not_allowed() -> Refusal:
    allow = [(b"allow", b"GET, POST, DELETE")]
    return Refusal(405, TRANSPORT_ERROR, "Method not allowed.", allow)


def invalid_origin(origin: str) -> Refusal:
    return Refusal(403, TRANSPORT_ERROR, f"Invalid Origin header: {shorten(origin)}")


def invalid_host(host: str | None) -> Refusal:
    shown = "null" if host is None else shorten(host)  # the SDK prints a missing one so
    return Refusal(403, TRANSPORT_ERROR, f"Invalid Host header: {shown}")


def unsupported_version(version: str, modern_path: str) -> Refusal:
    return Refusal(
        400,
        TRANSPORT_ERROR,
        f"Bad Request: Unsupported protocol version: {shorten(version)} (supported "
        f"versions: {LEGACY_VERSION}); 2026-07-28 is served at {modern_path}",
    )


def session_required() -> Refusal:
    return Refusal(400, TRANSPORT_ERROR, "Bad Request: Mcp-Session-Id header is required")


def session_not_found() -> Refusal:
    """Unknown, ended, expired and foreign sessions alike (docs/legacy.md#sessions)."""
    return Refusal(404, SESSION_NOT_FOUND, "Session not found")


def sessions_unavailable(message: str) -> Refusal:
    """No SDK counterpart: its sessions live in memory. The client may retry."""
    return Refusal(503, jsonrpc.INTERNAL_ERROR, message)


def invalid_event_id() -> Refusal:
    return Refusal(400, TRANSPORT_ERROR, "Invalid event ID format")


def too_large(limit: int) -> Refusal:
    message = f"Payload Too Large: Request body must not exceed {limit} bytes"
    return Refusal(413, TRANSPORT_ERROR, message)


def too_slow(reason: str) -> Refusal:
    """No SDK counterpart. Hang up (RFC 9110 §15.5.9), or the slow client keeps the
    connection by trickling on."""
    close = [(b"connection", b"close")]
    return Refusal(408, TRANSPORT_ERROR, f"Request Timeout: {reason}", close)


# -- what the transport checks ------------------------------------------------------------

_JSON = "application/json"
_EVENT_STREAM = "text/event-stream"


def check_post_head(headers: Mapping[str, str]) -> None:
    """A POST's `Accept` and `Content-Type`, before its body is read.

    As the SDK, `Accept` must admit both answers (JSON, and SSE for `tasks/result`) and the
    body must be JSON; unlike it, an absent header and a wildcard range are fine
    (docs/protocol.md#d21--accept-is-checked-only-for-listen-and-leniently).
    """
    ranges = _media_ranges(headers.get("accept"))
    if ranges and not (_admits(ranges, _JSON) and _admits(ranges, _EVENT_STREAM)):
        message = f"Not Acceptable: Client must accept both {_JSON} and {_EVENT_STREAM}"
        raise Refusal(406, TRANSPORT_ERROR, message)
    content_type = headers.get("content-type")
    if content_type is not None and _essence(content_type) != _JSON:
        message = f"Unsupported Media Type: Content-Type must be {_JSON}"
        raise Refusal(415, TRANSPORT_ERROR, message)


def check_get_accept(headers: Mapping[str, str]) -> None:
    ranges = _media_ranges(headers.get("accept"))
    if ranges and not _admits(ranges, _EVENT_STREAM):
        message = f"Not Acceptable: Client must accept {_EVENT_STREAM}"
        raise Refusal(406, TRANSPORT_ERROR, message)


def _essence(value: str) -> str:
    return value.partition(";")[0].strip().lower()


def _media_ranges(accept: str | None) -> list[str]:
    """The media ranges of an `Accept`, parameters (q too) left off; none for an absent one."""
    return [r for r in map(_essence, (accept or "").split(",")) if r]


def _admits(ranges: list[str], media_type: str) -> bool:
    kind = media_type.partition("/")[0]
    return any(r in (media_type, f"{kind}/*", "*/*") for r in ranges)


def check_message(body: bytes) -> dict[str, Any]:
    """The body as one JSON-RPC message, or the SDK's refusal.

    The SDK's own test (its `JSONRPCMessageSchema`): a request, notification, result or
    error, with no other members, an id a string or an integer, params an object. A batch
    is refused: 2025-11-25 has none, though the SDK still reads one.
    """
    try:
        message = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise Refusal(400, jsonrpc.PARSE_ERROR, "Parse error: Invalid JSON") from None
    if isinstance(message, list):
        message = "Invalid Request: JSON-RPC batches are not supported"
        raise Refusal(400, jsonrpc.INVALID_REQUEST, message)
    if not (isinstance(message, dict) and _is_message(message)):
        raise Refusal(400, jsonrpc.PARSE_ERROR, "Parse error: Invalid JSON-RPC message")
    return message


_REQUEST = frozenset({"jsonrpc", "id", "method", "params"})
_NOTIFICATION = frozenset({"jsonrpc", "method", "params"})
_RESULT = frozenset({"jsonrpc", "id", "result"})
_ERROR = frozenset({"jsonrpc", "id", "error"})


def _is_message(message: dict[str, Any]) -> bool:
    if message.get("jsonrpc") != "2.0":
        return False
    keys = message.keys()
    if "method" in message:
        allowed = _REQUEST if "id" in message else _NOTIFICATION
        return (
            keys <= allowed
            and isinstance(message["method"], str)
            and ("id" not in message or _is_id(message["id"]))
            and isinstance(message.get("params", {}), dict)
        )
    if "result" in message:
        return keys <= _RESULT and _is_id(message.get("id")) and isinstance(message["result"], dict)
    error = message.get("error")
    return (
        keys <= _ERROR
        and ("id" not in message or _is_id(message["id"]))
        and isinstance(error, dict)
        and _is_integer(error.get("code"))
        and isinstance(error.get("message"), str)
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or _is_integer(value)


def _is_integer(value: Any) -> bool:
    """An integer as JSON has it: `1` and `1.0` alike (the SDK reads both as one number)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
