"""Fan-out registry, per-stream coalescing backlog, the per-turn flush and the tick.

Writes go to a `DirectChannel` stand-in that records chunks: these are the fan-out's
decisions (what, when, to whom), not I/O; the real socket path runs in tests/e2e.
"""

from __future__ import annotations

import asyncio
import json

from bridge import vocabulary
from hub.metrics import Metrics
from hub.push.fanout import Fanout
from hub.push.sse_frames import notification_prefix, task_frames
from hub.push.subscriber import EndReason, StreamState, Subscriber, flush_all
from hub.store.snapshot import TaskSnapshot


def take(sub: Subscriber) -> list[TaskSnapshot]:
    """Every task state queued for `sub`, oldest task first; the backlog is emptied."""
    batch = list(sub.backlog.values())
    sub.backlog.clear()
    return batch


def snap(task_id: str, revision: int, status: str = "working") -> TaskSnapshot:
    return TaskSnapshot(task_id, "anonymous", "srv", revision, status, None, b"{}")


async def test_backlog_keeps_only_the_latest_revision_per_task() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    sub = Subscriber(b'"s"', ["a", "b"])
    fanout.subscribe(sub)
    for revision in range(1, 1001):
        fanout.publish(snap("a", revision))
    fanout.publish(snap("b", 5))
    assert len(sub.backlog) == 2  # bounded by tasks followed, not by updates
    assert [s.revision for s in take(sub)] == [1000, 5]
    assert metrics.coalesced_frames.value() == 999
    assert take(sub) == []


def test_an_older_revision_never_replaces_a_newer_one() -> None:
    sub = Subscriber(b"1", ["a"])
    sub.offer(snap("a", 7))
    sub.offer(snap("a", 3))
    assert [s.revision for s in take(sub)] == [7]


async def test_only_followers_receive_and_terminal_ends_following() -> None:
    fanout = Fanout(Metrics())
    a, b = Subscriber(b"1", ["t1"]), Subscriber(b"2", ["t2"])
    fanout.subscribe(a)
    fanout.subscribe(b)
    fanout.publish(snap("t1", 1))
    assert a.backlog and not b.backlog
    fanout.publish(snap("t1", 2, "completed"))
    assert fanout.followers("t1") == 0 and "t1" not in a.task_ids
    assert take(a)[-1].status == "completed"
    fanout.publish(snap("t1", 3))  # nobody follows any more
    assert not a.backlog


async def test_narrow_unsubscribe_and_forget_release_everything() -> None:
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


def test_close_all_marks_streams_for_a_graceful_end() -> None:
    fanout = Fanout(Metrics())
    subs = [Subscriber(str(i).encode(), ["x"]) for i in range(3)]
    for sub in subs:
        fanout.subscribe(sub)
    fanout.close_all()
    assert all(
        sub.state is StreamState.ENDING and sub.end_reason is EndReason.SHUTDOWN for sub in subs
    )


def unchunk(data: bytes) -> list[bytes]:
    """The payloads of HTTP/1.1 chunks, each checked against its size line."""
    payloads = []
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        assert size and rest[size : size + 2] == b"\r\n", data
        payloads.append(rest[:size])
        data = rest[size + 2 :]
    return payloads


class Channel:
    """Records what the fan-out writes, one payload per chunk; `writable` is set by the test."""

    express = False

    def __init__(self) -> None:
        self.writable = True
        self.chunks: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert self.writable
        self.chunks.append(data)

    def write_chunks(self, data: bytes) -> None:
        assert self.writable
        self.chunks += unchunk(data)

    def abort(self) -> None:
        self.aborted = True


def live(
    fanout: Fanout, task_ids: list[str], subscription_id: bytes = b'"s"'
) -> tuple[Subscriber, Channel]:
    sub = Subscriber(subscription_id, task_ids)
    channel = Channel()
    sub.channel = channel  # type: ignore[assignment]
    sub.opened()
    fanout.subscribe(sub)
    return sub, channel


async def next_turn() -> None:
    await asyncio.sleep(0)


async def test_one_flush_per_turn_writes_each_stream_one_chunk() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    sub, channel = live(fanout, ["a", "b"])
    fanout.publish(snap("a", 1))
    fanout.publish(snap("b", 1))
    fanout.publish(snap("a", 2))
    assert channel.chunks == []  # not before the turn ends
    await next_turn()
    assert len(channel.chunks) == 1
    assert channel.chunks[0].count(b"data: ") == 2  # a@2 and b@1, a@1 coalesced away
    assert metrics.notifications_sent.value() == 2 and not sub.backlog


