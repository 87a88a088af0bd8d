"""hub/rpc/request.py: steps 4–14 of docs/protocol.md#validation-order: codes, statuses, id echo.

The request builders here are shared by the other test_protocol_*.py modules.
"""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import msgspec
import pytest

from hub.rpc import jsonrpc
from hub.rpc.request import Notification, Request, RequestError, parse_request, plain_tasks_get

VERSION = "2026-07-28"
TASK_ID = "786512e2-9e0d-44bd-8f29-789f320fe840"
OTHER_ID = "5b0d4c1e-0000-4000-8000-000000000000"
TASKS: dict[str, Any] = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
TASK_METHODS = ["tasks/get", "tasks/update", "tasks/cancel"]
MISSING: Any = object()


def meta(version: Any = VERSION, caps: Any = TASKS) -> dict[str, Any]:
    out: dict[str, Any] = {"io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}
    if version is not MISSING:
        out["io.modelcontextprotocol/protocolVersion"] = version
    if caps is not MISSING:
        out["io.modelcontextprotocol/clientCapabilities"] = caps
    return out


def default_params(method: str, caps: Any = TASKS) -> dict[str, Any]:
    params: dict[str, Any] = {"_meta": meta(caps=caps)}
    if method in TASK_METHODS:
        params["taskId"] = TASK_ID
    if method == "tasks/update":
        params["inputResponses"] = {"name": {"action": "accept", "content": {"name": "Luca"}}}
    if method == "subscriptions/listen":
        params["notifications"] = {"taskIds": [TASK_ID]}
    return params


def message(method: str, request_id: Any = 1, **params: Any) -> dict[str, Any]:
    """A valid request for `method`; keyword arguments replace params (MISSING drops one)."""
    merged = {**default_params(method), **params}
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    body["params"] = {k: v for k, v in merged.items() if v is not MISSING}
    return body


def headers(method: str, **overrides: str | None) -> dict[str, str]:
    """The headers a good client sends for `method`; None drops one."""
    out = {"mcp-protocol-version": VERSION, "mcp-method": method}
    if method in TASK_METHODS:
        out["mcp-name"] = TASK_ID
    if method == "subscriptions/listen":
        out["accept"] = "application/json, text/event-stream"
    for name, value in overrides.items():
        key = name.replace("_", "-")
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def encode(body: Any) -> bytes:
    return msgspec.json.encode(body)


class Case(NamedTuple):
    headers: dict[str, str]
    body: bytes
    code: int
    status: int
    echoed_id: Any  # None: the error has no id


def case(
    body: Any, code: int, status: int, echoed_id: Any, hdrs: dict[str, str] | None = None
) -> Case:
    raw = body if isinstance(body, bytes) else encode(body)
    method = body.get("method", "tasks/get") if isinstance(body, dict) else "tasks/get"
    return Case(hdrs if hdrs is not None else headers(str(method)), raw, code, status, echoed_id)


def get(**params: Any) -> dict[str, Any]:
    return message("tasks/get", **params)


def listen(**params: Any) -> dict[str, Any]:
    return message("subscriptions/listen", **params)


def with_key(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**body, **changes}
    return {k: v for k, v in out.items() if v is not MISSING}


PARSE = (-32700, 400)
INVALID_REQUEST = (-32600, 400)
MISMATCH = (-32020, 400)
META_PARAMS = (-32602, 400)
BAD_PARAMS = (-32602, 200)
NO_CAP = (-32021, 400)
NOT_FOUND = (-32601, 404)
BAD_VERSION = (-32022, 400)

DEEP = b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":' + b"[" * 5000 + b"]" * 5000 + b"}"

