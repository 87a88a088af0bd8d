"""Validation of one `POST /mcp` message: headers and body in, a `Request` or `RequestError` out.

Steps 4–14 of docs/protocol.md#validation-order as one pure function, so every rule is
unit-tested and the HTTP layer only moves bytes (steps 1–3, 405/Origin/auth, stay there;
so does dispatch).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import msgspec

from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    PROTOCOL_VERSION_KEY,
    SUPPORTED_VERSIONS,
    declares_tasks,
)
from hub.rpc import jsonrpc
from hub.rpc.jsonrpc import RequestId, RpcError, shorten
from hub.rpc.routing_headers import SENTINEL_PREFIX, decode_header_value, is_plain_safe

TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
# H18: tasks/result and tasks/list are legacy; under 2026-07-28 they are unknown methods.
METHODS = frozenset({"server/discover", "subscriptions/listen", *TASK_METHODS})
# Never forwarded, even with an upstream: the hub answers them itself (-32022, -32601), so no
# 2025-11-25 shape reaches modern traffic; their clients have the legacy door (docs/legacy.md).
LEGACY_METHODS = frozenset({"initialize", "tasks/list", "tasks/result"})


# subscriptions/listen filters for fleet change events (docs/fleet-events.md): field → kind.
LIST_CHANGED_FILTERS = {
    "toolsListChanged": "tools",
    "promptsListChanged": "prompts",
    "resourcesListChanged": "resources",
}

# Header names, lower-cased (H16: names are case-insensitive, values are not).
_VERSION_HEADER = "mcp-protocol-version"
_METHOD_HEADER = "mcp-method"
_NAME_HEADER = "mcp-name"
_ACCEPT_HEADER = "accept"
_EVENT_STREAM_RANGES = frozenset({"text/event-stream", "text/*", "*/*"})


class Notification(msgspec.Struct, frozen=True):
    """A JSON-RPC notification: the HTTP layer answers 202 with no body (H6)."""

    method: str


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """A request that passed every check; handlers only decide the answer.

    `params` is the body's params object as sent (including `_meta`). Capabilities come from
    this request alone (H30). The method-specific fields are set for their method only.
    """

    id: RequestId
    method: str
    params: dict[str, Any]
    client_capabilities: dict[str, Any]
    declared_tasks: bool
    task_id: str | None = None  # tasks/get, tasks/update, tasks/cancel
    input_responses: dict[str, Any] | None = None  # tasks/update
    task_ids: tuple[str, ...] | None = None  # subscriptions/listen; None = not requested
    list_changed: frozenset[str] = frozenset()  # subscriptions/listen: "tools", "prompts", ...
    resource_uris: tuple[str, ...] | None = None  # subscriptions/listen: resourceSubscriptions


class Forward(msgspec.Struct, frozen=True):
    """A message for the upstream (hub/front_door/upstream.py): not one of the hub's own methods."""

    method: str
    id: RequestId | None = None  # None for a notification


ParsedMessage = Request | Notification | Forward


class RequestError(Exception):
    """An `RpcError` plus what the HTTP layer needs to answer it.

    `request_id` is None only when the message could not be read as a request (H71);
    `method` is the body's method when it was a string (for logs and metric labels).
    """

    def __init__(
        self, error: RpcError, request_id: RequestId | None = None, method: str | None = None
    ) -> None:
        super().__init__(error.message)
        self.error = error
        self.request_id = request_id
        self.method = method

    def __repr__(self) -> str:
        return f"RequestError({self.error!r}, request_id={self.request_id!r})"


class _Call(msgspec.Struct, frozen=True):
    id: RequestId
    method: str
    params: Any  # None when the body had no "params"


_decode = msgspec.json.Decoder().decode  # a Decoder's own: cheaper than json.decode's


def parse_request(
    headers: Mapping[str, str], body: bytes, *, upstream: bool = False
) -> ParsedMessage:
    """Validate one message; raise `RequestError` carrying the JSON-RPC error to send.

    `headers` must look names up case-insensitively (Starlette's `Headers`) or hold lower-case
    keys. Repeated headers are the HTTP layer's concern: this sees one value per name.
    With an `upstream`, every message but the hub's own requests is a `Forward`, checked for
    its JSON-RPC envelope only: the upstream validates what it serves.
    """
    call = _read_envelope(body)
    if upstream and (
        isinstance(call, Notification)
        or (call.method not in METHODS and call.method not in LEGACY_METHODS)
    ):
        return Forward(call.method, None if isinstance(call, Notification) else call.id)
    if isinstance(call, Notification):
        return call
    try:
        return _validate(headers, call)
    except RpcError as err:
        raise RequestError(err, call.id, call.method) from None


