"""The operator stream's pieces without a network: its filter and query parsing, the
viewer's coalescing and removals (hub/push/viewer.py), and the fleet view's silent rule
(hub/store/fleet_view.py) on a real cache with a clock of the test's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.datastructures import QueryParams

from hub.metrics import Metrics
from hub.operators.stream import QueryError, parse_filter
from hub.push.fanout import Fanout
from hub.push.viewer import TaskEvents, TaskFilter, Viewer
from hub.store.cache import TaskCache
from hub.store.fleet_view import CONTROL_WAIT_S, FleetView
from hub.store.snapshot import TaskSnapshot
from tests.helpers import envelope, new_task_id


def snap(task_id: str, revision: int, status: str = "working", **fields: Any) -> TaskSnapshot:
    owner, server = fields.get("owner", "alice"), fields.get("server", "srv-1")
    body = json.dumps({"taskId": task_id, "status": status, "r": revision}).encode()
    return TaskSnapshot(task_id, owner, server, revision, status, None, body)


def frames(viewer: Viewer) -> list[tuple[str, Any]]:
    data, _ = viewer.take_frames()
    events = []
    for block in data.decode().split("\n\n")[:-1]:
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_query_parameters_repeat_or_list_and_are_checked() -> None:
    parsed = parse_filter(QueryParams("server=a,b&server=c&status=working"))
    assert parsed == TaskFilter(frozenset("abc"), frozenset({"working"}), None)
    assert parse_filter(QueryParams("")) == TaskFilter()
    for bad in ["status=done", "owner=", "owner=a,,b", "tasks=1"]:
        with pytest.raises(QueryError):
            parse_filter(QueryParams(bad))


async def test_a_slow_viewer_holds_one_state_per_task() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    viewer = Viewer(TaskFilter(), True, TaskEvents())
    fanout.subscribe_viewer(viewer)
    for revision in range(1, 501):
        fanout.publish(snap("a", revision))
    fanout.publish(snap("b", 1, owner="bob"))
    assert len(viewer.backlog) == 2  # bounded by tasks, not by the change rate
    assert metrics.coalesced_frames.value() == 499
    events = frames(viewer)
    assert [(name, data["task"]["r"], data["owner"]) for name, data in events] == [
        ("task", 500, "alice"),
        ("task", 1, "bob"),
    ]
    fanout.unsubscribe(viewer)
    assert fanout.viewers == 0 and len(fanout) == 0
    await asyncio.sleep(0)  # the scheduled flush finds nothing to do


def test_a_removal_replaces_an_unsent_state_and_a_new_state_an_unsent_removal() -> None:
    viewer = Viewer(TaskFilter(statuses=frozenset({"working"})), True, TaskEvents())
    viewer.initial([snap("a", 1)])
    assert viewer.offer_task(snap("a", 2, "input_required"))  # leaves the filter
    assert frames(viewer) == [("removed", {"taskId": "a"})]
    assert viewer.offer_task(snap("a", 3)) and viewer.offer_task(snap("a", 4, "completed"))
    assert frames(viewer) == [("removed", {"taskId": "a"})]  # the state went unsent
    assert not viewer.offer_task(snap("a", 5, "completed"))  # no longer shown: nothing
    assert viewer.offer_task(snap("b", 1)) and viewer.offer_removal(snap("b", 1))
    assert viewer.offer_task(snap("b", 2))  # re-entered before anything was written
    assert [name for name, _ in frames(viewer)] == ["task"]


def test_an_unfiltered_viewer_hears_every_removal_and_a_filtered_one_its_own() -> None:
    everything = Viewer(TaskFilter(), True, TaskEvents())
    alices = Viewer(TaskFilter(owners=frozenset({"alice"})), False, TaskEvents())
    alices.initial([snap("a", 1), snap("b", 1, owner="bob")])
    for viewer in (everything, alices):
        viewer.offer_removal(snap("a", 1))
        viewer.offer_removal(snap("b", 1, owner="bob"))
    assert [data["taskId"] for _, data in frames(everything)] == ["a", "b"]
    assert [data["taskId"] for _, data in frames(alices)] == ["a"]


def test_a_server_is_silent_without_writes_or_with_control_waiting() -> None:
    now = [1000.0]
    cache = TaskCache(clock=lambda: now[0])
    view = FleetView(cache, silent_after=60, clock=lambda: now[0])
    view.start_counting()
    quiet, busy = new_task_id(), new_task_id()
    cache.apply_put(quiet, 1, envelope(quiet, server="quiet"))
    done = cache.apply_put(busy, 2, envelope(busy, "completed", server="done"))
    assert done is not None
    view.wrote(done)
    now[0] += 61
    entries = {entry["server"]: entry for entry in view.servers()}
    assert entries["quiet"]["silent"] and "no write for 61 s" in entries["quiet"]["reason"]
    assert entries["quiet"]["lastWriteAt"] is None and entries["quiet"]["active"] == 1
    assert not entries["done"]["silent"]  # nothing active: nothing to write
    assert entries["done"]["lastWriteAt"] == 1_000_000 and entries["done"]["tasks"] == 1
    assert entries["done"]["controlWaiting"] is None  # NATS has not been asked

    view._waiting = {"done": (2, now[0])}  # as refresh_control leaves it
    view._control_known = True
    now[0] += CONTROL_WAIT_S + 1
    entry = {entry["server"]: entry for entry in view.servers()}["done"]
    assert entry["silent"] and entry["reason"] == "2 control messages waiting for 11 s"
    assert entry["controlWaiting"] == 2


def test_a_revision_is_framed_once_for_every_viewer_and_the_memo_is_bounded() -> None:
    frames = TaskEvents(limit=2)
    first, second = Viewer(TaskFilter(), True, frames), Viewer(TaskFilter(), False, frames)
    state = snap("a", 1)
    for viewer in (first, second):
        viewer.offer_task(state)
    one, _ = first.take_frames()
    other, _ = second.take_frames()
    assert one == other and frames.frame(state) is frames.frame(state)
    assert frames.frame(snap("a", 2)) != one and len(frames) == 1  # a revision replaces
    frames.frame(snap("b", 1))
    frames.frame(snap("c", 1))
    assert len(frames) == 2  # "a", the oldest, went
    frames.forget("c")
    assert len(frames) == 1
