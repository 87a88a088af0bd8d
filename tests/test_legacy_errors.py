"""hub/legacy/errors.py: the legacy door's errors, shaped as the SDK 1.x server's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hub.legacy.errors import (
    Refusal,
    check_get_accept,
    check_message,
    check_post_head,
    error_object,
    keeps_status,
    mcp_message,
    method_error,
    session_not_found,
)
from hub.rpc import jsonrpc


def test_a_method_error_carries_its_code_in_the_message_once() -> None:
    assert mcp_message(-32602, "Invalid cursor") == "MCP error -32602: Invalid cursor"
    assert mcp_message(-32602, "MCP error -32602: Invalid cursor") == (
        "MCP error -32602: Invalid cursor"
    )
    answer = json.loads(method_error("a", jsonrpc.RpcError(-32601, "Method not found", {"x": 1})))
    assert answer == {
        "jsonrpc": "2.0",
        "id": "a",
        "error": {
            "code": -32601,
            "message": "MCP error -32601: Method not found",
            "data": {"x": 1},
        },
    }
    failed = error_object({"code": -32000, "message": "tool broke", "data": [1]})
    assert failed == {"code": -32000, "message": "MCP error -32000: tool broke", "data": [1]}


def test_only_credentials_and_back_off_keep_their_status() -> None:
    assert keeps_status(jsonrpc.RpcError(jsonrpc.UNAUTHORIZED, "no", http_status=403))
    assert keeps_status(jsonrpc.rate_limited("slow down", "1"))
    assert not keeps_status(jsonrpc.internal_error("store down"))
    assert not keeps_status(jsonrpc.method_not_found("x"))


def test_a_refusal_body_has_a_null_id() -> None:
    assert json.loads(session_not_found().body()) == {
        "jsonrpc": "2.0",
        "error": {"code": -32001, "message": "Session not found"},
        "id": None,
    }


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": "a", "method": "tasks/get", "params": {"taskId": "t"}},
        {"jsonrpc": "2.0", "id": 2.0, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "x", "result": {}},
        {"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "no"}},
        {"jsonrpc": "2.0", "error": {"code": -1, "message": "no", "data": None}},
    ],
)
def test_one_json_rpc_message_is_read(message: dict[str, Any]) -> None:
    assert check_message(json.dumps(message).encode()) == message


@pytest.mark.parametrize(
    "body",
    [
        b'"ping"',
        b'{"id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":true,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":null,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":7}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":[]}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","extra":1}',
        b'{"jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","id":1,"result":5}',
        b'{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}',
    ],
)
def test_anything_else_is_refused_as_the_sdk_refuses_it(body: bytes) -> None:
    with pytest.raises(Refusal) as refused:
        check_message(body)
    assert (refused.value.status, refused.value.code) == (400, -32700)
    assert refused.value.message == "Parse error: Invalid JSON-RPC message"


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (b"{nope", -32700, "Parse error: Invalid JSON"),
        (b"", -32700, "Parse error: Invalid JSON"),
        (b"[]", -32600, "Invalid Request: JSON-RPC batches are not supported"),
    ],
)
def test_no_json_and_batches_are_refused(body: bytes, code: int, message: str) -> None:
    with pytest.raises(Refusal) as refused:
        check_message(body)
    assert (refused.value.status, refused.value.code, refused.value.message) == (400, code, message)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, None),
        ({"accept": "application/json, text/event-stream"}, None),
        ({"content-type": "application/json"}, None),
        ({"accept": "*/*", "content-type": "Application/JSON; charset=utf-8"}, None),
        ({"accept": "application/*, text/*"}, None),
        ({"accept": "text/event-stream;q=0.9, application/json"}, None),
        ({"accept": "application/json"}, 406),
        ({"accept": "text/event-stream"}, 406),
        ({"accept": "text/html"}, 406),
        ({"content-type": "text/plain"}, 415),
        ({"content-type": "text/plain; a=application/json"}, 415),
        ({"content-type": ""}, 415),
    ],
)
def test_a_post_head_admits_both_answers_and_sends_json(
    headers: dict[str, str], status: int | None
) -> None:
    if status is None:
        check_post_head(headers)
        return
    with pytest.raises(Refusal) as refused:
        check_post_head(headers)
    assert refused.value.status == status and refused.value.code == -32000


def test_a_get_admits_the_event_stream() -> None:
    check_get_accept({})
    check_get_accept({"accept": "text/event-stream"})
    check_get_accept({"accept": "text/*"})
    with pytest.raises(Refusal) as refused:
        check_get_accept({"accept": "application/json"})
    assert refused.value.status == 406
    assert refused.value.message == "Not Acceptable: Client must accept text/event-stream"