def plain_tasks_get(headers: Mapping[str, str], body: bytes) -> tuple[RequestId, str] | None:
    """The id and taskId of a `tasks/get` in its plainest valid form, or None.

    One pass over what a polling client sends: literal header values, nothing missing,
    nothing of a wrong type. It declines whatever it does not recognise, so a None says
    only "ask `parse_request`"; whenever it answers, `parse_request` would have returned
    a `tasks/get` Request with this id and taskId (tests/test_protocol.py checks that).
    """
    if headers.get(_METHOD_HEADER) != "tasks/get":
        return None
    version = headers.get(_VERSION_HEADER)
    name = headers.get(_NAME_HEADER)
    if version not in SUPPORTED_VERSIONS or name is None or name.startswith(SENTINEL_PREFIX):
        return None
    try:
        message = _decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if type(message) is not dict or message.get("method") != "tasks/get":
        return None
    request_id = message.get("id")
    params = message.get("params")
    if (
        (type(request_id) is not int and type(request_id) is not str)
        or message.get("jsonrpc") != "2.0"
        or type(params) is not dict
    ):
        return None
    meta = params.get("_meta")
    if type(meta) is not dict or meta.get(PROTOCOL_VERSION_KEY) != version:
        return None
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    if type(capabilities) is not dict or not declares_tasks(capabilities):
        return None
    if params.get("taskId") != name or not is_plain_safe(name):
        return None
    return request_id, name


def _read_envelope(body: bytes) -> _Call | Notification:
    """Step 4 (and 5): JSON-RPC shape only. `id` is echoed once it has been read."""
    try:
        message = _decode(body)  # also rejects invalid UTF-8 and lone surrogates
    except msgspec.DecodeError:
        raise RequestError(jsonrpc.parse_error("Parse error: body is not valid JSON")) from None
    except RecursionError:
        raise RequestError(jsonrpc.parse_error("Parse error: JSON nested too deeply")) from None
    if isinstance(message, list):
        raise RequestError(jsonrpc.invalid_request("Invalid request: batches are not supported"))
    if not isinstance(message, dict):
        raise RequestError(jsonrpc.invalid_request("Invalid request: expected a JSON object"))
    if "method" not in message and ("result" in message or "error" in message):
        # H1: clients never send responses; its id names no request of theirs.
        raise RequestError(jsonrpc.invalid_request("Invalid request: responses are not accepted"))
    request_id: RequestId | None = None
    if "id" in message:
        raw_id = message["id"]
        # JSON true/false decode to bool, a subclass of int: not an id. Floats are not ids.
        if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
            raise RequestError(
                jsonrpc.invalid_request("Invalid request: id must be a string or an integer")
            )
        request_id = raw_id
    method = message.get("method")
    method_name = method if isinstance(method, str) else None
    if message.get("jsonrpc") != "2.0":
        error = jsonrpc.invalid_request('Invalid request: jsonrpc must be "2.0"')
        raise RequestError(error, request_id, method_name)
    if method_name is None:
        error = jsonrpc.invalid_request("Invalid request: method must be a string")
        raise RequestError(error, request_id)
    if request_id is None:
        return Notification(method_name)
    return _Call(request_id, method_name, message.get("params"))


def _validate(headers: Mapping[str, str], call: _Call) -> Request:
    """Steps 6–14; raises RpcError."""
    if call.method == "initialize":
        # H76: removed in 2026-07-28, so 404 -32601 (the conformance suite's SEP-2575
        # check); the data names the versions spoken here, and the message the legacy door.
        params = call.params if isinstance(call.params, dict) else {}
        requested = params.get("protocolVersion")
        raise RpcError(
            jsonrpc.METHOD_NOT_FOUND,
            "Method not found: initialize (removed in 2026-07-28; 2025-11-25 clients: "
            "the legacy endpoint beside this one, /legacy/mcp)",
            {
                "supported": list(SUPPORTED_VERSIONS),
                "requested": requested if isinstance(requested, str) else "",
            },
            http_status=404,
        )
    header_version = headers.get(_VERSION_HEADER)
    if header_version is None:  # H8: this hub serves no pre-2025-06-18 clients
        raise jsonrpc.header_mismatch("required header MCP-Protocol-Version is missing")

    # H11: without readable _meta the request is malformed, HTTP 400.
    params = call.params
    if not isinstance(params, dict):
        raise jsonrpc.invalid_params("params must be an object carrying _meta", http_status=400)
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise jsonrpc.invalid_params("params._meta is required", http_status=400)
    version = meta.get(PROTOCOL_VERSION_KEY)
    if not isinstance(version, str):
        message = f"params._meta[{PROTOCOL_VERSION_KEY!r}] must be a string"
        raise jsonrpc.invalid_params(message, http_status=400)
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    if not isinstance(capabilities, dict):
        message = f"params._meta[{CLIENT_CAPABILITIES_KEY!r}] must be an object"
        raise jsonrpc.invalid_params(message, http_status=400)

    if not is_plain_safe(header_version):  # H15
        raise jsonrpc.header_mismatch("MCP-Protocol-Version header value has invalid characters")
    if header_version != version:  # H9
        raise _mismatch("MCP-Protocol-Version", header_version, version)
    if version not in SUPPORTED_VERSIONS:  # H10
        raise jsonrpc.unsupported_version(version, SUPPORTED_VERSIONS)

    raw_method = headers.get(_METHOD_HEADER)
    if raw_method is None:  # H12
        raise jsonrpc.header_mismatch("required header Mcp-Method is missing")
    header_method = decode_header_value(raw_method, name="Mcp-Method")
    if header_method != call.method:  # H12, H16: values compare case-sensitively
        raise _mismatch("Mcp-Method", header_method, call.method)
    if call.method not in METHODS:  # H17, H18
        raise jsonrpc.method_not_found(call.method)

    declared = declares_tasks(capabilities)  # H30: this request's own _meta only
    if call.method in TASK_METHODS:
        return _task_request(headers, call, params, capabilities, declared)
    request = Request(
        id=call.id,
        method=call.method,
        params=params,
        client_capabilities=capabilities,
        declared_tasks=declared,
    )
    if call.method == "subscriptions/listen":
        return _listen_request(headers, request)
    return request  # server/discover: no params besides _meta; Mcp-Name is ignored