ERROR_CASES = [
    # Step 4: the body is not a JSON-RPC request (H71: no id unless it was read).
    pytest.param(case(b"{", *PARSE, None), id="not-json"),
    pytest.param(case(b"", *PARSE, None), id="empty-body"),
    pytest.param(case(b'{"jsonrpc":"2.0","id":1,"method":"\xff"}', *PARSE, None), id="not-utf8"),
    pytest.param(case(b'{"id":"\\ud800"}', *PARSE, None), id="lone-surrogate"),
    pytest.param(case(DEEP, *PARSE, None), id="nested-too-deep"),
    pytest.param(case([get()], *INVALID_REQUEST, None), id="batch"),
    pytest.param(case([], *INVALID_REQUEST, None), id="empty-batch"),
    pytest.param(case(5, *INVALID_REQUEST, None), id="scalar"),
    pytest.param(case(None, *INVALID_REQUEST, None), id="null"),
    pytest.param(case("tasks/get", *INVALID_REQUEST, None), id="string"),
    pytest.param(
        case({"jsonrpc": "2.0", "id": 1, "result": {}}, *INVALID_REQUEST, None), id="result"
    ),
    pytest.param(
        case(
            {"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x"}},
            *INVALID_REQUEST,
            None,
        ),
        id="error-response",
    ),
    pytest.param(case(with_key(get(), id=None), *INVALID_REQUEST, None), id="id-null"),
    pytest.param(case(with_key(get(), id=True), *INVALID_REQUEST, None), id="id-true"),
    pytest.param(case(with_key(get(), id=False), *INVALID_REQUEST, None), id="id-false"),
    pytest.param(case(with_key(get(), id=1.5), *INVALID_REQUEST, None), id="id-float"),
    pytest.param(case(with_key(get(), id=1.0), *INVALID_REQUEST, None), id="id-float-integral"),
    pytest.param(case(with_key(get(), id=[1]), *INVALID_REQUEST, None), id="id-array"),
    pytest.param(case(with_key(get(), id={"a": 1}), *INVALID_REQUEST, None), id="id-object"),
    pytest.param(case(with_key(get(), jsonrpc="1.0"), *INVALID_REQUEST, 1), id="jsonrpc-1.0"),
    pytest.param(case(with_key(get(), jsonrpc=2.0), *INVALID_REQUEST, 1), id="jsonrpc-number"),
    pytest.param(case(with_key(get(), jsonrpc=MISSING), *INVALID_REQUEST, 1), id="jsonrpc-missing"),
    pytest.param(
        case(with_key(get(), id="a", method=MISSING), *INVALID_REQUEST, "a"), id="method-missing"
    ),
    pytest.param(case(with_key(get(), method=7), *INVALID_REQUEST, 1), id="method-int"),
    pytest.param(
        case({"jsonrpc": "1.0", "method": "notifications/x"}, *INVALID_REQUEST, None),
        id="bad-notification",
    ),
    # Step 6 (H8).
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_protocol_version=None)),
        id="no-version-header",
    ),
    # Step 7 (H11): missing _meta essentials are 400.
    pytest.param(case(with_key(get(), params=MISSING), *META_PARAMS, 1), id="params-missing"),
    pytest.param(case(with_key(get(), params=None), *META_PARAMS, 1), id="params-null"),
    pytest.param(case(with_key(get(), params=[TASK_ID]), *META_PARAMS, 1), id="params-array"),
    pytest.param(case(get(_meta=MISSING), *META_PARAMS, 1), id="meta-missing"),
    pytest.param(case(get(_meta=[]), *META_PARAMS, 1), id="meta-array"),
    pytest.param(case(get(_meta=meta(version=MISSING)), *META_PARAMS, 1), id="version-missing"),
    pytest.param(case(get(_meta=meta(version=20260728)), *META_PARAMS, 1), id="version-number"),
    pytest.param(case(get(_meta=meta(caps=MISSING)), *META_PARAMS, 1), id="caps-missing"),
    pytest.param(case(get(_meta=meta(caps=None)), *META_PARAMS, 1), id="caps-null"),
    pytest.param(case(get(_meta=meta(caps=[])), *META_PARAMS, 1), id="caps-array"),
    # Step 8 (H9, H15).
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_protocol_version="2025-11-25")),
        id="version-header-differs",
    ),
    pytest.param(
        case(
            get(_meta=meta(version="2026-07-28\xe9")),
            *MISMATCH,
            1,
            headers("tasks/get", mcp_protocol_version="2026-07-28\xe9"),
        ),
        id="version-header-invalid-chars",
    ),
    # Step 9 (H10).
    pytest.param(
        case(
            get(_meta=meta(version="2025-11-25")),
            *BAD_VERSION,
            1,
            headers("tasks/get", mcp_protocol_version="2025-11-25"),
        ),
        id="unsupported-version",
    ),
    # Step 10 (H12, H15, H16).
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method=None)), id="no-method-header"
    ),
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method="tasks/cancel")),
        id="method-header-differs",
    ),
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method="Tasks/Get")),
        id="method-header-case",
    ),
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method="tasks/get\x00")),
        id="method-header-invalid-chars",
    ),
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method="=?base64?dGFza3MvZ2V0?")),
        id="method-header-unterminated-sentinel",
    ),
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method="=?base64?dGFza3MvZ2V0?=x")),
        id="method-header-trailing-garbage",
    ),
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_method="=?base64?dGFza3M=?=")),
        id="method-header-sentinel-differs",
    ),
    # Step 11 (H17, H18) — more rows in test_unknown_methods_are_404.
    pytest.param(case(message("tasks/list"), *NOT_FOUND, 1), id="unknown-method"),
    # Step 12 (H13, H14, H15) — further per-method rows in test_mcp_name_rules.
    pytest.param(
        case(get(), *MISMATCH, 1, headers("tasks/get", mcp_name="=?base64?!!!!?=")),
        id="name-header-bad-base64",
    ),
    # Step 13 (H31) — per-method rows in test_tasks_methods_need_the_extension.
    pytest.param(
        case(
            get(taskId=MISSING, _meta=meta(caps={})),
            *NO_CAP,
            1,
        ),
        id="no-extension-beats-missing-task-id",
    ),
    # Step 14.
    pytest.param(case(get(taskId=MISSING), *BAD_PARAMS, 1), id="task-id-missing"),
    pytest.param(case(get(taskId=7), *BAD_PARAMS, 1), id="task-id-int"),
    pytest.param(case(get(taskId=None), *BAD_PARAMS, 1), id="task-id-null"),
    pytest.param(
        case(message("tasks/update", inputResponses=MISSING), *BAD_PARAMS, 1),
        id="update-input-responses-missing",
    ),
    pytest.param(
        case(message("tasks/update", inputResponses=[]), *BAD_PARAMS, 1),
        id="update-input-responses-array",
    ),
    pytest.param(
        case(message("tasks/cancel", taskId=["x"]), *BAD_PARAMS, 1), id="cancel-task-id-array"
    ),
    # subscriptions/listen: D21, H55, H32, taskIds shape.
    pytest.param(
        case(
            listen(),
            *INVALID_REQUEST,
            1,
            headers("subscriptions/listen", accept="application/json"),
        ),
        id="listen-accept-without-sse",
    ),
    pytest.param(case(listen(notifications=MISSING), *BAD_PARAMS, 1), id="listen-no-filter"),
    pytest.param(case(listen(notifications=None), *BAD_PARAMS, 1), id="listen-filter-null"),
    pytest.param(case(listen(notifications=[TASK_ID]), *BAD_PARAMS, 1), id="listen-filter-array"),
    pytest.param(
        case(listen(notifications={"taskIds": TASK_ID}), *BAD_PARAMS, 1), id="task-ids-string"
    ),
    pytest.param(
        case(listen(notifications={"taskIds": [TASK_ID, 1]}), *BAD_PARAMS, 1), id="task-ids-int"
    ),
    pytest.param(case(listen(notifications={"taskIds": None}), *BAD_PARAMS, 1), id="task-ids-null"),
    pytest.param(
        case(listen(_meta=meta(caps={})), *NO_CAP, 1), id="listen-task-ids-without-extension"
    ),
    pytest.param(
        case(listen(_meta=meta(caps={}), notifications={"taskIds": []}), *NO_CAP, 1),
        id="listen-empty-task-ids-without-extension",
    ),
]


