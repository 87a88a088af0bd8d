"""hub/protocol.py: every validation step of spec §2.5 (4–14), its code, HTTP status and id echo."""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from hub import jsonrpc
from hub.headers import encode_header_value
from hub.protocol import (
    CLIENT_CAPABILITIES_KEY,
    METHODS,
    PROTOCOL_VERSION_KEY,
    Notification,
    Request,
    RequestError,
    parse_request,
)

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
NO_EXT_CAPS = [
    pytest.param({}, id="caps-empty"),
    pytest.param({"extensions": {}}, id="extensions-empty"),
    pytest.param({"extensions": {"io.modelcontextprotocol/tasks": True}}, id="ext-not-object"),
    pytest.param({"extensions": {"io.modelcontextprotocol/tasks": None}}, id="ext-null"),
    pytest.param({"extensions": ["io.modelcontextprotocol/tasks"]}, id="extensions-list"),
    pytest.param({"tasks": {"requests": {}}}, id="legacy-tasks-capability"),
    pytest.param({"extensions": {"io.modelcontextprotocol/Tasks": {}}}, id="ext-case"),
]

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
    # subscriptions/listen: §8 item 21, H55, H32, taskIds shape.
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


@pytest.mark.parametrize("c", ERROR_CASES)
def test_errors(c: Case) -> None:
    exc = raises(c.headers, c.body)
    assert (exc.error.code, exc.error.http_status) == (c.code, c.status)
    assert exc.request_id == c.echoed_id and type(exc.request_id) is type(c.echoed_id)
    reply = msgspec.json.decode(jsonrpc.encode_error(exc.request_id, exc.error))
    assert ("id" in reply) is (c.echoed_id is not None)  # H71
    assert reply["error"]["code"] == c.code


@pytest.mark.parametrize("method", ["tasks/result", "tasks/list", "tools/call"])
def test_unknown_methods_are_404(method: str) -> None:  # H17, H18
    exc = raises(headers(method), encode(message(method, request_id="u")))
    assert (exc.error.code, exc.error.http_status, exc.request_id) == (-32601, 404, "u")
    assert method in exc.error.message
    assert exc.method == method


@pytest.mark.parametrize("sent_headers", [{}, {"mcp-protocol-version": "2025-11-25"}])
def test_initialize_names_the_supported_versions(sent_headers: dict[str, str]) -> None:  # H76
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25"}}  # fmt: skip
    exc = raises(sent_headers, encode(body))
    assert (exc.error.code, exc.error.http_status) == (-32022, 400)
    assert exc.error.data == {"supported": ["2026-07-28"], "requested": "2025-11-25"}


@pytest.mark.parametrize("method", TASK_METHODS)
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        pytest.param(None, "missing", id="missing"),
        pytest.param(OTHER_ID, "differs", id="differs"),
        pytest.param(TASK_ID.upper(), "differs", id="case-differs"),  # H16
        pytest.param(TASK_ID + " x", "differs", id="suffix"),
        pytest.param(" " + TASK_ID, "invalid", id="leading-space"),
        pytest.param(TASK_ID + "\x7f", "invalid", id="control-char"),
        pytest.param(encode_header_value(OTHER_ID + " "), "differs", id="sentinel-differs"),
        pytest.param("=?base64?" + TASK_ID + "?=", "invalid", id="sentinel-not-base64"),
        pytest.param("=?base64?/w==?=", "invalid", id="sentinel-not-utf8"),
    ],
)
def test_mcp_name_rules(method: str, name: str | None, reason: str) -> None:  # H13–H15
    exc = raises(headers(method, mcp_name=name), encode(message(method)))
    assert (exc.error.code, exc.error.http_status, exc.request_id) == (-32020, 400, 1)
    expected = {"missing": "missing", "differs": "does not match", "invalid": "invalid"}[reason]
    assert expected in exc.error.message


