"""The JSON-RPC side of `examples/own_store`: errors, answers, and the checks a request
passes before any method runs (docs/protocol.md#validation-order), as a server that is
not taskhub would write them for itself."""

from __future__ import annotations

import base64
import binascii
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.datastructures import Headers

from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUPPORTED_VERSIONS,
    TASK_NOT_FOUND,
    TASKS_EXTENSION,
    declares_tasks,
)

NAME = "own-store"

RequestId = str | int

# -- errors: one exception, one encoder (docs/protocol.md#error-codes) -------------------------

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022
UNAUTHORIZED = -31401  # the hub's own code for the same refusal, outside the reserved range


class RpcError(Exception):
    """A JSON-RPC error, the HTTP status it travels with, and the id it answers (None: the
    request could not be read far enough to know it)."""

    def __init__(
        self,
        code: int,
        message: str,
        data: Any = None,
        *,
        http_status: int = 200,
        headers: dict[str, str] | None = None,
        request_id: RequestId | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status
        self.headers = headers or {}
        self.request_id = request_id


def header_mismatch(message: str) -> RpcError:
    return RpcError(HEADER_MISMATCH, f"Header mismatch: {message}", http_status=400)


def invalid_params(message: str, *, http_status: int = 200) -> RpcError:
    return RpcError(INVALID_PARAMS, message, http_status=http_status)


def task_not_found() -> RpcError:
    """H42/H46: unknown, expired and foreign tasks get exactly this, on HTTP 200."""
    return RpcError(INVALID_PARAMS, TASK_NOT_FOUND)


def missing_capability(message: str = "Missing required client capability") -> RpcError:
    """H31: the request's own `_meta` did not declare the tasks extension."""
    required: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    return RpcError(MISSING_CAPABILITY, message, required, http_status=400)


def unauthorized(presented: bool) -> RpcError:
    challenge = f'Bearer realm="{NAME}"' + (', error="invalid_token"' if presented else "")
    return RpcError(
        UNAUTHORIZED,
        "Unauthorized: a valid bearer token is required",
        http_status=401,
        headers={"WWW-Authenticate": challenge},
    )


_META = {SERVER_INFO_KEY: {"name": NAME, "version": "0.1.0"}}
_META_JSON = msgspec.json.encode(_META)


def encode_error(request_id: RequestId | None, err: RpcError) -> bytes:
    """The error response; `id` is left out only when it could not be read."""
    error: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        error["data"] = err.data
    message: dict[str, Any] = {"jsonrpc": "2.0"}
    if request_id is not None:
        message["id"] = request_id
    message["error"] = error
    return msgspec.json.encode(message)


def encode_response(request_id: RequestId, result: bytes) -> bytes:
    """The response around an already encoded result object."""
    return (
        b'{"jsonrpc":"2.0","id":' + msgspec.json.encode(request_id) + b',"result":' + result + b"}"
    )


def encode_result(result: dict[str, Any]) -> bytes:
    """A result object with `resultType` (H35) and serverInfo (H29)."""
    return msgspec.json.encode({"resultType": "complete", **result, "_meta": _META})


def task_result(result_type: str, task_json: bytes) -> bytes:
    """A flat task result spliced from the task's own JSON (encoded once per revision):
    `"task"` for a CreateTaskResult (D5), `"complete"` for tasks/get (H37)."""
    head = b'{"resultType":' + msgspec.json.encode(result_type) + b',"_meta":' + _META_JSON
    return head + b"," + task_json[1:]


COMPLETE_ACK = encode_result({})  # the tasks/update and tasks/cancel answer (H47, H51)

# -- the request: envelope and routing headers (docs/protocol.md#validation-order) -------------

TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
METHODS = frozenset({"server/discover", "tools/list", "tools/call", *TASK_METHODS})
SENTINEL_PREFIX, SENTINEL_SUFFIX = "=?base64?", "?="


class Call(msgspec.Struct, frozen=True):
    """One JSON-RPC message as read; `id` None is a notification."""

    method: str
    id: RequestId | None
    params: Any


@dataclass(frozen=True)
class Checked:
    """A request that passed every check; handlers only decide the answer."""

    id: RequestId
    method: str
    params: dict[str, Any]
    declared: bool  # this request's `_meta` declares the tasks extension (H30)
    caller: str  # the bearer token, or "" when the server runs without tokens
    task_id: str = ""  # tasks/*
    input_responses: dict[str, Any] = field(default_factory=dict)  # tasks/update


def read_call(body: bytes) -> Call:
    """The JSON-RPC envelope of one POST (H1): one request or notification, nothing else."""
    try:
        message = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        raise RpcError(
            PARSE_ERROR, "Parse error: body is not valid JSON", http_status=400
        ) from None
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "Invalid request: one JSON object", http_status=400)
    request_id = message.get("id")
    # JSON true/false decode to bool, an int subclass: not an id; nor is a float or null.
    if "id" in message and (not isinstance(request_id, str | int) or isinstance(request_id, bool)):
        raise RpcError(
            INVALID_REQUEST, "Invalid request: id must be a string or an integer", http_status=400
        )
    method = message.get("method")
    if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
        raise RpcError(
            INVALID_REQUEST,
            'Invalid request: jsonrpc must be "2.0" and method a string',
            http_status=400,
            request_id=request_id,
        )
    return Call(method, request_id, message.get("params"))


