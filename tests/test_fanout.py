"""Fan-out registry and per-stream coalescing backlog."""

from __future__ import annotations

from hub.cache import TaskSnapshot
from hub.fanout import Fanout, Subscriber
from hub.metrics import Metrics


def snap(task_id: str, revision: int, status: str = "working") -> TaskSnapshot:
    return TaskSnapshot(task_id, "anonymous", "srv", revision, status, None, b"{}")


def test_backlog_keeps_only_the_latest_revision_per_task() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    sub = Subscriber(b'"s"', ["a", "b"])
    fanout.subscribe(sub)
    for revision in range(1, 1001):
        fanout.publish(snap("a", revision))
    fanout.publish(snap("b", 5))
    assert len(sub.backlog) == 2  # bounded by tasks followed, not by updates
    assert [s.revision for s in sub.take()] == [1000, 5]
    assert metrics.coalesced_frames.value() == 999
    assert sub.take() == []


def test_an_older_revision_never_replaces_a_newer_one() -> None:
    sub = Subscriber(b"1", ["a"])
    sub.offer(snap("a", 7))
    sub.offer(snap("a", 3))
    assert [s.revision for s in sub.take()] == [7]


def test_only_followers_receive_and_terminal_ends_following() -> None:
    fanout = Fanout(Metrics())
    a, b = Subscriber(b"1", ["t1"]), Subscriber(b"2", ["t2"])
    fanout.subscribe(a)
    fanout.subscribe(b)
    fanout.publish(snap("t1", 1))
    assert a.backlog and not b.backlog
    fanout.publish(snap("t1", 2, "completed"))
    assert fanout.followers("t1") == 0 and "t1" not in a.task_ids
    assert a.take()[-1].status == "completed"
    fanout.publish(snap("t1", 3))  # nobody follows any more
    assert not a.backlog


def test_narrow_unsubscribe_and_forget_release_everything() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    sub = Subscriber(b"1", ["keep", "drop"])
    fanout.subscribe(sub)
    fanout.publish(snap("drop", 1))
    fanout.narrow(sub, ["keep"])
    assert fanout.followers("drop") == 0 and "drop" not in sub.backlog
    assert metrics.open_streams.value() == 1
    fanout.forget("keep")
    assert fanout.followers("keep") == 0 and not sub.task_ids
    fanout.unsubscribe(sub)
    fanout.unsubscribe(sub)  # idempotent
    assert len(fanout) == 0 and metrics.open_streams.value() == 0


async def test_wait_wakes_on_offer_and_times_out_for_keepalive() -> None:
    sub = Subscriber(b"1", ["a"])
    assert await sub.wait(0.01) is False
    sub.offer(snap("a", 1))
    assert await sub.wait(5) is True


def test_close_all_marks_streams_for_a_graceful_end() -> None:
    fanout = Fanout(Metrics())
    subs = [Subscriber(str(i).encode(), ["x"]) for i in range(3)]
    for sub in subs:
        fanout.subscribe(sub)
    fanout.close_all()
    assert all(sub.closing and not sub.disconnected for sub in subs)
