"""The snapshot cache's reader rules (contract 3) as pure, exhaustive unit tests."""

from __future__ import annotations

import json
import sys
import tracemalloc

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.store.cache import RECENT_SNAPSHOTS, CachePart, TaskCache, pack
from hub.store.listener import Nobody
from hub.store.snapshot import Rejected, TaskSnapshot
from tests.helpers import envelope, new_task_id

STATUSES = ["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL = {"completed", "failed", "cancelled"}


class Recorder(Nobody):
    """A cache and what its listener heard: changes, removed ids, rejections."""

    def __init__(self, now: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self.now = now
        self.changes: list[TaskSnapshot] = []
        self.removed_ids: list[str] = []
        self.rejections: list[Rejected] = []
        self.cache = TaskCache(self, clock=lambda: self.now)

    def changed(self, snapshot: TaskSnapshot) -> None:
        self.changes.append(snapshot)

    def removed(self, snapshot: TaskSnapshot) -> None:
        self.removed_ids.append(snapshot.task_id)

    def rejected(self, reason: Rejected) -> None:
        self.rejections.append(reason)


def test_accepts_a_valid_value_and_encodes_the_task_once() -> None:
    r = Recorder()
    tid = new_task_id()
    snap = r.cache.apply_put(tid, 5, envelope(tid, statusMessage="hi", pollIntervalMs=500))
    assert snap is not None and r.changes == [snap]
    assert r.cache.get(tid) == snap
    assert json.loads(snap.body) == {
        "taskId": tid,
        "status": "working",
        "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:00Z",
        "ttlMs": None,
        "statusMessage": "hi",
        "pollIntervalMs": 500,
    }
    assert (snap.owner, snap.server, snap.revision) == ("anonymous", "srv-1", 5)


@pytest.mark.parametrize(
    "owner",
    ["anonymous", "ü" * 40_000],  # the second: 80,000 bytes, past the short head's lengths
)
@pytest.mark.parametrize("status", STATUSES)
def test_a_new_task_is_held_as_pack_packs_it(owner: str, status: str) -> None:
    # A new task is packed in apply_put's own words (its first-read path): it must be
    # held byte for byte as `pack` would hold it, and read back whole.
    r = Recorder()
    tid = new_task_id()
    value = envelope(
        tid,
        status,
        owner=owner,
        ttl_ms=60_000,
        created_at="2026-01-01T01:00:00+01:00",  # the recorder's now, in another zone
        lastUpdatedAt="2026-01-01T00:00:01Z",
        statusMessage="line\u2028separator",  # escaped by line_safe in the body
        pollIntervalMs=250,
    )
    snap = r.cache.apply_put(tid, 7, value)
    assert snap is not None and b"\\u2028" in snap.body
    assert r.cache.packed() == ([tid], [pack(snap)])
    assert r.cache.get(tid) == snap  # unpacked anew: a first read's tasks are not kept


def test_a_first_revision_without_a_time_zone_is_refused() -> None:
    # createdAt == lastUpdatedAt is parsed once: the zone is still required.
    r = Recorder()
    tid = new_task_id()
    assert r.cache.apply_put(tid, 1, envelope(tid, created_at="2026-01-01T00:00:00")) is None
    assert r.rejections == [Rejected.MALFORMED] and len(r.cache) == 0


def test_unknown_envelope_and_task_fields_are_ignored() -> None:
    r = Recorder()
    tid = new_task_id()
    raw = json.loads(envelope(tid))
    raw["future"] = {"x": 1}
    raw["task"]["somethingNew"] = True
    snap = r.cache.apply_put(tid, 1, json.dumps(raw).encode())
    assert snap is not None and b"somethingNew" not in snap.body


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"owner":"a","server":"s"}',
        b'{"owner":"","server":"s","task":{}}',
    ],
    ids=["empty", "garbage", "array", "no-task", "empty-owner"],
)
def test_malformed_values_are_rejected_and_counted(data: bytes) -> None:
    r = Recorder()
    assert r.cache.apply_put(new_task_id(), 1, data) is None
    assert r.rejections == [Rejected.MALFORMED] and r.changes == []