async def test_a_stream_owing_one_state_gets_the_chunk_the_general_path_would_write() -> None:
    """The flush's usual case is written out (`subscriber.flush_all`): whatever the stream's
    prefix and the revision's size, its chunk holds exactly `task_frames` of that state,
    beside streams that take the general path in the same flush."""
    metrics = Metrics()
    fanout = Fanout(metrics)
    short, short_channel = live(fanout, ["a"], b"7")
    long, long_channel = live(fanout, ["a"], b'"a-much-longer-subscription-id"')
    both, both_channel = live(fanout, ["a", "b"], b"8")  # owes two states: one chunk of both
    only_b, only_b_channel = live(fanout, ["b"], b"6")  # another revision in the same flush
    evented, evented_channel = live(fanout, ["a"], b"9")
    fanout.follow_events(evented, "alpha", "anonymous", ["tools"])
    revisions = [
        TaskSnapshot("a", "anonymous", "srv", 1, "working", None, b'{"taskId":"a"}'),
        TaskSnapshot(
            "a", "anonymous", "srv", 2, "working", None, b'{"taskId":"a","n":' + b"1" * 300 + b"}"
        ),
        TaskSnapshot("a", "anonymous", "srv", 3, "working", None, b'{"taskId":"a","n":2}'),
    ]
    b = TaskSnapshot("b", "anonymous", "srv", 1, "working", None, b'{"taskId":"b"}')
    for snapshot in revisions:
        fanout.publish(snapshot)
        if snapshot.revision == 2:
            fanout.publish(b)
            fanout.publish_event("alpha", "tools")
        await next_turn()
    for sub, channel in ((short, short_channel), (long, long_channel)):
        assert channel.chunks == [task_frames(sub.prefix, [s]) for s in revisions]
    assert both_channel.chunks[1] == task_frames(both.prefix, [revisions[1], b])
    assert only_b_channel.chunks == [task_frames(only_b.prefix, [b])]
    assert evented_channel.chunks[1].startswith(task_frames(evented.prefix, [revisions[1]]))
    assert b"list_changed" in evented_channel.chunks[1]
    assert metrics.notifications_sent.value() == 3 * 4 + 3
    assert not any(sub.backlog for sub in (short, long, both, only_b, evented))


def test_a_flush_of_two_revisions_frames_each_with_its_own_size() -> None:
    """Streams in flush order a, b, a, with prefixes of one length: each chunk's size line
    is that of its own revision, not the one before."""
    a = TaskSnapshot("a", "anonymous", "srv", 1, "working", None, b'{"taskId":"a"}')
    b = TaskSnapshot("b", "anonymous", "srv", 1, "working", None, b'{"taskId":"b","n":22}')
    streams = []
    for subscription_id, snapshot in ((b"1", a), (b"2", b), (b"3", a)):
        sub, channel = Subscriber(subscription_id, [snapshot.task_id]), Channel()
        sub.channel = channel  # type: ignore[assignment]
        sub.opened()
        sub.offer(snapshot)
        streams.append((sub, channel, snapshot))
    assert flush_all([sub for sub, _, _ in streams], now=5.0) == 3
    for sub, channel, snapshot in streams:
        assert channel.chunks == [task_frames(sub.prefix, [snapshot])]
        assert sub.last_write == 5.0


async def test_a_stream_that_cannot_take_a_write_wakes_its_writer_instead() -> None:
    fanout = Fanout(Metrics())
    sub, channel = live(fanout, ["a"])
    channel.writable = False
    parked = asyncio.create_task(sub.park())
    await next_turn()
    fanout.publish(snap("a", 1))
    await asyncio.wait_for(parked, 5)  # woken: the writer awaits `send` itself
    assert channel.chunks == [] and [s.revision for s in take(sub)] == [1]


async def test_nothing_is_written_before_the_ack_or_while_the_writer_sends() -> None:
    fanout = Fanout(Metrics())
    sub, channel = live(fanout, ["a"])
    sub.state = StreamState.OPENING  # the writer has not sent the ack yet
    fanout.publish(snap("a", 1))
    await next_turn()
    sub.opened()
    sub.blocking(0.0)  # the writer is inside `send`
    fanout.publish(snap("a", 2))
    await next_turn()
    assert channel.chunks == [] and [s.revision for s in take(sub)] == [2]


def test_tick_sends_keepalives_to_idle_streams_and_drops_stalled_ones() -> None:
    fanout = Fanout(Metrics())
    idle, idle_channel = live(fanout, ["a"])
    busy, busy_channel = live(fanout, ["b"])
    stuck, stuck_channel = live(fanout, ["c"])
    idle.last_write, busy.last_write = 0.0, 9.5
    stuck.blocking(0.0)
    fanout.tick(now=10.0, keepalive=5.0, send_timeout=30.0)
    assert idle_channel.chunks == [b":\n\n"] and idle.last_write == 10.0
    assert busy_channel.chunks == [] and not stuck_channel.aborted
    fanout.tick(now=31.0, keepalive=50.0, send_timeout=30.0)
    assert stuck.end_reason is EndReason.SEND_TIMEOUT and stuck_channel.aborted
    assert stuck.ended


