"""hub/operators/tail_view.py: the shared view rules, the view's folding of events, and its
drawings."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from rich.console import Console

from hub.operators import tail_view
from hub.operators.tail_view import (
    Entry,
    Fleet,
    FleetServer,
    Hello,
    SilenceChanged,
    TaskChanged,
    TaskRemoved,
    View,
    decode_entry,
    is_expiring,
    is_stuck,
    progress,
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
T0_MS = T0.timestamp() * 1000


def iso(offset_ms: float) -> str:
    return datetime.fromtimestamp((T0_MS + offset_ms) / 1000, UTC).isoformat()


def at(offset_ms: float) -> float:
    return T0_MS + offset_ms


def entry(
    task_id: str = "task-0000000000000001",
    status: str = "working",
    *,
    created: float = 0,
    updated: float = 0,
    owner: str = "alice",
    server: str = "srv-1",
    **fields: Any,
) -> Entry:
    task = {
        "taskId": task_id,
        "status": status,
        "createdAt": iso(created),
        "lastUpdatedAt": iso(updated),
        "ttlMs": None,
        **fields,
    }
    return decode_entry(json.dumps({"owner": owner, "server": server, "task": task}))


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("40%", 0.4),
        ("copying 12.5 % done", 0.125),
        ("3/10", 0.3),
        ("step 3 of 10", 0.3),
        ("step 3 of 10: 40%", 0.3),  # the first match counts
        ("40% of 3/10", 0.4),
        ("150%", 1.0),
        ("12/8 files", 1.0),
        ("3/0", None),
        ("no numbers here", None),
        ("offset 10", None),
        ("", None),
        (None, None),
    ],
)
def test_progress_reads_a_percentage_or_a_fraction(message: str | None, expected: float) -> None:
    assert progress(message) == expected


def test_stuck_after_ten_poll_intervals_and_at_least_thirty_seconds() -> None:
    default = entry()  # no pollIntervalMs: 1 s, so 30 s is the bound
    assert not is_stuck(default, at(29_999))
    assert is_stuck(default, at(30_000))
    slow = entry(pollIntervalMs=5_000)
    assert not is_stuck(slow, at(49_999))
    assert is_stuck(slow, at(50_000))
    fast = entry(updated=10_000, pollIntervalMs=100)
    assert not is_stuck(fast, at(39_999)) and is_stuck(fast, at(40_000))
    assert not is_stuck(entry(status="completed", result={}), at(10**9))


def test_expiring_when_less_than_a_minute_is_left() -> None:
    task = entry(created=0, ttlMs=90_000)
    assert not is_expiring(task, at(30_000))  # exactly 60 s left
    assert is_expiring(task, at(30_001))
    assert is_expiring(task, at(100_000))  # past it, not yet swept
    assert not is_expiring(entry(ttlMs=None), at(10**12))
    assert not is_expiring(entry(status="failed", ttlMs=1_000), at(500))


def test_the_view_gathers_the_state_and_replaces_itself_at_synced() -> None:
    view = View()
    view.connect(Hello(principal="alice", at=int(T0_MS)), T0_MS - 5_000)
    assert view.clock_offset_ms == 5_000
    a, b = entry("task-a" * 4), entry("task-b" * 4)
    assert view.task(a) == [] and view.task(b) == []
    assert view.tasks == {}  # nothing shown before the state is whole
    assert view.sync() == [TaskChanged(a), TaskChanged(b)]
    assert view.synced and set(view.tasks) == {a.task_id, b.task_id}

    # A reconnect: b went away meanwhile, a is unchanged, c is new.
    view.disconnect("connection reset")
    assert not view.connected and view.problem == "connection reset"
    view.connect(Hello(principal="alice"), T0_MS)
    c = entry("task-c" * 4)
    view.task(a)
    view.task(c)
    assert set(view.tasks) == {a.task_id, b.task_id}  # the old view stays up meanwhile
    assert view.sync() == [TaskRemoved(b.task_id), TaskChanged(c)]
    assert set(view.tasks) == {a.task_id, c.task_id}


def test_changes_after_synced_apply_at_once_and_repeats_are_dropped() -> None:
    view = View()
    view.connect(Hello(), T0_MS)
    view.sync()
    first = entry(statusMessage="1/3")
    assert view.task(first) == [TaskChanged(first)]
    assert view.task(entry(statusMessage="1/3")) == []  # the same state again
    later = entry(updated=1_000, statusMessage="2/3")
    assert view.task(later) == [TaskChanged(later)]
    assert view.removed(later.task_id) == [TaskRemoved(later.task_id)]
    assert view.removed(later.task_id) == []


def test_task_ids_restrict_the_view() -> None:
    view = View(only=frozenset({"task-a" * 4}))
    view.connect(Hello(), T0_MS)
    view.task(entry("task-a" * 4))
    view.task(entry("task-b" * 4))
    view.sync()
    assert set(view.tasks) == {"task-a" * 4}
    assert view.task(entry("task-b" * 4, updated=5)) == []


def test_done_when_every_task_is_terminal() -> None:
    view = View()
    assert not view.done()  # not synced yet
    view.connect(Hello(), T0_MS)
    view.task(entry("task-a" * 4))
    view.sync()
    assert not view.done()
    view.task(entry("task-a" * 4, "completed", updated=1, result={}))
    assert view.done()
    empty = View()
    empty.connect(Hello(), T0_MS)
    empty.sync()
    assert empty.done()  # nothing to wait for


def test_done_with_task_ids_once_each_was_seen_terminal() -> None:
    a, b = "task-a" * 4, "task-b" * 4
    view = View(only=frozenset({a, b}))
    view.connect(Hello(), T0_MS)
    view.task(entry(a, "failed", error={"code": -1, "message": "x"}))
    view.sync()
    assert not view.done()  # b never seen: still awaited
    view.removed(a)  # seen terminal, then expired: still counts
    view.task(entry(b))
    assert not view.done()
    view.task(entry(b, "cancelled", updated=1))
    assert view.done()


def test_silent_servers_come_and_go_with_fleet_events() -> None:
    view = View()
    quiet = FleetServer("srv-2", silent=True, reason="2 control messages waiting for 10 s")
    fleet = Fleet(at=int(T0_MS), servers=[FleetServer("srv-1"), quiet])
    assert view.fleet_update(fleet, T0_MS) == [SilenceChanged("srv-2", True, quiet.reason)]
    assert view.fleet_update(fleet, T0_MS) == []
    assert view.fleet_update(Fleet(servers=[]), T0_MS) == [SilenceChanged("srv-2", False, None)]


def test_json_lines_carry_the_task_as_the_hub_sent_it() -> None:
    task = entry(statusMessage="50%", pollIntervalMs=500, inputRequests={"q": {"method": "x"}})
    line = json.loads(tail_view.json_line(TaskChanged(task)))
    assert line["event"] == "task" and line["owner"] == "alice" and line["server"] == "srv-1"
    assert line["task"] == msgspec.json.decode(task.raw)
    assert line["task"]["inputRequests"] == {"q": {"method": "x"}}
    assert json.loads(tail_view.json_line(TaskRemoved("t1"))) == {
        "event": "removed",
        "taskId": "t1",
    }


def test_plain_lines_say_status_id_server_progress_and_markers() -> None:
    task = entry(statusMessage="step 3 of 4", ttlMs=60_000)
    line = tail_view.plain_line(TaskChanged(task), at(40_000))
    assert line == f"working {task.task_id} server=srv-1 [75%] 'step 3 of 4' stuck expiring"
    with_owner = tail_view.plain_line(TaskChanged(task), 0, owner=True)
    assert "owner=alice" in with_owner
    assert tail_view.plain_line(TaskRemoved("t1"), 0) == "removed t1"
    assert "silent" in tail_view.plain_line(SilenceChanged("srv-2", True, "quiet"), 0)
    assert "recovered" in tail_view.plain_line(SilenceChanged("srv-2", False, None), 0)


def text_of(view: View, now_ms: float, **options: Any) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(tail_view.render(view, now_ms, **options))
    return console.export_text()


def test_render_shows_counts_rows_markers_and_the_owner_to_operators() -> None:
    view = View()
    view.connect(Hello(principal="ops", operator=True), T0_MS)
    view.task(entry("task-a" * 4, statusMessage="40%", owner="bob"))
    view.task(entry("task-b" * 4, "completed", result={}, statusMessage="done"))
    view.sync()
    view.fleet_update(Fleet(servers=[FleetServer("srv-9", silent=True, reason="quiet")]), 0)
    text = text_of(view, T0_MS + 31_000)
    assert "2 tasks" in text and "working 1" in text and "completed 1" in text
    assert "owner" in text and "bob" in text
    assert "40%" in text and "stuck" in text and "31s" in text
    assert "silent server srv-9: quiet" in text
    assert text.index("task-a") < text.index("task-b")  # live tasks first


def test_render_hides_the_owner_from_others_and_says_when_disconnected() -> None:
    view = View()
    view.connect(Hello(principal="alice"), T0_MS)
    view.task(entry())
    view.sync()
    view.disconnect("connection refused")
    text = text_of(view, T0_MS)
    assert "disconnected — reconnecting (connection refused)" in text
    assert "owner" not in text
    assert "connecting" in text_of(View(), T0_MS)


def test_render_keeps_to_max_rows() -> None:
    view = View()
    view.connect(Hello(), T0_MS)
    for n in range(12):
        view.task(entry(f"task-{n:02d}" * 3, updated=n))
    view.sync()
    assert "… 7 more" in text_of(view, T0_MS, max_rows=5)


def test_durations_are_short() -> None:
    assert [tail_view.duration(ms) for ms in (-5, 999, 59_000, 184_000, 7_500_000)] == [
        "0s",
        "0s",
        "59s",
        "3m04s",
        "2h05m",
    ]