@pytest.mark.parametrize(
    "fields",
    [
        {"status": "done"},
        {"ttlMs": -1},
        {"ttlMs": "60"},
        {"pollIntervalMs": -5},
        {"createdAt": "yesterday"},
        {"createdAt": "2026-01-01T00:00:00"},  # no time zone
        {"status": "completed", "result": None},
        {"status": "failed", "error": {"message": "no code"}},
        {"status": "input_required", "inputRequests": None},
        {"status": "working", "result": {"content": []}},  # variant field of another status
    ],
)
def test_invalid_tasks_are_rejected(fields: dict[str, object]) -> None:
    r = Recorder()
    tid = new_task_id()
    raw = json.loads(envelope(tid))
    raw["task"].update(fields)
    raw["task"] = {k: v for k, v in raw["task"].items() if v is not None}
    assert r.cache.apply_put(tid, 1, json.dumps(raw).encode()) is None
    assert r.rejections == [Rejected.MALFORMED]


def test_bad_task_id_and_server_are_rejected() -> None:
    r = Recorder()
    assert r.cache.apply_put("short", 1, envelope("short")) is None
    tid = new_task_id()
    assert r.cache.apply_put(tid, 1, envelope(tid, server="no spaces allowed")) is None
    assert r.rejections == [Rejected.MALFORMED, Rejected.MALFORMED]


def test_key_mismatch_is_rejected() -> None:
    r = Recorder()
    assert r.cache.apply_put(new_task_id(), 1, envelope(new_task_id())) is None
    assert r.rejections == [Rejected.KEY_MISMATCH]


def test_older_revisions_are_stale_and_duplicates_silent() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 10, envelope(tid, statusMessage="new"))
    assert r.cache.apply_put(tid, 9, envelope(tid, statusMessage="old")) is None
    assert r.cache.apply_put(tid, 10, envelope(tid, statusMessage="new")) is None
    assert r.rejections == [Rejected.STALE]
    current = r.cache.get(tid)
    assert current is not None and b'"new"' in current.body and len(r.changes) == 1


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
@pytest.mark.parametrize("later", STATUSES)
def test_terminal_states_never_change(terminal: str, later: str) -> None:
    r = Recorder()
    tid = new_task_id()
    first = r.cache.apply_put(tid, 1, envelope(tid, terminal))
    assert first is not None
    assert r.cache.apply_put(tid, 2, envelope(tid, later, statusMessage="changed")) is None
    assert r.rejections == [Rejected.TERMINAL_CHANGE]
    assert r.cache.get(tid) == first and r.changes == [first]


def test_terminal_rewritten_unchanged_is_not_reported() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, "completed"))
    assert r.cache.apply_put(tid, 2, envelope(tid, "completed")) is None
    assert r.rejections == [] and len(r.changes) == 1


@pytest.mark.parametrize("a", ["working", "input_required"])
@pytest.mark.parametrize("b", STATUSES)
def test_every_transition_from_a_live_state_is_accepted(a: str, b: str) -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, a))
    snap = r.cache.apply_put(tid, 2, envelope(tid, b))
    assert snap is not None and snap.status == b and snap.terminal == (b in TERMINAL)


def test_owner_change_is_rejected() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, owner="alice"))
    assert r.cache.apply_put(tid, 2, envelope(tid, owner="mallory")) is None
    assert r.rejections == [Rejected.OWNER_CHANGE]


def test_delete_removes_and_blocks_older_values() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 3, envelope(tid))
    assert r.cache.apply_delete(tid, 4)
    assert r.cache.get(tid) is None and r.removed_ids == [tid]
    # A slow read-through of the value before the delete must not resurrect it.
    assert r.cache.apply_put(tid, 3, envelope(tid)) is None
    # A later re-creation is a new task.
    assert r.cache.apply_put(tid, 5, envelope(tid)) is not None


def test_stale_delete_is_ignored() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 7, envelope(tid))
    assert not r.cache.apply_delete(tid, 6)
    assert r.cache.get(tid) is not None


def test_expired_tasks_are_not_served_and_are_swept() -> None:
    r = Recorder()
    tid, forever = new_task_id(), new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, ttl_ms=60_000))
    r.cache.apply_put(forever, 2, envelope(forever))
    assert r.cache.get(tid) is not None
    r.now += 59.9
    assert r.cache.get(tid) is not None and r.cache.sweep() == 0
    r.now += 0.2
    assert r.cache.get(tid) is None  # not served even before the sweep
    assert r.cache.sweep() == 1 and r.removed_ids == [tid]
    assert len(r.cache) == 1 and r.cache.get(forever) is not None