@pytest.mark.parametrize("method", TASK_METHODS)
def test_mcp_name_checked_before_capability(method: str) -> None:  # §2.5: step 12 before 13
    body = encode(message(method, _meta=meta(caps={})))
    exc = raises(headers(method, mcp_name=OTHER_ID), body)
    assert exc.error.code == -32020


@pytest.mark.parametrize("method", TASK_METHODS)
def test_task_id_not_a_string_is_bad_params_not_mismatch(method: str) -> None:
    """Choice: a non-string taskId cannot be compared with Mcp-Name, so it is step 14."""
    exc = raises(headers(method), encode(message(method, taskId=123)))
    assert (exc.error.code, exc.error.http_status) == (-32602, 200)


@pytest.mark.parametrize("method", TASK_METHODS)
@pytest.mark.parametrize("caps", NO_EXT_CAPS)
def test_tasks_methods_need_the_extension(method: str, caps: Any) -> None:  # H31
    exc = raises(headers(method), encode(message(method, _meta=meta(caps=caps))))
    assert (exc.error.code, exc.error.http_status, exc.request_id) == (-32021, 400, 1)
    assert exc.error.data == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }


def test_header_mismatch_message_names_both_values() -> None:  # H72, spec §1.4 example
    exc = raises(headers("tasks/get", mcp_name="foo"), encode(get(taskId="bar")))
    assert exc.error.message == (
        "Header mismatch: Mcp-Name header value 'foo' does not match body value 'bar'"
    )


def test_unsupported_version_data() -> None:  # H10
    exc = raises(
        headers("server/discover", mcp_protocol_version="1900-01-01"),
        encode(message("server/discover", _meta=meta(version="1900-01-01"))),
    )
    assert exc.error.data == {"supported": ["2026-07-28"], "requested": "1900-01-01"}


def test_missing_meta_beats_missing_method_header() -> None:  # §2.5: step 7 before step 10
    exc = raises(headers("tasks/get", mcp_method=None), encode(get(_meta=MISSING)))
    assert (exc.error.code, exc.error.http_status) == (-32602, 400)


def test_error_carries_the_method() -> None:
    exc = raises(headers("tasks/get", mcp_method=None), encode(get()))
    assert exc.method == "tasks/get"
    assert raises({}, b"[]").method is None


# Happy paths.


def parse(hdrs: Any, body: Any) -> Request:
    result = parse_request(hdrs, encode(body))
    assert isinstance(result, Request)
    return result


def test_discover() -> None:
    body = message("server/discover", request_id="discover-1")
    body["params"] = {"_meta": meta(caps={})}
    request = parse(headers("server/discover"), body)
    assert request == Request(
        id="discover-1",
        method="server/discover",
        params=body["params"],
        client_capabilities={},
        declared_tasks=False,
    )


def test_discover_ignores_mcp_name() -> None:
    request = parse(headers("server/discover", mcp_name=" junk "), message("server/discover"))
    assert request.task_id is None and request.declared_tasks


@pytest.mark.parametrize("method", ["tasks/get", "tasks/cancel"])
def test_get_and_cancel(method: str) -> None:
    request = parse(headers(method), message(method, request_id=4))
    assert (request.id, request.method, request.task_id) == (4, method, TASK_ID)
    assert request.declared_tasks and request.client_capabilities == TASKS
    assert request.input_responses is None and request.task_ids is None


def test_update() -> None:
    responses = {"name": {"action": "accept", "content": {"name": "Luca"}}, "stale": {}}
    request = parse(headers("tasks/update"), message("tasks/update", inputResponses=responses))
    assert request.task_id == TASK_ID
    assert request.input_responses == responses  # opaque; stale keys are the owner's business


def test_update_with_empty_input_responses() -> None:
    request = parse(headers("tasks/update"), message("tasks/update", inputResponses={}))
    assert request.input_responses == {}


