"""hub/rpc/jsonrpc.py: error constructors and the bytes of every reply envelope."""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge import vocabulary
from hub.rpc import jsonrpc
from hub.rpc.jsonrpc import RpcError

SERVER_META = {"io.modelcontextprotocol/serverInfo": {"name": "taskhub", "version": "0.1.0"}}
TASKS_DATA: dict[str, Any] = {
    "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
}


def decode(raw: bytes) -> Any:
    return msgspec.json.decode(raw)


@pytest.mark.parametrize(
    ("err", "code", "status", "data"),
    [
        pytest.param(jsonrpc.parse_error(), -32700, 400, None, id="parse_error"),
        pytest.param(jsonrpc.invalid_request(), -32600, 400, None, id="invalid_request"),
        pytest.param(jsonrpc.method_not_found("x/y"), -32601, 404, None, id="method_not_found"),
        pytest.param(jsonrpc.invalid_params("bad"), -32602, 200, None, id="invalid_params"),
        pytest.param(
            jsonrpc.invalid_params("no _meta", http_status=400),
            -32602,
            400,
            None,
            id="invalid_params_400",
        ),
        pytest.param(jsonrpc.task_not_found(), -32602, 200, None, id="task_not_found"),
        pytest.param(jsonrpc.internal_error("nats down"), -32603, 500, None, id="internal_error"),
        pytest.param(jsonrpc.header_mismatch("x"), -32020, 400, None, id="header_mismatch"),
        pytest.param(jsonrpc.missing_capability(), -32021, 400, TASKS_DATA, id="missing_cap"),
        pytest.param(
            jsonrpc.unsupported_version("1900-01-01", ("2026-07-28",)),
            -32022,
            400,
            {"supported": ["2026-07-28"], "requested": "1900-01-01"},
            id="unsupported_version",
        ),
    ],
)
def test_constructors(err: RpcError, code: int, status: int, data: Any) -> None:
    assert (err.code, err.http_status, err.data) == (code, status, data)
    assert err.headers == {}
    assert str(err) == err.message


def test_messages_are_informative() -> None:  # H72, H42 wording
    assert jsonrpc.task_not_found().message == "Failed to retrieve task: Task not found"
    assert jsonrpc.method_not_found("tasks/list").message == "Method not found: tasks/list"
    assert jsonrpc.header_mismatch("Mcp-Name differs").message.startswith("Header mismatch: ")
    assert jsonrpc.missing_capability().message == "Missing required client capability"
    assert jsonrpc.unsupported_version("x", ["2026-07-28"]).message == (
        "Unsupported protocol version"
    )


def test_method_not_found_shortens_a_huge_method() -> None:
    message = jsonrpc.method_not_found("m" * 10_000).message
    assert len(message) < 200 and message.endswith("…")


def test_headers_are_per_instance() -> None:
    first, second = jsonrpc.parse_error(), jsonrpc.parse_error()
    first.headers["Retry-After"] = "1"
    assert second.headers == {}
    err = RpcError(-1, "slow down", http_status=429, headers={"Retry-After": "2"})
    assert err.headers == {"Retry-After": "2"}


@pytest.mark.parametrize(
    ("request_id", "expected"),
    [
        pytest.param(None, {"jsonrpc": "2.0"}, id="no-id"),
        pytest.param(7, {"jsonrpc": "2.0", "id": 7}, id="int"),
        pytest.param("7", {"jsonrpc": "2.0", "id": "7"}, id="str"),
        pytest.param(0, {"jsonrpc": "2.0", "id": 0}, id="zero"),
        pytest.param("", {"jsonrpc": "2.0", "id": ""}, id="empty-str"),
    ],
)
def test_encode_error_id(request_id: jsonrpc.RequestId | None, expected: dict[str, Any]) -> None:
    message = decode(jsonrpc.encode_error(request_id, jsonrpc.parse_error("Parse error")))
    assert message == {**expected, "error": {"code": -32700, "message": "Parse error"}}
    # H71: "id" is absent, not null, when the request could not be read.
    assert ("id" in message) is (request_id is not None)