def raises(hdrs: Any, body: bytes) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(hdrs, body)
    return info.value


def parse(hdrs: Any, body: Any) -> Request:
    result = parse_request(hdrs, encode(body))
    assert isinstance(result, Request)
    return result


@pytest.mark.parametrize("c", ERROR_CASES)
def test_errors(c: Case) -> None:
    exc = raises(c.headers, c.body)
    assert (exc.error.code, exc.error.http_status) == (c.code, c.status)
    assert exc.request_id == c.echoed_id and type(exc.request_id) is type(c.echoed_id)
    reply = msgspec.json.decode(jsonrpc.encode_error(exc.request_id, exc.error))
    assert ("id" in reply) is (c.echoed_id is not None)  # H71
    assert reply["error"]["code"] == c.code


@pytest.mark.parametrize("method", TASK_METHODS)
def test_mcp_name_checked_before_capability(method: str) -> None:  # step 12 before 13
    body = encode(message(method, _meta=meta(caps={})))
    exc = raises(headers(method, mcp_name=OTHER_ID), body)
    assert exc.error.code == -32020


def test_missing_meta_beats_missing_method_header() -> None:  # step 7 before step 10
    exc = raises(headers("tasks/get", mcp_method=None), encode(get(_meta=MISSING)))
    assert (exc.error.code, exc.error.http_status) == (-32602, 400)