def test_listen() -> None:
    ids = [TASK_ID, OTHER_ID, TASK_ID]
    request = parse(
        headers("subscriptions/listen"),
        listen(notifications={"taskIds": ids, "toolsListChanged": True, "x": 1}),
    )
    assert request.task_ids == (TASK_ID, OTHER_ID)  # de-duplicated, order kept
    assert request.task_id is None


def test_listen_with_empty_task_ids() -> None:
    request = parse(headers("subscriptions/listen"), listen(notifications={"taskIds": []}))
    assert request.task_ids == ()


@pytest.mark.parametrize("caps", [{}, TASKS])
def test_listen_without_task_ids_needs_no_extension(caps: Any) -> None:
    body = listen(_meta=meta(caps=caps), notifications={"toolsListChanged": True})
    request = parse(headers("subscriptions/listen"), body)
    assert request.task_ids is None
    assert request.declared_tasks is (caps == TASKS)


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "",
        "application/json, text/event-stream",
        "text/event-stream",
        "TEXT/EVENT-STREAM;q=0.9",
        "application/json;q=1, text/*",
        "*/*",
    ],
)
def test_listen_accept_is_lenient(accept: str | None) -> None:  # §8 item 21
    request = parse(headers("subscriptions/listen", accept=accept), listen())
    assert request.method == "subscriptions/listen"


def test_accept_is_not_checked_for_json_replies() -> None:  # §8 item 21
    parse(headers("tasks/get", accept="application/json"), get())


@pytest.mark.parametrize(
    "task_id", ["short", "has space", "Hello, 世界", "=?base64?literal?=", "", "x" * 500]
)
def test_task_id_syntax_is_not_judged_here(task_id: str) -> None:
    """An id outside the task-id syntax is "not found" (-32602), decided by the handler."""
    request = parse(
        headers("tasks/get", mcp_name=encode_header_value(task_id)), get(taskId=task_id)
    )
    assert request.task_id == task_id


def test_mcp_name_sentinel_is_decoded() -> None:  # H14
    task_id = "Hello, 世界"
    hdrs = headers("tasks/get", mcp_name="=?base64?SGVsbG8sIOS4lueVjA==?=")
    assert parse(hdrs, get(taskId=task_id)).task_id == task_id


def test_mcp_method_sentinel_is_decoded() -> None:
    hdrs = headers("tasks/get", mcp_method="=?base64?dGFza3MvZ2V0?=")  # "tasks/get"
    assert parse(hdrs, get()).method == "tasks/get"


def test_header_names_are_case_insensitive() -> None:  # H16, with Starlette's Headers
    # ASGI servers lower-case names; Starlette's Headers also looks names up case-insensitively.
    hdrs = Headers(
        headers={"MCP-Protocol-Version": VERSION, "Mcp-Method": "tasks/get", "mCp-NaMe": TASK_ID}
    )
    assert parse(hdrs, get()).task_id == TASK_ID


def test_ignored_headers_and_optional_meta() -> None:  # H3, H11
    hdrs = headers("tasks/get", mcp_session_id="abc", last_event_id="7")
    body_meta = meta()
    del body_meta["io.modelcontextprotocol/clientInfo"]
    body_meta["progressToken"] = 5
    request = parse(hdrs, get(_meta=body_meta))
    assert request.task_id == TASK_ID


def test_extra_members_are_tolerated() -> None:
    body = {**get(), "extra": True}
    body["params"]["unknown"] = [1]
    caps = {
        "extensions": {"io.modelcontextprotocol/tasks": {}, "vendor.x/y": {"a": 1}},
        "roots": {},
    }
    body["params"]["_meta"] = meta(caps=caps)
    assert parse(headers("tasks/get"), body).declared_tasks


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


# Property: anything in, a value or a RequestError out.

