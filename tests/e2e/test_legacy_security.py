"""The legacy door under authentication: sessions and tasks belong to one principal.

Exactly as on the modern side: no credentials is a 401 with its challenge; a session
answers only the principal that opened it (to anyone else it does not exist: 404); another
principal's task is an unknown task; `tasks/list` lists the caller's tasks only. Sessions
live in NATS, so a second hub over the same bucket serves them too; bad session input
harms nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub.legacy.sessions import SESSION_TTL_S, Session, sessions_bucket
from tests.e2e.test_security_auth import Secured, bearer
from tests.e2e.test_security_auth import secured as secured  # the module's hub, a fixture
from tests.helpers import new_task_id, start_hub

pytestmark = pytest.mark.timeout(60)

LEGACY = "2025-11-25"


async def post(
    secured: Secured, body: dict[str, Any], sub: str | None, session: str | None = None
) -> Any:
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": LEGACY}
    if sub is not None:
        headers.update(bearer(sub))
    if session is not None:
        headers["mcp-session-id"] = session
    harness = secured.harness
    return await harness.client.post(harness.url + "/legacy/mcp", json=body, headers=headers)


async def open_session(secured: Secured, sub: str) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": sub}},
    }
    answer = await post(secured, body, sub)
    assert answer.status_code == 200, answer.text
    return str(answer.headers["mcp-session-id"])


def call(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}


async def test_no_credentials_is_a_401_with_the_challenge(secured: Secured) -> None:
    answer = await post(secured, call("tasks/list"), None)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")


async def test_a_session_answers_only_its_principal(secured: Secured) -> None:
    session = await open_session(secured, "alice")
    assert (await post(secured, call("ping"), "alice", session)).status_code == 200
    stolen = await post(secured, call("tasks/list"), "bob", session)
    unknown = await post(secured, call("tasks/list"), "bob", "z" * 43)
    assert stolen.status_code == unknown.status_code == 404
    assert stolen.content == unknown.content  # nothing tells them apart
    assert stolen.json() == {
        "jsonrpc": "2.0",
        "error": {"code": -32001, "message": "Session not found"},
        "id": None,
    }


async def test_tasks_are_the_owners_only(secured: Secured) -> None:
    mine = await secured.task("alice", statusMessage="alice's")
    theirs = await secured.task("bob", statusMessage="bob's")
    session = await open_session(secured, "alice")
    got = (await post(secured, call("tasks/get", {"taskId": mine}), "alice", session)).json()
    assert got["result"]["statusMessage"] == "alice's"
    for task_id in (theirs, new_task_id()):
        answer = await post(secured, call("tasks/get", {"taskId": task_id}), "alice", session)
        assert answer.json()["error"] == {
            "code": -32602,
            "message": "MCP error -32602: Failed to retrieve task: Task not found",
        }
        refused = await post(secured, call("tasks/cancel", {"taskId": task_id}), "alice", session)
        assert refused.json()["error"]["code"] == -32602
    listed = (await post(secured, call("tasks/list"), "alice", session)).json()["result"]
    ids = {task["taskId"] for task in listed["tasks"]}
    assert mine in ids and theirs not in ids


async def test_a_session_works_on_another_hub_and_ends_everywhere(
    secured: Secured, tmp_path: Path
) -> None:
    session = await open_session(secured, "alice")
    harness = secured.harness
    config = harness.hub.config
    other = await start_hub(
        config.nats_url,
        secured.bucket,
        tmp_path / "other",
        jwt_secret=config.auth.jwt_secret,
        jwt_issuer=config.auth.jwt_issuer,
        jwt_audience=config.auth.jwt_audience,
    )
    try:
        await other.hub.source.wait_caught_up(10)
        headers = {"mcp-protocol-version": LEGACY, "mcp-session-id": session, **bearer("alice")}
        url = other.url + "/legacy/mcp"
        pinged = await other.client.post(url, json=call("ping"), headers=headers)
        assert pinged.status_code == 200, pinged.text
        ended = await other.client.delete(url, headers=headers)
        assert ended.status_code == 204
        assert (await post(secured, call("ping"), "alice", session)).status_code == 404
    finally:
        await other.stop()


async def test_an_expired_session_is_unknown(secured: Secured) -> None:
    session_id = "e" * 43
    old = Session(session_id, "alice", {}, None, time.time() - SESSION_TTL_S - 1)
    kv = await secured.js.key_value(sessions_bucket(secured.bucket))
    await kv.put(session_id, msgspec.json.encode(old))
    answer = await post(secured, call("ping"), "alice", session_id)
    assert answer.status_code == 404


async def test_bad_session_input_harms_nothing(secured: Secured) -> None:
    session = await open_session(secured, "alice")
    for bad in ("", "../../etc", "a" * 500, "*", "$KV.x.>"):
        answer = await post(secured, call("ping"), "alice", bad)
        assert answer.status_code in (400, 404), bad
    assert (await post(secured, call("ping"), "alice", session)).status_code == 200