def _task_request(
    headers: Mapping[str, str],
    call: _Call,
    params: dict[str, Any],
    capabilities: dict[str, Any],
    declared: bool,
) -> Request:
    """tasks/get|update|cancel: steps 12–14."""
    raw_name = headers.get(_NAME_HEADER)
    if raw_name is None:  # H13, D9: enforced strictly
        raise jsonrpc.header_mismatch(f"required header Mcp-Name is missing for {call.method}")
    name = decode_header_value(raw_name, name="Mcp-Name")  # H14, H15
    task_id = params.get("taskId")
    # Only a string taskId can be compared; any other taskId is bad params (step 14), reported
    # after the capability check so the step order stays that of docs/protocol.md#validation-order.
    if isinstance(task_id, str) and name != task_id:  # H13
        raise _mismatch("Mcp-Name", name, task_id)
    if not declared:  # H31
        raise jsonrpc.missing_capability()
    if not isinstance(task_id, str):
        raise jsonrpc.invalid_params("params.taskId must be a string")
    # A taskId outside the task-id syntax is kept: the handler answers it as "not found"
    # (-32602), exactly like an unknown task (H42, H46).
    input_responses = None
    if call.method == "tasks/update":
        input_responses = params.get("inputResponses")
        if not isinstance(input_responses, dict):  # required; its entries stay opaque (D11)
            raise jsonrpc.invalid_params("params.inputResponses must be an object")
    return Request(
        id=call.id,
        method=call.method,
        params=params,
        client_capabilities=capabilities,
        declared_tasks=declared,
        task_id=task_id,
        input_responses=input_responses,
    )


def _listen_request(headers: Mapping[str, str], request: Request) -> Request:
    """subscriptions/listen: D21, then H55, the list-changed and resource filters, then H32 and
    the taskIds shape. Unknown filter fields are left out of the ack (H57)."""
    if not _accepts_event_stream(headers.get(_ACCEPT_HEADER)):
        message = "Invalid request: subscriptions/listen needs Accept: text/event-stream"
        raise jsonrpc.invalid_request(message)
    notifications = request.params.get("notifications")
    if not isinstance(notifications, dict):  # H55
        raise jsonrpc.invalid_params("params.notifications must be an object")
    list_changed = []
    for field, kind in LIST_CHANGED_FILTERS.items():
        wanted = notifications.get(field, False)
        if not isinstance(wanted, bool):
            raise jsonrpc.invalid_params(f"params.notifications.{field} must be a boolean")
        if wanted:
            list_changed.append(kind)
    resource_uris = None
    if "resourceSubscriptions" in notifications:
        resource_uris = _strings(notifications["resourceSubscriptions"], "resourceSubscriptions")
    request = msgspec.structs.replace(
        request, list_changed=frozenset(list_changed), resource_uris=resource_uris
    )
    if "taskIds" not in notifications:
        return request
    if not request.declared_tasks:  # H32
        raise jsonrpc.missing_capability()
    return msgspec.structs.replace(request, task_ids=_strings(notifications["taskIds"], "taskIds"))


def _strings(value: Any, field: str) -> tuple[str, ...]:
    """An array of strings, duplicates removed, first occurrence first."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise jsonrpc.invalid_params(f"params.notifications.{field} must be an array of strings")
    return tuple(dict.fromkeys(value))


@functools.lru_cache(maxsize=256)  # a client sends the same Accept every time: read it once
def _accepts_event_stream(accept: str | None) -> bool:
    """D21 (hub choice): refuse only an Accept that lists media ranges, none of them SSE.

    An absent or empty Accept is tolerated. Parameters (including q) are ignored.
    """
    if accept is None:
        return True
    ranges = [item.split(";", 1)[0].strip().lower() for item in accept.split(",")]
    ranges = [item for item in ranges if item]
    return not ranges or any(item in _EVENT_STREAM_RANGES for item in ranges)


def _mismatch(header: str, header_value: str, body_value: str) -> RpcError:
    """The message format of the spec's own example informative per H72."""
    return jsonrpc.header_mismatch(
        f"{header} header value '{shorten(header_value)}' "
        f"does not match body value '{shorten(body_value)}'"
    )