def test_sweep_honours_a_ttl_extended_by_a_later_revision() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, ttl_ms=1_000))
    r.cache.apply_put(tid, 2, envelope(tid, ttl_ms=120_000))
    r.now += 2
    assert r.cache.sweep() == 0 and r.cache.get(tid) is not None


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        [
                            "owner",
                            "server",
                            "task",
                            "status",
                            "taskId",
                            "ttlMs",
                            "createdAt",
                            "lastUpdatedAt",
                            "result",
                            "error",
                            "x",
                        ]
                    ),
                    inner,
                    max_size=6,
                )
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_fuzzed_values_never_crash_nor_change_a_terminal_task(data: bytes) -> None:
    r = Recorder()
    tid = new_task_id()
    done = r.cache.apply_put(tid, 1, envelope(tid, "completed"))
    r.cache.apply_put(tid, 2, data)
    assert r.cache.get(tid) == done
    other = new_task_id()
    r.cache.apply_put(other, 3, data)  # whatever it is, it is handled


def test_a_task_updated_many_times_costs_one_expiry_entry() -> None:
    """The expiry index grows with tasks, not with revisions (a busy task once held one
    heap entry per revision until it expired)."""
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, ttl_ms=3_600_000, statusMessage="step 0"))
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for revision in range(2, 5002):
        r.cache.apply_put(tid, revision, envelope(tid, ttl_ms=3_600_000, statusMessage="step 1"))
    r.changes.clear()
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after - before < 20_000  # the old per-revision entries took ~116 B each
    r.now += 3_601
    assert r.cache.sweep() == 1 and r.removed_ids == [tid]


def test_a_cached_task_costs_well_under_twice_its_json() -> None:
    """One bytes object per task beside its id (docs/scaling.md): a task's JSON and about
    160 bytes; eight objects per task cost about 2.7 times the JSON. The task is the
    bench's (`python -m bench --scenario cold_start`): about 230 bytes of JSON."""
    r = Recorder()
    ids = [new_task_id() for _ in range(5000)]
    values = [
        envelope(
            tid,
            owner="bench",
            server="srv-7",
            created_at="2026-12-02T01:00:00.000000Z",
            ttl_ms=3_600_000,
            pollIntervalMs=5000,
            statusMessage="2026-12-02T01:00:00.000000Z",
        )
        for tid in ids
    ]
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for revision, (tid, value) in enumerate(zip(ids, values, strict=True), start=1):
        r.cache.apply_put(tid, 1_000_000 + revision, value)
    r.changes.clear()
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    json_bytes = len(r.cache.get(ids[0]).body)  # type: ignore[union-attr]
    ids_bytes = sum(map(sys.getsizeof, ids))  # allocated before: the key the cache holds
    per_task = (after - before + ids_bytes) / len(ids)
    assert per_task < 1.7 * json_bytes, (per_task, json_bytes)  # ~1.57×; eight objects: 2.6×
    a, b = r.cache.get(ids[0]), r.cache.get(ids[1])
    assert a is not None and b is not None
    assert (
        (a.owner, a.server, a.poll_interval_ms)
        == ("bench", "srv-7", 5000)
        == (
            b.owner,
            b.server,
            b.poll_interval_ms,
        )
    )


def test_a_read_snapshot_is_let_go_when_its_task_changes_or_goes() -> None:
    r = Recorder()
    tid = new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, statusMessage="one"))
    first = r.cache.get(tid)
    assert first is not None and r.cache.get(tid) is first  # unpacked once, then kept
    r.cache.apply_put(tid, 2, envelope(tid, statusMessage="two"))
    second = r.cache.get(tid)
    assert second is not None and second.revision == 2 and b'"two"' in second.body
    r.cache.apply_delete(tid, 3)
    assert r.cache.get(tid) is None
    # More tasks read than are kept: every read still answers its own task.
    ids = [new_task_id() for _ in range(RECENT_SNAPSHOTS + 10)]
    for revision, other in enumerate(ids, start=10):
        r.cache.apply_put(other, revision, envelope(other))
    assert all(r.cache.get(other).task_id == other for other in ids)  # type: ignore[union-attr]


def test_a_new_revision_of_a_held_task_is_kept_for_the_next_one_and_its_readers() -> None:
    """A task that changes once changes again: the revision the cache accepted is the one
    the next revision is checked against and readers get, with no unpacking (a first
    read's tasks, never held before, are not kept)."""
    r = Recorder()
    tid, fresh = new_task_id(), new_task_id()
    r.cache.apply_put(tid, 1, envelope(tid, statusMessage="one"))
    r.cache.apply_put(fresh, 2, envelope(fresh))
    second = r.cache.apply_put(tid, 3, envelope(tid, statusMessage="two"))
    assert second is not None and r.cache.get(tid) is second
    assert r.cache.get(fresh) is not r.changes[1]  # unpacked from the cache's own bytes
    assert r.cache.apply_put(tid, 3, envelope(tid, statusMessage="two")) is None  # same again
    r.cache.apply_put(tid, 4, envelope(tid, "completed"))
    assert r.cache.get(tid).status == "completed"  # type: ignore[union-attr]
    assert r.cache.apply_put(tid, 5, envelope(tid, "working")) is None
    assert r.rejections == [Rejected.TERMINAL_CHANGE]
    r.cache.apply_delete(tid, 6)
    assert r.cache.get(tid) is None