def test_error_carries_the_method() -> None:
    exc = raises(headers("tasks/get", mcp_method=None), encode(get()))
    assert exc.method == "tasks/get"
    assert raises({}, b"[]").method is None


@pytest.mark.parametrize("request_id", [1, 0, -5, 2**70, "1", "", "listen-1", 'q"uote', "世界"])
def test_id_type_is_kept(request_id: jsonrpc.RequestId) -> None:  # H59
    request = parse(headers("subscriptions/listen"), listen(request_id=request_id))
    assert request.id == request_id and type(request.id) is type(request_id)
    exc = raises(headers("tasks/get", mcp_name=OTHER_ID), encode(get(request_id=request_id)))
    assert exc.request_id == request_id and type(exc.request_id) is type(request_id)


@pytest.mark.parametrize(
    "body",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
        {"jsonrpc": "2.0", "method": "tasks/get", "params": 5},
    ],
)
def test_notifications(body: dict[str, Any]) -> None:  # H6: shape checks only, no headers
    assert parse_request({}, encode(body)) == Notification(body["method"])


@pytest.mark.parametrize("request_id", [1, 2**70, "poll-7", ""])
def test_a_plain_poll_is_read_in_one_pass(request_id: jsonrpc.RequestId) -> None:
    found = plain_tasks_get(headers("tasks/get"), encode(get(request_id=request_id)))
    assert found == (request_id, TASK_ID) and type(found[0]) is type(request_id)


def sentinel(value: str) -> str:
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


@pytest.mark.parametrize("name", ["mcp_name", "mcp_method"])
def test_a_valid_poll_in_another_form_is_left_to_parse_request(name: str) -> None:
    value = TASK_ID if name == "mcp_name" else "tasks/get"
    hdrs, body = headers("tasks/get", **{name: sentinel(value)}), encode(get())
    assert plain_tasks_get(hdrs, body) is None
    assert parse(hdrs, get()).task_id == TASK_ID


@pytest.mark.parametrize(
    "hdrs, body",
    [
        (headers("tasks/get"), get(taskId=OTHER_ID)),
        (headers("tasks/get", mcp_protocol_version="2025-11-25"), get(_meta=meta("2025-11-25"))),
        (headers("tasks/get"), get(_meta=meta(caps={}))),
        (headers("tasks/get"), get(request_id=True)),
        (headers("tasks/get"), get(request_id=1.0)),
        (headers("tasks/get", mcp_name=TASK_ID + " "), get(taskId=TASK_ID + " ")),
        (headers("tasks/cancel"), message("tasks/cancel")),
    ],
)
def test_an_invalid_poll_is_left_to_parse_request(hdrs: dict[str, str], body: Any) -> None:
    assert plain_tasks_get(hdrs, encode(body)) is None
    if body["method"] == "tasks/get":
        raises(hdrs, encode(body))
    assert plain_tasks_get(hdrs, b"{") is None
