"""The 2025-11-25 task vocabulary, translated to and from the modern one, both ways.

Pure functions over decoded JSON: the legacy endpoint (hub/legacy/endpoint.py) is the only
caller, so no legacy shape ever reaches the modern path, nor a modern one a legacy client
(docs/legacy.md has the mapping table and the choices made where the two differ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
)

LEGACY_VERSION = "2025-11-25"
RELATED_TASK_KEY = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE_KEY = "io.modelcontextprotocol/model-immediate-response"
# What `initialize` answers the hub offers under 2025-11-25 (docs/legacy.md#sessions).
TASKS_CAPABILITY: dict[str, Any] = {
    "list": {},
    "cancel": {},
    "requests": {"tools": {"call": {}}},
}
TERMINAL = frozenset({"completed", "failed", "cancelled"})


def legacy_status(task: Mapping[str, Any]) -> str:
    """The legacy status: a tool result with `isError: true` is `failed` under 2025-11-25,
    `completed` in the modern extension."""
    status = str(task["status"])
    result = task.get("result")
    if status == "completed" and isinstance(result, Mapping) and result.get("isError") is True:
        return "failed"
    return status


def legacy_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """A modern (Detailed)Task as the legacy flat `Task`: `ttl` and `pollInterval` without
    the `Ms`, no `result`, `error` or `inputRequests` (those travel by `tasks/result`)."""
    legacy: dict[str, Any] = {"taskId": task["taskId"], "status": legacy_status(task)}
    if task.get("statusMessage") is not None:
        legacy["statusMessage"] = task["statusMessage"]
    legacy["createdAt"] = task["createdAt"]
    legacy["lastUpdatedAt"] = task["lastUpdatedAt"]
    legacy["ttl"] = task.get("ttlMs")
    if task.get("pollIntervalMs") is not None:
        legacy["pollInterval"] = task["pollIntervalMs"]
    return legacy


def created_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """A modern `CreateTaskResult` (flat, `resultType: "task"`) as the legacy nested one."""
    nested: dict[str, Any] = {"task": legacy_task(result)}
    meta = result.get("_meta")
    if isinstance(meta, Mapping) and IMMEDIATE_RESPONSE_KEY in meta:
        nested["_meta"] = {IMMEDIATE_RESPONSE_KEY: meta[IMMEDIATE_RESPONSE_KEY]}
    return nested


def plain_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """A modern complete result as the legacy one: no `resultType`, the hub's `_meta` kept."""
    return {key: value for key, value in result.items() if key != "resultType"}


def legacy_tools(result: Mapping[str, Any]) -> dict[str, Any]:
    """`tools/list` for a legacy client: each tool says it may run as a task.

    The modern protocol has no per-tool task support (the server decides per request), so
    every tool gets `execution.taskSupport: "optional"` unless it says otherwise: a legacy
    client may ask for a task, and the upstream still decides.
    """
    listed = plain_result(result)
    tools = listed.get("tools")
    if isinstance(tools, list):
        listed["tools"] = [_with_task_support(tool) for tool in tools]
    return listed


def _with_task_support(tool: Any) -> Any:
    if not isinstance(tool, Mapping) or isinstance(tool.get("execution"), Mapping):
        return tool
    return {**tool, "execution": {"taskSupport": "optional"}}


def modern_meta(
    legacy_capabilities: Mapping[str, Any], client_info: Any, *, tasks: bool
) -> dict[str, Any]:
    """The per-request `_meta` a modern server needs, from what the session negotiated.

    Elicitation and sampling carry over (the hub relays their requests); roots do not
    (the hub cannot ask a legacy client for them later). The tasks extension is declared
    only when the legacy request asked for a task (`params.task`).
    """
    capabilities: dict[str, Any] = {}
    for name in ("elicitation", "sampling"):
        value = legacy_capabilities.get(name)
        if isinstance(value, Mapping):
            capabilities[name] = dict(value)
    if tasks:
        capabilities["extensions"] = {TASKS_EXTENSION: {}}
    meta: dict[str, Any] = {
        PROTOCOL_VERSION_KEY: PROTOCOL_VERSION,
        CLIENT_CAPABILITIES_KEY: capabilities,
    }
    if isinstance(client_info, Mapping):
        meta[CLIENT_INFO_KEY] = dict(client_info)
    return meta


def modern_params(
    params: Mapping[str, Any], legacy_capabilities: Mapping[str, Any], client_info: Any
) -> tuple[dict[str, Any], bool]:
    """A legacy request's params for the modern upstream, and whether it asked for a task.

    `params.task` (with its `ttl`) becomes the tasks extension's declaration; the task's
    lifetime is the server's to choose in the modern protocol, so `ttl` is dropped. The
    legacy `_meta` keys the modern protocol keeps (`progressToken`, trace context) stay.
    """
    modern = {key: value for key, value in params.items() if key not in ("task", "_meta")}
    wants_task = isinstance(params.get("task"), Mapping)
    meta = params.get("_meta")
    kept = dict(meta) if isinstance(meta, Mapping) else {}
    kept.update(modern_meta(legacy_capabilities, client_info, tasks=wants_task))
    modern["_meta"] = kept
    return modern, wants_task


def task_outcome(task: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """`tasks/result` of a terminal task: (result, None) or (None, JSON-RPC error).

    completed → the underlying result exactly (less the modern `resultType`), with the
    related-task `_meta` added;
    failed → the same JSON-RPC error; cancelled has neither, so it answers -32603
    "Task was cancelled" (the choice the TypeScript SDK 1.x makes for its own clients).
    """
    task_id = task["taskId"]
    if task["status"] == "completed" and isinstance(task.get("result"), Mapping):
        result = plain_result(task["result"])
        meta = result.get("_meta")
        result["_meta"] = {
            **(meta if isinstance(meta, Mapping) else {}),
            RELATED_TASK_KEY: {"taskId": task_id},
        }
        return result, None
    if task["status"] == "failed" and isinstance(task.get("error"), Mapping):
        return None, dict(task["error"])
    return None, {"code": -32603, "message": f"Task {task_id} was cancelled"}


def is_modern_request(params: Any) -> bool:
    """A request carrying modern per-request `_meta` belongs at `/mcp` (docs/legacy.md)."""
    if not isinstance(params, Mapping):
        return False
    meta = params.get("_meta")
    return isinstance(meta, Mapping) and PROTOCOL_VERSION_KEY in meta