CODE_STATUS = {
    -32700: {400},
    -32600: {400},
    -32601: {404},
    -32602: {200, 400},
    -32020: {400},
    -32021: {400},
    -32022: {400},
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
METHOD_NAMES = [*sorted(METHODS), "tasks/result", "Tasks/Get", "notifications/x"]


header_values = st.one_of(
    st.sampled_from([VERSION, TASK_ID, OTHER_ID, "text/event-stream", "application/json"]),
    st.sampled_from(METHOD_NAMES),
    st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=12),
    st.text(max_size=8).map(encode_header_value),
)
header_maps = st.dictionaries(
    st.sampled_from(["mcp-protocol-version", "mcp-method", "mcp-name", "accept"]),
    header_values,
)


def check_outcome(hdrs: dict[str, str], body: bytes) -> None:
    try:
        result = parse_request(hdrs, body)
    except RequestError as exc:
        err = exc.error
        assert err.http_status in CODE_STATUS[err.code]
        assert exc.request_id is None or (
            type(exc.request_id) in (str, int) and not isinstance(exc.request_id, bool)
        )
        msgspec.json.decode(jsonrpc.encode_error(exc.request_id, err))
        return
    if isinstance(result, Notification):
        return
    assert result.method in METHODS
    assert type(result.id) in (str, int)
    if result.method in TASK_METHODS:
        assert result.declared_tasks and isinstance(result.task_id, str)
        assert result.task_id == hdrs["mcp-name"] or hdrs["mcp-name"].startswith("=?base64?")
    if result.method == "tasks/update":
        assert isinstance(result.input_responses, dict)
    if result.task_ids is not None:
        assert result.declared_tasks
        assert all(isinstance(t, str) for t in result.task_ids)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64), header_maps)
def test_arbitrary_bytes(body: bytes, hdrs: dict[str, str]) -> None:
    check_outcome(hdrs, body)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, header_maps)
def test_arbitrary_json(body: Any, hdrs: dict[str, str]) -> None:
    check_outcome(hdrs, encode(body))


BODY_PATHS: list[tuple[str, ...]] = [
    ("jsonrpc",),
    ("id",),
    ("method",),
    ("params",),
    ("params", "_meta"),
    ("params", "_meta", PROTOCOL_VERSION_KEY),
    ("params", "_meta", CLIENT_CAPABILITIES_KEY),
    ("params", "_meta", CLIENT_CAPABILITIES_KEY, "extensions"),
    ("params", "_meta", CLIENT_CAPABILITIES_KEY, "extensions", "io.modelcontextprotocol/tasks"),
    ("params", "taskId"),
    ("params", "inputResponses"),
    ("params", "notifications"),
    ("params", "notifications", "taskIds"),
]
HEADER_NAMES = ["mcp-protocol-version", "mcp-method", "mcp-name", "accept"]
# A replacement: drop the member, or set a plausible or an arbitrary value.
replacements = st.one_of(
    st.just(MISSING),
    st.sampled_from([*METHOD_NAMES, VERSION, "2025-11-25", TASK_ID, [TASK_ID], {}, TASKS, 1]),
    json_values,
)


def mutate(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    *parents, last = path
    target: Any = body
    for key in parents:
        target = target.get(key) if isinstance(target, dict) else None
    if not isinstance(target, dict):
        return
    if value is MISSING:
        target.pop(last, None)
    else:
        target[last] = value


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(METHODS)),
    st.lists(st.tuples(st.sampled_from(BODY_PATHS), replacements), max_size=2),
    st.lists(st.tuples(st.sampled_from(HEADER_NAMES), st.none() | header_values), max_size=1),
)
def test_mutated_valid_requests(
    method: str,
    body_changes: list[tuple[tuple[str, ...], Any]],
    header_changes: list[tuple[str, str | None]],
) -> None:
    """One or two edits to a good request: reaches every step, not just the first ones."""
    body = copy.deepcopy(message(method))  # shared constants must not be edited (or cycled)
    for path, value in body_changes:
        mutate(body, path, value if value is MISSING else copy.deepcopy(value))
    hdrs = headers(method)
    for name, header_value in header_changes:
        if header_value is None:
            hdrs.pop(name, None)
        else:
            hdrs[name] = header_value
    check_outcome(hdrs, encode(body))