def test_a_scan_of_every_task_keeps_its_snapshots_for_the_next() -> None:
    """An operator stream's first states: the next stream's scan unpacks nothing that
    has not changed since (100 dashboards on 10,000 tasks: 6.1 s to all synced, 2.7 s)."""
    r = Recorder()
    ids = [new_task_id() for _ in range(50)]
    for revision, tid in enumerate(ids, start=1):
        r.cache.apply_put(tid, revision, envelope(tid))
    first = r.cache.live()
    again = r.cache.live()
    assert [s.task_id for s in first] == ids
    assert all(a is b for a, b in zip(first, again, strict=True))
    r.cache.apply_put(ids[0], 100, envelope(ids[0], statusMessage="changed"))
    third = r.cache.live()
    assert third[0].revision == 100 and third[1] is first[1]


def _part_of(r: Recorder) -> bytes:
    """What a worker process writes of its cache: `part()`, as MessagePack."""
    return msgspec.msgpack.encode(r.cache.part())


def test_a_part_read_elsewhere_comes_over_whole_and_silently() -> None:
    """A first read's later half (hub/store/first_read/worker.py): tasks, expiry, server counts,
    tombstones and refusals come over; listeners hear of none of the bulk."""
    here, there = Recorder(), Recorder()
    mine, theirs = [new_task_id() for _ in range(3)], [new_task_id() for _ in range(4)]
    for seq, tid in enumerate(mine, 1):
        here.cache.apply_put(tid, seq, envelope(tid, server="srv-a"))
    expiring, done, gone = theirs[0], theirs[1], theirs[3]
    there.cache.apply_put(expiring, 10, envelope(expiring, server="srv-a", ttl_ms=60_000))
    there.cache.apply_put(done, 11, envelope(done, "completed", server="srv-b"))
    there.cache.apply_put(theirs[2], 12, envelope(theirs[2], server="srv-b"))
    there.cache.apply_put(gone, 13, envelope(gone))
    there.cache.apply_delete(gone, 14)
    there.cache.apply_put(theirs[2], 15, b"{not json")
    here.changes.clear()

    part = msgspec.msgpack.decode(_part_of(there), type=CachePart)
    assert here.cache.merge(part) == 3
    assert here.changes == [] and here.removed_ids == []
    assert here.rejections == [Rejected.MALFORMED]
    assert len(here.cache) == 6
    assert here.cache.get(done).status == "completed"  # type: ignore[union-attr]
    assert here.cache.server_counts() == {"srv-a": (4, 4), "srv-b": (2, 1)}
    assert here.cache.apply_put(gone, 13, envelope(gone)) is None  # its tombstone came too
    assert here.rejections[-1] is Rejected.STALE
    here.now += 61
    assert here.cache.sweep() == 1 and here.removed_ids == [expiring]
    assert here.cache.server_counts() == {"srv-a": (3, 3), "srv-b": (2, 1)}


def test_a_task_held_on_both_sides_is_merged_by_the_reader_rules() -> None:
    """Read through while the worker read it: the later revision wins, and is heard of."""
    here, there = Recorder(), Recorder()
    newer_there, newer_here, removed_there = new_task_id(), new_task_id(), new_task_id()
    here.cache.apply_put(newer_there, 1, envelope(newer_there))
    there.cache.apply_put(newer_there, 5, envelope(newer_there, "completed"))
    here.cache.apply_put(newer_here, 7, envelope(newer_here, "failed", server="srv-b"))
    there.cache.apply_put(newer_here, 6, envelope(newer_here, server="srv-b"))
    here.cache.apply_put(removed_there, 2, envelope(removed_there))
    there.cache.apply_delete(removed_there, 8)
    here.changes.clear()

    assert here.cache.merge(there.cache.part()) == 0
    assert [(s.task_id, s.revision) for s in here.changes] == [(newer_there, 5)]
    assert here.removed_ids == [removed_there]
    assert here.rejections == [Rejected.STALE]  # newer_here's revision 6, after 7
    assert here.cache.get(newer_here).revision == 7  # type: ignore[union-attr]
    assert here.cache.server_counts() == {"srv-1": (1, 0), "srv-b": (1, 0)}
