"""`GET /tasks/{taskId}` (issue 14, item 3): the snapshot over plain HTTP, cacheable.

On the module's authenticated hub: the owner gets the DetailedTask `tasks/get` answers, with
the revision as `ETag` and `pollIntervalMs` as `max-age`; `If-None-Match` with that tag is
a 304; an unknown task and another principal's are the same 404; no credentials is a 401.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_security_auth import Secured, bearer
from tests.e2e.test_security_auth import secured as secured  # the module's hub, a fixture
from tests.helpers import eventually, new_task_id, rpc

pytestmark = pytest.mark.timeout(60)


async def read(secured: Secured, task_id: str, **headers: str) -> Any:
    harness = secured.harness
    return await harness.client.get(f"{harness.url}/tasks/{task_id}", headers=headers)


async def test_the_owner_reads_the_task_as_tasks_get_answers_it(secured: Secured) -> None:
    task_id = await secured.task("alice", statusMessage="step 1", pollIntervalMs=2500)
    await eventually(lambda: secured.harness.hub.cache.get(task_id) is not None)
    answer = await read(secured, task_id, **bearer("alice"))
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["cache-control"] == "private, max-age=2"
    revision = secured.harness.hub.cache.get(task_id).revision  # type: ignore[union-attr]
    assert answer.headers["etag"] == f'"{revision}"'
    polled = await secured.call(rpc("tasks/get", {"taskId": task_id}), **bearer("alice"))
    result = dict(polled.json()["result"])
    result.pop("resultType"), result.pop("_meta")
    assert json.loads(answer.content) == result

    again = await read(
        secured, task_id, **bearer("alice"), **{"If-None-Match": answer.headers["etag"]}
    )
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == answer.headers["etag"]
    await secured.put(task_id, statusMessage="step 2", owner="alice")

    async def changed() -> bool:
        newer = await read(
            secured, task_id, **bearer("alice"), **{"If-None-Match": answer.headers["etag"]}
        )
        return bool(
            newer.status_code == 200 and json.loads(newer.content)["statusMessage"] == "step 2"
        )

    await eventually(changed)


async def test_unknown_and_foreign_tasks_are_the_same_404(secured: Secured) -> None:
    theirs = await secured.task("bob")
    await eventually(lambda: secured.harness.hub.cache.get(theirs) is not None)
    foreign = await read(secured, theirs, **bearer("alice"))
    unknown = await read(secured, new_task_id(), **bearer("alice"))
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.content == unknown.content
    assert (
        json.loads(foreign.content)["error"]["message"] == "Failed to retrieve task: Task not found"
    )
    assert "etag" not in foreign.headers


async def test_no_credentials_is_a_401_and_a_foreign_origin_a_403(secured: Secured) -> None:
    task_id = await secured.task("alice")
    anonymous = await read(secured, task_id)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith(
        "Bearer"
    )
    evil = await read(secured, task_id, Origin="https://evil.example", **bearer("alice"))
    assert evil.status_code == 403
