"""hub/legacy/errors.py: the legacy door's errors, shaped as the SDK 1.x server's."""

from __future__ import annotations

import json

from hub import jsonrpc
from hub.legacy.errors import error_object, keeps_status, mcp_message, method_error


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
