"""`tasks/result` under 2025-11-25: block until the task is terminal, asking for its input.

The answer is an SSE stream (the POST's own). While the task is `input_required`, each
outstanding input request is sent on it once as a server→client request (elicitation,
sampling) whose id names the task and the input key (`input_request_id`); the client's
response, POSTed to the session, becomes a `tasks/update` (hub/legacy/endpoint.py). When
the task is terminal, the stream's last event is the response: the underlying result
exactly, with the related-task `_meta`, or the same JSON-RPC error (its message in the
SDK's `McpError` form, as every error of the door's methods: hub/legacy/errors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
from starlette.types import Receive, Send

from hub.legacy.errors import error_object, method_error
from hub.legacy.vocabulary import RELATED_TASK_KEY, task_outcome
from hub.rpc import jsonrpc
from hub.runtime import Hub

_INPUT_PREFIX = "taskhub-input:"
SHUTDOWN_CHECK_S = 1.0  # how often a waiting stream looks whether the hub is shutting down


def input_request_id(task_id: str, key: str) -> str:
    return f"{_INPUT_PREFIX}{task_id}:{key}"


def parse_input_request_id(request_id: Any) -> tuple[str, str] | None:
    """(task id, input key) from the id of a response to one of our input requests."""
    if not isinstance(request_id, str) or not request_id.startswith(_INPUT_PREFIX):
        return None
    task_id, sep, key = request_id[len(_INPUT_PREFIX) :].partition(":")
    return (task_id, key) if sep and task_id and key else None


def _event(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + jsonrpc.line_safe(msgspec.json.encode(message)) + b"\n\n"


async def stream_result(
    hub: Hub, task_id: str, request_id: Any, receive: Receive, send: Send, headers: list[Any]
) -> None:
    """Answer `tasks/result` of the caller's task `task_id` (ownership checked by the
    caller) on `send`, until it is terminal or the client leaves."""
    await start_event_stream(send, headers)
    gone = asyncio.ensure_future(disconnected(receive))
    asked: set[str] = set()
    loop = asyncio.get_running_loop()
    last_write = loop.time()
    try:
        while not gone.done():
            waiter = hub.next_change(task_id)  # before the check: no revision slips between
            try:
                snapshot = hub.current(task_id)  # the snapshot's, or an upstream's own
                if snapshot is None:
                    gone_error = method_error(request_id, jsonrpc.task_not_found())
                    await _body(send, b"event: message\ndata: " + gone_error + b"\n\n")
                    return
                task = msgspec.json.decode(snapshot.body)
                if snapshot.terminal:
                    result, error = task_outcome(task)
                    final: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
                    if result is not None:
                        final["result"] = result
                    else:
                        final["error"] = error_object(error or {})
                    await _body(send, _event(final))
                    return
                for key, asked_for in (task.get("inputRequests") or {}).items():
                    if key in asked or not isinstance(asked_for, dict):
                        continue
                    asked.add(key)
                    await _body(send, _event(_input_request(task_id, key, asked_for)))
                    last_write = loop.time()
                await asyncio.wait(
                    (waiter, gone), timeout=SHUTDOWN_CHECK_S, return_when=asyncio.FIRST_COMPLETED
                )
                if hub.closing:  # the client asks again, at another replica
                    leaving = jsonrpc.internal_error("hub shutting down; retry tasks/result")
                    encoded = method_error(request_id, leaving)
                    await _body(send, b"event: message\ndata: " + encoded + b"\n\n")
                    return
                now = loop.time()
                if not waiter.done() and now - last_write >= hub.config.keepalive:
                    await _body(send, b": keep-alive\n\n")
                    last_write = now
            finally:
                waiter.cancel()
    except OSError:
        return  # the client went while we wrote
    finally:
        gone.cancel()
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b""})


def _input_request(task_id: str, key: str, asked_for: dict[str, Any]) -> dict[str, Any]:
    params = dict(asked_for.get("params") or {})
    meta = params.get("_meta")
    params["_meta"] = {
        **(meta if isinstance(meta, dict) else {}),
        RELATED_TASK_KEY: {"taskId": task_id},
    }
    return {
        "jsonrpc": "2.0",
        "id": input_request_id(task_id, key),
        "method": asked_for.get("method"),
        "params": params,
    }


async def stream_error(
    send: Send, request_id: Any, err: jsonrpc.RpcError, headers: list[Any]
) -> None:
    """A `tasks/result` refused before its stream began: the error, as the stream's one event."""
    await start_event_stream(send, headers)
    event = b"event: message\ndata: " + method_error(request_id, err) + b"\n\n"
    with contextlib.suppress(OSError):
        await send({"type": "http.response.body", "body": event})


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def start_event_stream(send: Send, headers: list[Any]) -> None:
    """The head of an SSE answer of the legacy door."""
    stream_headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]
    await send(
        {"type": "http.response.start", "status": 200, "headers": [*stream_headers, *headers]}
    )


async def disconnected(receive: Receive) -> None:
    """Returns when the client hangs up (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