def test_encode_error_data() -> None:
    raw = jsonrpc.encode_error(12, jsonrpc.missing_capability())
    assert decode(raw) == {
        "jsonrpc": "2.0",
        "id": 12,
        "error": {
            "code": -32021,
            "message": "Missing required client capability",
            "data": TASKS_DATA,
        },
    }
    assert b'"data"' not in jsonrpc.encode_error(12, jsonrpc.task_not_found())


def test_server_info() -> None:
    assert {"name": "taskhub", "version": version("taskhub")} == jsonrpc.SERVER_INFO
    assert vocabulary.SERVER_INFO_KEY == "io.modelcontextprotocol/serverInfo"


def test_encode_result_adds_server_info() -> None:  # H29
    raw = jsonrpc.encode_result("d-1", {"resultType": "complete", "ttlMs": 0})
    assert decode(raw) == {
        "jsonrpc": "2.0",
        "id": "d-1",
        "result": {"resultType": "complete", "ttlMs": 0, "_meta": SERVER_META},
    }


def test_encode_result_merges_existing_meta() -> None:
    result = {"resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": 3}}
    raw = jsonrpc.encode_result(3, result)
    assert decode(raw)["result"]["_meta"] == {
        "io.modelcontextprotocol/subscriptionId": 3,
        **SERVER_META,
    }
    assert result["_meta"] == {"io.modelcontextprotocol/subscriptionId": 3}  # not mutated


@pytest.mark.parametrize("request_id", [9, "9", "cancel-☃"])
def test_complete_ack(request_id: jsonrpc.RequestId) -> None:  # H47, H51
    assert decode(jsonrpc.complete_ack(request_id)) == {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {"resultType": "complete", "_meta": SERVER_META},
    }


@pytest.mark.parametrize(
    "request_id",
    [0, -1, 2**53 + 1, 10**30, "", "a", 'q"uo\\te', "Hello, 世界", "\u2028", "\x00\n"],
)
def test_encode_id_examples(request_id: jsonrpc.RequestId) -> None:
    encoded = jsonrpc.encode_id(request_id)
    decoded = decode(encoded)
    assert decoded == request_id and type(decoded) is type(request_id)
    assert b"\n" not in encoded  # safe inside one SSE data: line


@given(st.integers() | st.text())
def test_encode_id_round_trips(request_id: jsonrpc.RequestId) -> None:
    decoded = decode(jsonrpc.encode_id(request_id))
    assert decoded == request_id and type(decoded) is type(request_id)
    spliced = b'{"id":' + jsonrpc.encode_id(request_id) + b"}"
    assert decode(spliced) == {"id": request_id}


@given(st.recursive(st.text() | st.integers(), lambda inner: st.dictionaries(st.text(), inner)))
def test_line_safe_json_is_the_same_value_on_one_line(value: Any) -> None:
    safe = jsonrpc.line_safe(msgspec.json.encode(value))
    assert msgspec.json.decode(safe) == value
    assert len(safe.decode().splitlines()) == 1  # as str.splitlines-based clients split


def test_a_request_id_with_line_separators_is_escaped() -> None:
    assert jsonrpc.encode_id("a\u2028b\x85c\u2029") == b'"a\\u2028b\\u0085c\\u2029"'


@pytest.mark.parametrize("request_id", ["\x85", "a\u2028b", "\u2029", 7])
def test_replies_stay_one_sse_line_whatever_the_id(request_id: str | int) -> None:
    """A reply may go out as an SSE event's data line (the legacy door's tasks/result, a
    front-door error mid-stream): U+0085, U+2028 and U+2029 are escaped, not cut on."""
    message = "no \u2028 here"
    replies = [
        jsonrpc.encode_error(request_id, RpcError(-32602, message)),
        jsonrpc.encode_result(request_id, {"note": message}),
    ]
    for reply in replies:
        text = reply.decode()
        assert text.splitlines() == [text]
        assert json.loads(text)["id"] == request_id
