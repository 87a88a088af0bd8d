"""hub/rpc/request.py, the routing headers against the body: Mcp-Name and Mcp-Method must
match exactly (after base64 sentinels are decoded), Accept is lenient, others are ignored."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from hub.rpc.routing_headers import encode_header_value
from tests.test_protocol import (
    OTHER_ID,
    TASK_ID,
    TASK_METHODS,
    VERSION,
    encode,
    get,
    headers,
    listen,
    message,
    meta,
    parse,
    raises,
)


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


def test_header_mismatch_message_names_both_values() -> None:  # H72
    exc = raises(headers("tasks/get", mcp_name="foo"), encode(get(taskId="bar")))
    assert exc.error.message == (
        "Header mismatch: Mcp-Name header value 'foo' does not match body value 'bar'"
    )


def test_discover_ignores_mcp_name() -> None:
    request = parse(headers("server/discover", mcp_name=" junk "), message("server/discover"))
    assert request.task_id is None and request.declared_tasks


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
def test_listen_accept_is_lenient(accept: str | None) -> None:  # D21
    request = parse(headers("subscriptions/listen", accept=accept), listen())
    assert request.method == "subscriptions/listen"


def test_accept_is_not_checked_for_json_replies() -> None:  # D21
    parse(headers("tasks/get", accept="application/json"), get())


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
