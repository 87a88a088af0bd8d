"""hub/rpc/request.py, method by method: which methods exist, what each needs in params and
capabilities, and what a valid request parses to."""

from __future__ import annotations

from typing import Any

import pytest

from hub.rpc.request import Request
from hub.rpc.routing_headers import encode_header_value
from tests.test_protocol import (
    OTHER_ID,
    TASK_ID,
    TASK_METHODS,
    TASKS,
    encode,
    get,
    headers,
    listen,
    message,
    meta,
    parse,
    raises,
)

NO_EXT_CAPS = [
    pytest.param({}, id="caps-empty"),
    pytest.param({"extensions": {}}, id="extensions-empty"),
    pytest.param({"extensions": {"io.modelcontextprotocol/tasks": True}}, id="ext-not-object"),
    pytest.param({"extensions": {"io.modelcontextprotocol/tasks": None}}, id="ext-null"),
    pytest.param({"extensions": ["io.modelcontextprotocol/tasks"]}, id="extensions-list"),
    pytest.param({"tasks": {"requests": {}}}, id="legacy-tasks-capability"),
    pytest.param({"extensions": {"io.modelcontextprotocol/Tasks": {}}}, id="ext-case"),
]


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
    assert (exc.error.code, exc.error.http_status) == (-32601, 404)  # removed (SEP-2575)
    assert exc.error.data == {"supported": ["2026-07-28"], "requested": "2025-11-25"}
    assert "/legacy/mcp" in exc.error.message


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


def test_unsupported_version_data() -> None:  # H10
    exc = raises(
        headers("server/discover", mcp_protocol_version="1900-01-01"),
        encode(message("server/discover", _meta=meta(version="1900-01-01"))),
    )
    assert exc.error.data == {"supported": ["2026-07-28"], "requested": "1900-01-01"}


# Happy paths.


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
    "task_id", ["short", "has space", "Hello, 世界", "=?base64?literal?=", "", "x" * 500]
)
def test_task_id_syntax_is_not_judged_here(task_id: str) -> None:
    """An id outside the task-id syntax is "not found" (-32602), decided by the handler."""
    request = parse(
        headers("tasks/get", mcp_name=encode_header_value(task_id)), get(taskId=task_id)
    )
    assert request.task_id == task_id


def test_extra_members_are_tolerated() -> None:
    body = {**get(), "extra": True}
    body["params"]["unknown"] = [1]
    caps = {
        "extensions": {"io.modelcontextprotocol/tasks": {}, "vendor.x/y": {"a": 1}},
        "roots": {},
    }
    body["params"]["_meta"] = meta(caps=caps)
    assert parse(headers("tasks/get"), body).declared_tasks