def header_value(headers: Headers, name: str) -> str | None:
    """The value a client meant (H14: `=?base64?…?=` decoded), None when absent; a value
    with characters outside visible ASCII, space and tab is a mismatch (H15)."""
    raw = headers.get(name)
    if raw is None:
        return None
    raw = raw.strip(" \t")  # not part of a field value (RFC 9110 §5.5)
    if raw.startswith(SENTINEL_PREFIX) and raw.endswith(SENTINEL_SUFFIX):
        payload = raw[len(SENTINEL_PREFIX) : -len(SENTINEL_SUFFIX)]
        try:
            return base64.b64decode(payload, validate=True).decode()
        except (binascii.Error, UnicodeError, ValueError):
            raise header_mismatch(f"{name} header value is a malformed base64 value") from None
    if not all(" " <= char <= "~" or char == "\t" for char in raw):
        raise header_mismatch(f"{name} header value contains invalid characters")
    return raw


def check_call(headers: Headers, call: Call, caller: str) -> Checked:
    """Validation steps 6–14 for a request (not a notification); raises RpcError."""
    assert call.id is not None
    version = header_value(headers, "mcp-protocol-version")
    if version is None:  # H8
        raise header_mismatch("required header MCP-Protocol-Version is missing")
    params = call.params
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict):  # H11
        raise invalid_params("params._meta is required", http_status=400)
    meta_version = meta.get(PROTOCOL_VERSION_KEY)
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    if not isinstance(meta_version, str) or not isinstance(capabilities, dict):  # H11
        message = "params._meta must carry the protocol version and client capabilities"
        raise invalid_params(message, http_status=400)
    if version != meta_version:  # H9
        raise header_mismatch("MCP-Protocol-Version differs from the _meta protocol version")
    if version not in SUPPORTED_VERSIONS:  # H10
        data = {"supported": list(SUPPORTED_VERSIONS), "requested": version}
        raise RpcError(UNSUPPORTED_VERSION, "Unsupported protocol version", data, http_status=400)
    if header_value(headers, "mcp-method") != call.method:  # H12
        raise header_mismatch("Mcp-Method is missing or differs from the method")
    if call.method not in METHODS:  # H17, H18
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {call.method[:120]}", http_status=404)
    checked = Checked(call.id, call.method, params, declares_tasks(capabilities), caller)
    if call.method == "tools/call":
        _check_name(headers, params.get("name"), "name")
    if call.method in TASK_METHODS:
        return _task_call(headers, checked)
    return checked


def _check_name(headers: Headers, value: Any, param: str) -> None:
    """Mcp-Name must carry `params.<param>` (H13); a non-string param is bad params, later."""
    if isinstance(value, str) and header_value(headers, "mcp-name") != value:
        raise header_mismatch(f"Mcp-Name is missing or differs from params.{param}")


def _task_call(headers: Headers, checked: Checked) -> Checked:
    """tasks/get|update|cancel: Mcp-Name (H13), the extension (H31), then the params."""
    task_id = checked.params.get("taskId")
    _check_name(headers, task_id, "taskId")
    if not checked.declared:
        raise missing_capability()
    if not isinstance(task_id, str):
        raise invalid_params("params.taskId must be a string")
    responses: Any = {}
    if checked.method == "tasks/update":
        responses = checked.params.get("inputResponses")
        if not isinstance(responses, dict):
            raise invalid_params("params.inputResponses must be an object")
    return dataclasses.replace(checked, task_id=task_id, input_responses=responses)


def accepts_event_stream(headers: Headers) -> bool:
    """Whether Accept names a range that admits `text/event-stream` (absent: JSON only)."""
    accept = headers.get("accept", "")
    ranges = {item.split(";", 1)[0].strip().lower() for item in accept.split(",")}
    return not ranges.isdisjoint({"text/event-stream", "text/*", "*/*"})
