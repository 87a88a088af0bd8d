"""hub/legacy/vocabulary.py: the 2025-11-25 shapes, translated both ways."""

from __future__ import annotations

from typing import Any

from hub.legacy.vocabulary import (
    RELATED_TASK_KEY,
    created_result,
    is_modern_request,
    legacy_task,
    legacy_tools,
    modern_params,
    task_outcome,
)

TASK: dict[str, Any] = {
    "taskId": "t-1",
    "status": "working",
    "statusMessage": "step 1",
    "createdAt": "2026-01-01T00:00:00Z",
    "lastUpdatedAt": "2026-01-01T00:00:01Z",
    "ttlMs": 60000,
    "pollIntervalMs": 500,
}


def test_a_task_is_flat_with_the_old_field_names() -> None:
    assert legacy_task({**TASK, "inputRequests": {"k": {}}}) == {
        "taskId": "t-1",
        "status": "working",
        "statusMessage": "step 1",
        "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:01Z",
        "ttl": 60000,
        "pollInterval": 500,
    }
    unlimited = legacy_task({**TASK, "ttlMs": None, "pollIntervalMs": None})
    assert unlimited["ttl"] is None and "pollInterval" not in unlimited


def test_is_error_is_failed_under_2025_11_25_only() -> None:
    tool_error = {**TASK, "status": "completed", "result": {"content": [], "isError": True}}
    assert legacy_task(tool_error)["status"] == "failed"
    fine = {**TASK, "status": "completed", "result": {"content": [], "isError": False}}
    assert legacy_task(fine)["status"] == "completed"
    result, error = task_outcome(tool_error)  # the result itself is kept exactly
    assert error is None and result is not None and result["isError"] is True


def test_a_created_task_is_nested() -> None:
    created = created_result({**TASK, "resultType": "task", "_meta": {"other": 1}})
    assert set(created) == {"task"} and created["task"]["ttl"] == 60000
    immediate = "io.modelcontextprotocol/model-immediate-response"
    kept = created_result({**TASK, "resultType": "task", "_meta": {immediate: "soon"}})
    assert kept["_meta"] == {immediate: "soon"}


def test_params_task_becomes_the_extension_and_its_ttl_goes() -> None:
    params = {
        "name": "deploy",
        "arguments": {"a": 1},
        "task": {"ttl": 5},
        "_meta": {"progressToken": 7},
    }
    capabilities = {"elicitation": {"form": {}}, "roots": {}, "tasks": {"list": {}}}
    modern, wants_task = modern_params(params, capabilities, {"name": "c", "version": "1"})
    assert wants_task and "task" not in modern and modern["arguments"] == {"a": 1}
    meta = modern["_meta"]
    assert meta["progressToken"] == 7
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientCapabilities"] == {
        "elicitation": {"form": {}},
        "extensions": {"io.modelcontextprotocol/tasks": {}},
    }
    assert meta["io.modelcontextprotocol/clientInfo"] == {"name": "c", "version": "1"}
    plain, asked = modern_params({"name": "x"}, {}, None)
    assert not asked and plain["_meta"]["io.modelcontextprotocol/clientCapabilities"] == {}


def test_outcomes_of_terminal_tasks() -> None:
    done = {**TASK, "status": "completed", "result": {"resultType": "complete", "content": []}}
    result, error = task_outcome(done)
    assert error is None and result == {
        "content": [],
        "_meta": {RELATED_TASK_KEY: {"taskId": "t-1"}},
    }
    failed = {**TASK, "status": "failed", "error": {"code": -32000, "message": "no"}}
    assert task_outcome(failed) == (None, {"code": -32000, "message": "no"})
    _, cancelled = task_outcome({**TASK, "status": "cancelled"})
    assert cancelled == {"code": -32603, "message": "Task t-1 was cancelled"}


def test_tools_say_they_may_run_as_tasks() -> None:
    listed = legacy_tools(
        {
            "resultType": "complete",
            "tools": [{"name": "a"}, {"name": "b", "execution": {"taskSupport": "forbidden"}}],
        }
    )
    assert "resultType" not in listed
    assert listed["tools"][0]["execution"] == {"taskSupport": "optional"}
    assert listed["tools"][1]["execution"] == {"taskSupport": "forbidden"}


def test_modern_meta_marks_a_modern_request() -> None:
    assert is_modern_request({"_meta": {"io.modelcontextprotocol/protocolVersion": "x"}})
    assert not is_modern_request({"_meta": {"progressToken": 1}})
    assert not is_modern_request(None)
