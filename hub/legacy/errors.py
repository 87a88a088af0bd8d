"""The legacy door's errors of methods, as the 2025-11-25 TypeScript SDK server sends them.

A 2025-11-25 client learns an error's code only where `@modelcontextprotocol/sdk` 1.x puts
it (docs/legacy.md#errors). An error of a method (the request was read and its method
refused it) is a JSON-RPC error at HTTP 200 with the request's id, its message in the SDK's
`McpError` form `MCP error <code>: …`. The 1.x client raises an `McpError` with the code,
and a tool that shows only the message (the Inspector CLI) still shows it; a non-2xx status
would leave the client an HTTP error without the code.

Credentials and back-off keep their HTTP status (`keeps_status`): a client or a proxy acts
on the status of those, not on the body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hub import jsonrpc
from hub.jsonrpc import RpcError

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
