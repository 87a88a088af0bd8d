"""The record of tasks an upstream keeps (hub/front_door/kept_tasks.py): order, finality, bounds,
hashes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hub.front_door.kept_tasks import (
    AUTHORIZED_KEPT,
    CredentialHasher,
    ForeignTaskError,
    KeptTasks,
    task_from_result,
)
from hub.store.snapshot import TaskSnapshot

CREATED = "2026-12-06T10:00:00+00:00"
NOW = 1_796_551_200.0  # 2026-12-06T10:00:00Z


def result(status: str = "working", task_id: str = "task-1", **extra: Any) -> dict[str, Any]:
    return {
        "resultType": "complete",
        "taskId": task_id,
        "status": status,
        "createdAt": CREATED,
        "lastUpdatedAt": CREATED,
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
        **extra,
    }


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Seen:
    def __init__(self) -> None:
        self.changed: list[TaskSnapshot] = []
        self.removed: list[TaskSnapshot] = []


def kept_tasks(clock: Clock, seen: Seen, *, limit: int = 100, retention: float = 3600) -> KeptTasks:
    return KeptTasks(
        retention=retention,
        limit=limit,
        on_change=seen.changed.append,
        on_remove=seen.removed.append,
        clock=clock,
    )


def test_a_task_is_recorded_and_read_back_as_a_snapshot_with_its_interval() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen)
    task = task_from_result(result())
    kept = tasks.apply(7, tasks.record(task, "alpha", "anonymous", "c1"))
    assert kept is not None and tasks.get("task-1") is kept
    snapshot = kept.snapshot
    assert (snapshot.revision, snapshot.status, snapshot.poll_interval_ms) == (7, "working", 500)
    assert snapshot.server == "upstream:alpha"
    body = msgspec.json.decode(snapshot.body)
    assert body["taskId"] == "task-1" and "resultType" not in body
    assert seen.changed == [snapshot]
    assert kept.fresh(NOW + 0.4, 1.0) and not kept.fresh(NOW + 0.6, 1.0)


def test_older_observations_and_unchanged_states_publish_nothing() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen)
    working = tasks.record(task_from_result(result()), "alpha", "anonymous", "c1")
    tasks.apply(5, working)
    clock.now += 1
    tasks.apply(6, tasks.record(task_from_result(result()), "alpha", "anonymous", "c1"))
    later = tasks.record(task_from_result(result("cancelled")), "alpha", "anonymous", "c1")
    tasks.apply(9, later)
    tasks.apply(8, working)  # arrives late: ignored
    assert [s.status for s in seen.changed] == ["working", "cancelled"]
    kept = tasks.get("task-1")
    assert kept is not None and kept.snapshot.status == "cancelled"


def test_a_terminal_state_is_final() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen)
    done = result("completed", result={"content": []})
    tasks.apply(1, tasks.record(task_from_result(done), "alpha", "anonymous", "c1"))
    tasks.apply(2, tasks.record(task_from_result(result("working")), "alpha", "anonymous", "c2"))
    kept = tasks.get("task-1")
    assert kept is not None and kept.snapshot.status == "completed"
    assert kept.authorized == ["c1", "c2"]  # who may read it is refreshed all the same
    assert [s.status for s in seen.changed] == ["completed"]


def test_authorized_credentials_are_bounded_and_can_be_withdrawn() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen)
    for n in range(AUTHORIZED_KEPT + 5):
        tasks.apply(n + 1, tasks.record(task_from_result(result()), "alpha", "anonymous", f"c{n}"))
    kept = tasks.get("task-1")
    assert kept is not None and len(kept.authorized) == AUTHORIZED_KEPT
    assert kept.authorized[-1] == f"c{AUTHORIZED_KEPT + 4}" and "c0" not in kept.authorized
    tasks.forget_credential("task-1", f"c{AUTHORIZED_KEPT + 4}")
    assert f"c{AUTHORIZED_KEPT + 4}" not in kept.authorized


def test_another_owner_starts_with_only_its_own_credential() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen)
    tasks.apply(1, tasks.record(task_from_result(result()), "alpha", "alice", "a"))
    record = tasks.record(task_from_result(result()), "alpha", "bob", "b")
    assert record.authorized == ["b"]


def test_tasks_go_at_their_ttl_or_retention_and_past_the_limit() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen, limit=2, retention=30)
    tasks.apply(1, tasks.record(task_from_result(result(task_id="t-ttl")), "a", "x", "c"))
    no_ttl = result(task_id="t-none", ttlMs=None)
    tasks.apply(2, tasks.record(task_from_result(no_ttl), "a", "x", "c"))
    clock.now += 29
    assert "t-none" in tasks and "t-ttl" in tasks
    clock.now += 2  # past retention (30 s) for both: the TTL (60 s) would have kept t-ttl
    tasks.sweep()
    assert len(tasks) == 0 and {s.task_id for s in seen.removed} == {"t-ttl", "t-none"}
    for n in range(3):
        clock.now += 1
        task = task_from_result(result(task_id=f"t{n}", createdAt=_iso(clock.now)))
        tasks.apply(10 + n, tasks.record(task, "a", "x", "c"))
    assert "t0" not in tasks and "t1" in tasks and "t2" in tasks  # the oldest observed went


def test_stale_makes_the_next_ask_read_again_but_not_for_a_terminal_task() -> None:
    clock, seen = Clock(), Seen()
    tasks = kept_tasks(clock, seen)
    tasks.apply(1, tasks.record(task_from_result(result()), "a", "x", "c"))
    tasks.stale("task-1")
    kept = tasks.get("task-1")
    assert kept is not None and not kept.fresh(NOW, 1.0)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"taskId": "t", "status": "working"},  # no timestamps
        result("completed"),  # completed without a result
        result("working", result={"content": []}),  # working with one
        result("exploded"),
        result(task_id=""),
        result(createdAt="yesterday"),
        result(ttlMs=-1),
    ],
)
def test_an_upstream_state_that_breaks_the_wire_rules_is_refused(bad: Any) -> None:
    with pytest.raises(ForeignTaskError):
        task_from_result(bad)


def test_a_task_answered_for_another_id_is_refused() -> None:
    with pytest.raises(ForeignTaskError):
        task_from_result(result(task_id="other"), "task-1")


def test_foreign_ids_outside_our_syntax_are_accepted() -> None:
    assert task_from_result(result(task_id="short:1")).taskId == "short:1"


def test_credential_hashes_are_keyed_and_reveal_nothing() -> None:
    token = "Bearer s3cret-token"
    one, other = CredentialHasher(b"k" * 32), CredentialHasher(b"j" * 32)
    digest = one.of({"authorization": token})
    assert digest == one.of({"authorization": token, "user-agent": "x"})
    assert digest != other.of({"authorization": token})
    assert digest != one.of({"authorization": "Bearer other"})
    assert digest != one.of({"cookie": token})
    assert "s3cret" not in digest and len(digest) == 32


def _iso(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).isoformat()
