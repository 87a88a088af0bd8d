"""JSON-RPC framing and errors: every error the hub sends is an `RpcError`, every reply these bytes.

Errors live in one place so codes and HTTP statuses stay consistent
(docs/protocol.md#error-codes); replies are spliced from pre-encoded pieces so hot paths
never re-encode the envelope.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec

from bridge.vocabulary import SERVER_INFO_KEY, TASK_NOT_FOUND, TASKS_EXTENSION

# JSON-RPC 2.0 codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP codes (docs/protocol.md#error-codes); H70: never emit any other code from -32020..-32099.
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022

# The hub's own codes, outside -32768..-32000 as the spec asks (H70, D20).
UNAUTHORIZED = -31401
RATE_LIMITED = -31429


RequestId = str | int
"""A JSON-RPC id as the client sent it; the JSON type is kept (H59: `"1"` and `1` differ)."""


def _package_version() -> str:
    try:
        return version("taskhub")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


SERVER_INFO: dict[str, str] = {"name": "taskhub", "version": _package_version()}

_encode = msgspec.json.encode
_HEAD = b'{"jsonrpc":"2.0"'
_META = _encode({SERVER_INFO_KEY: SERVER_INFO})


class RpcError(Exception):
    """A JSON-RPC error object plus the HTTP status (and headers) it travels with."""

    def __init__(
        self,
        code: int,
        message: str,
        data: Any = None,
        *,
        http_status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data  # None = no "data" member
        # D8: task-level errors (unknown task) travel on HTTP 200; transport-level
        # ones carry the status the spec pins (400 for -32020/-32021/-32022, 404 for -32601).
        self.http_status = http_status
        self.headers: dict[str, str] = headers if headers is not None else {}

    def __repr__(self) -> str:
        return f"RpcError({self.code}, {self.message!r}, http_status={self.http_status})"


def shorten(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters, for echoing client input in messages (H72)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_error(message: str = "Parse error") -> RpcError:
    return RpcError(PARSE_ERROR, message, http_status=400)


def invalid_request(message: str = "Invalid request") -> RpcError:
    return RpcError(INVALID_REQUEST, message, http_status=400)


def method_not_found(method: str) -> RpcError:
    """H17: the 404 tells a client "this server lacks the method", the body says it is modern."""
    return RpcError(METHOD_NOT_FOUND, f"Method not found: {shorten(method)}", http_status=404)


def invalid_params(message: str, *, http_status: int = 200) -> RpcError:
    """-32602: HTTP 400 only where the spec pins it (missing `_meta`, H11), else 200."""
    return RpcError(INVALID_PARAMS, message, http_status=http_status)


def task_not_found() -> RpcError:
    """H42/H46: unknown, expired and foreign tasks all get exactly this error."""
    return RpcError(INVALID_PARAMS, TASK_NOT_FOUND)


def internal_error(message: str = "Internal error") -> RpcError:
    """H70. HTTP 500, not 200: the spec leaves the status open, and a 5xx lets load balancers,
    retries and dashboards see a hub that cannot reach its store; clients still read the body."""
    return RpcError(INTERNAL_ERROR, message, http_status=500)


def header_mismatch(message: str) -> RpcError:
    """H8, H9, H12, H13, H15: any header/body disagreement is 400 + -32020."""
    return RpcError(HEADER_MISMATCH, f"Header mismatch: {message}", http_status=400)


def missing_capability() -> RpcError:
    """H31, H32: the tasks extension was not declared in this request's `_meta`."""
    return RpcError(
        MISSING_CAPABILITY,
        "Missing required client capability",
        {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        http_status=400,
    )


def unsupported_version(requested: str, supported: Sequence[str]) -> RpcError:
    """H10."""
    return RpcError(
        UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(supported), "requested": requested},
        http_status=400,
    )


def rate_limited(message: str, retry_after: str) -> RpcError:
    """D20: HTTP 429 with Retry-After and an application code."""
    return RpcError(RATE_LIMITED, message, http_status=429, headers={"Retry-After": retry_after})


def encode_id(request_id: RequestId) -> bytes:
    """The id as JSON bytes, for splicing into pre-encoded replies and SSE frames."""
    if type(request_id) is int:
        return b"%d" % request_id
    return line_safe(_encode(request_id))


_LINE_SEPARATORS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def line_safe(json_bytes: bytes) -> bytes:
    """JSON with U+0085, U+2028 and U+2029 escaped: the same value, one SSE line.

    JSON may carry them raw, but clients that split a stream with `str.splitlines`
    (httpx's `aiter_lines`) would cut a `data:` line there and lose the frame.
    """
    # The usual case: one pass. Then `find`, not `in`, as hub/store/nats_frames.py's `removes`.
    if json_bytes.isascii() or (
        json_bytes.find(b"\xc2\x85") < 0 and json_bytes.find(b"\xe2\x80") < 0
    ):
        return json_bytes
    for raw, escaped in _LINE_SEPARATORS:
        json_bytes = json_bytes.replace(raw, escaped)
    return json_bytes


def encode_error(request_id: RequestId | None, err: RpcError) -> bytes:
    """An error response; `id` is omitted only when the request could not be read (H71).
    Line-safe: the legacy door and the front door send it as an SSE event too."""
    error: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        error["data"] = err.data
    id_part = b"" if request_id is None else b',"id":' + encode_id(request_id)
    return _HEAD + id_part + b',"error":' + line_safe(_encode(error)) + b"}"


def encode_result(request_id: RequestId, result: dict[str, Any]) -> bytes:
    """A result response carrying `_meta` serverInfo (H29), merged into any `_meta` given."""
    meta = result.get("_meta")
    merged = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_KEY: SERVER_INFO}
    body = line_safe(_encode({**result, "_meta": merged}))
    return _HEAD + b',"id":' + encode_id(request_id) + b',"result":' + body + b"}"


def complete_ack(request_id: RequestId) -> bytes:
    """`{"resultType":"complete"}` plus serverInfo: the tasks/update and tasks/cancel reply
    (H47, H51; D4)."""
    return (
        _HEAD
        + b',"id":'
        + _encode(request_id)
        + b',"result":{"resultType":"complete","_meta":'
        + _META
        + b"}}"
    )