def test_the_tick_drops_a_stalled_stream_written_to_within_the_keepalive() -> None:
    """A send timeout shorter than the keep-alive: the stream's last write is recent, yet
    its writer has been stuck past the timeout, so it is due all the same."""
    fanout = Fanout(Metrics())
    stuck, stuck_channel = live(fanout, ["a"])
    fresh, fresh_channel = live(fanout, ["b"])
    stuck.last_write = fresh.last_write = 9.0
    stuck.blocking(9.0)
    fanout.tick(now=11.0, keepalive=15.0, send_timeout=1.0)
    assert stuck.end_reason is EndReason.SEND_TIMEOUT and stuck_channel.aborted
    assert not fresh.ended and fresh_channel.chunks == []
    fanout.tick(now=24.0, keepalive=15.0, send_timeout=1.0)  # exactly `keepalive` idle
    assert fresh_channel.chunks == [b":\n\n"] and fresh.last_write == 24.0


async def test_a_keepalive_for_a_stream_that_cannot_take_it_goes_through_its_writer() -> None:
    fanout = Fanout(Metrics())
    sub, channel = live(fanout, ["a"])
    channel.writable = False
    parked = asyncio.create_task(sub.park())
    await next_turn()
    fanout.tick(now=100.0, keepalive=5.0, send_timeout=30.0)
    await asyncio.wait_for(parked, 5)
    assert sub.keepalive_due and channel.chunks == []


# -- fleet events (docs/fleet-events.md) ---------------------------------------------------


async def test_a_stalled_stream_keeps_only_the_latest_of_each_event() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    sub, channel = live(fanout, ["a"])
    fanout.follow_events(
        sub, "alpha", "anonymous", ["tools", "prompts"], ["file:///x", "file:///y"]
    )
    sub.blocking(0.0)  # the client stopped reading
    for _ in range(100):
        fanout.publish_event("alpha", "tools")
        fanout.publish_event("alpha", "resource", "file:///x")
    fanout.publish_event("alpha", "resource", "file:///y")
    fanout.publish(snap("a", 3))
    await next_turn()
    assert channel.chunks == [] and len(sub.events) == 3  # bounded by kinds and URIs followed
    assert metrics.coalesced_frames.value() == 198
    data, count = sub.take_frames()
    assert count == 4
    assert data.index(b"notifications/tasks") < data.index(b"list_changed")  # states first
    assert data.count(b"notifications/tools/list_changed") == 1
    assert data.count(b'"uri":"file:///x"') == 1 and data.count(b'"uri":"file:///y"') == 1
    assert b"prompts" not in data  # never published


async def test_events_follow_the_service_and_the_audience() -> None:
    fanout = Fanout(Metrics())
    alice, a_channel = live(fanout, [])
    bob, b_channel = live(fanout, [])
    fanout.follow_events(alice, "alpha", "alice", uris=["doc://1"])
    fanout.follow_events(bob, "alpha", "bob", ["tools"], ["doc://1"])
    assert fanout.publish_event("beta", "tools") == 0  # another service's endpoint
    assert fanout.publish_event("alpha", "resource", "doc://1", principals=["bob"]) == 1
    assert fanout.publish_event("alpha", "prompts") == 0
    await next_turn()
    assert a_channel.chunks == [] and len(b_channel.chunks) == 1


async def test_resend_tells_every_follower_once_and_unsubscribe_forgets_them() -> None:
    fanout = Fanout(Metrics())
    sub, channel = live(fanout, [])
    fanout.follow_events(sub, "alpha", "anonymous", ["tools", "resources"], ["doc://1"])
    fanout.resend_events()
    await next_turn()
    (chunk,) = channel.chunks
    assert chunk.count(b"data: ") == 3
    fanout.unsubscribe(sub)
    assert fanout.publish_event("alpha", "tools") == 0
    fanout.resend_events()  # nothing registered any more
    assert fanout._by_event == {} and fanout._events_of == {}


def test_task_states_are_framed_alike_one_at_a_time_or_together() -> None:
    one = TaskSnapshot("a", "anonymous", "srv", 1, "working", None, b'{"taskId":"a"}')
    two = TaskSnapshot("b", "anonymous", "srv", 2, "working", None, b'{"taskId":"b"}')
    prefix = notification_prefix(b'"s"')
    alone = task_frames(prefix, [one])
    assert alone == prefix + b'"taskId":"a"}}\n\n'
    message = json.loads(alone.removeprefix(b"data: "))
    assert message["params"] == {"_meta": {vocabulary.SUBSCRIPTION_ID_KEY: "s"}, "taskId": "a"}
    assert task_frames(prefix, [one, two]) == alone + task_frames(prefix, [two])


async def test_changes_published_while_held_are_written_at_release_not_a_turn_later() -> None:
    """The watch holds the flush while it applies one read's changes: they go out as the
    last is applied, coalesced as in a turn, and nothing is scheduled for a turn of its own."""
    metrics = Metrics()
    fanout = Fanout(metrics)
    _, channel = live(fanout, ["a", "b"])
    fanout.hold()
    fanout.publish(snap("a", 1))
    fanout.publish(snap("b", 1))
    fanout.publish(snap("a", 2))
    assert channel.chunks == []
    fanout.release()
    assert len(channel.chunks) == 1 and channel.chunks[0].count(b"data: ") == 2
    fanout.release()  # nothing more to write
    await next_turn()
    assert len(channel.chunks) == 1 and metrics.notifications_sent.value() == 2
