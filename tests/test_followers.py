"""The express lane (hub/push/followers.py): who rides it, what it writes, and that a change
goes either to the lane or to backlogs, once, whenever a stream joins or leaves.

Streams write to a stand-in channel that keeps the contract of hub/push/detached.py: it stops
taking writes only after telling its subscriber (`leave_lane`)."""

from __future__ import annotations

import asyncio

from hub.metrics import Metrics
from hub.push.fanout import Fanout
from hub.push.sse_frames import task_frames
from hub.push.subscriber import EndReason, StreamState, Subscriber
from hub.store.snapshot import TaskSnapshot
from tests.test_fanout import Channel, next_turn


class ExpressChannel(Channel):
    """A channel that tells its stream before it stops taking writes; `fill_after` writes
    make its socket buffer "fill" inside the write that crosses it, as uvloop calls
    `pause_writing` from within `write`."""

    express = True

    def __init__(self, sub: Subscriber, fill_after: int | None = None) -> None:
        super().__init__()
        self.sub = sub
        self.fill_after = fill_after

    def write_chunks(self, data: bytes) -> None:
        super().write_chunks(data)
        if self.fill_after is not None and len(self.chunks) >= self.fill_after:
            self.stop()

    def stop(self) -> None:
        self.sub.leave_lane()
        self.writable = False


def rev(task_id: str, revision: int, status: str = "working", pad: int = 0) -> TaskSnapshot:
    body = b'{"taskId":"%s","n":%d%s}' % (task_id.encode(), revision, b',"p":"' + b"x" * pad + b'"')
    return TaskSnapshot(task_id, "anonymous", "srv", revision, status, None, body)


def stream(
    fanout: Fanout, task_ids: list[str], sid: bytes = b"1", fill_after: int | None = None
) -> tuple[Subscriber, ExpressChannel]:
    sub = Subscriber(sid, task_ids)
    channel = ExpressChannel(sub, fill_after)
    sub.channel = channel  # type: ignore[assignment]
    sub.opened()
    fanout.subscribe(sub)
    return sub, channel


async def test_solo_streams_join_after_one_chunk_and_get_the_same_chunks_from_the_lane() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    # Prefixes of three lengths (one chunk size line per length), one stream per task too.
    streams = [stream(fanout, ["a"], sid) for sid in (b"1", b"22", b"333", b"4", b'"s-55"')]
    other, other_channel = stream(fanout, ["b"], b"9")
    revisions = [rev("a", n, pad=n * 40) for n in range(1, 5)]
    for snapshot in revisions:
        fanout.publish(snapshot)
        fanout.publish(rev("b", snapshot.revision))
        await next_turn()
    for sub, channel in streams:
        assert channel.chunks == [task_frames(sub.prefix, [s]) for s in revisions]
        assert sub.lane is not None and not sub.backlog
    assert other.lane is not None and len(other_channel.chunks) == 4
    assert metrics.notifications_sent.value() == 6 * 4
    assert fanout.followers("a") == 5


async def test_two_changes_in_one_turn_reach_the_lane_as_the_newer_only() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    subs = [stream(fanout, ["a"], b"%d" % i) for i in range(3)]
    fanout.publish(rev("a", 1))
    await next_turn()  # the general path's chunk: the streams join
    fanout.publish(rev("a", 2))
    fanout.publish(rev("a", 3))
    await next_turn()
    for sub, channel in subs:
        assert channel.chunks == [task_frames(sub.prefix, [rev("a", n)]) for n in (1, 3)]
    assert metrics.coalesced_frames.value() == 3


async def test_a_stream_that_stops_taking_writes_before_the_flush_gets_the_change_once() -> None:
    fanout = Fanout(Metrics())
    (a, a_channel), (b, b_channel) = stream(fanout, ["t"], b"1"), stream(fanout, ["t"], b"2")
    fanout.publish(rev("t", 1))
    await next_turn()
    assert a.lane is not None
    woken: list[Subscriber] = []
    a.on_wake = lambda: woken.append(a)
    fanout.publish(rev("t", 2))
    a_channel.stop()  # its socket buffer filled before the flush
    await next_turn()
    assert a.lane is None and [s.revision for s in a.backlog.values()] == [2] and woken
    assert len(a_channel.chunks) == 1  # not written by the lane as well
    assert b_channel.chunks[-1] == task_frames(b.prefix, [rev("t", 2)])
    a_channel.writable = True  # its writer drains the backlog; the next chunk rejoins it
    a.backlog.clear()
    fanout.publish(rev("t", 3))
    await next_turn()
    assert a.lane is not None and a_channel.chunks[-1] == task_frames(a.prefix, [rev("t", 3)])


async def test_a_write_that_fills_a_buffer_leaves_the_rest_of_the_lane_written() -> None:
    fanout = Fanout(Metrics())
    full, full_channel = stream(fanout, ["t"], b"1", fill_after=2)
    rest = [stream(fanout, ["t"], b"%d" % i) for i in range(2, 6)]
    fanout.publish(rev("t", 1))
    await next_turn()
    fanout.publish(rev("t", 2))  # the lane's write fills `full`'s buffer: it leaves mid-pass
    await next_turn()
    assert full.lane is None and not full.backlog  # written once, not offered it again
    assert full_channel.chunks == [task_frames(full.prefix, [rev("t", n)]) for n in (1, 2)]
    for sub, channel in rest:
        assert sub.lane is not None and len(channel.chunks) == 2
    fanout.publish(rev("t", 3))
    await next_turn()
    assert [s.revision for s in full.backlog.values()] == [3]  # for its writer, when it can
    assert all(len(channel.chunks) == 3 for _, channel in rest)


async def test_a_terminal_state_goes_out_in_the_lane_and_ends_it() -> None:
    fanout = Fanout(Metrics())
    subs = [stream(fanout, ["t"], b"%d" % i) for i in range(3)]
    fanout.publish(rev("t", 1))
    await next_turn()
    fanout.publish(rev("t", 2, "completed"))
    await next_turn()
    for sub, channel in subs:
        assert channel.chunks[-1] == task_frames(sub.prefix, [rev("t", 2, "completed")])
        assert sub.lane is None and not sub.task_ids and not sub.backlog
    assert fanout.followers("t") == 0


async def test_a_task_forgotten_or_a_stream_ended_with_a_change_pending_keeps_it() -> None:
    fanout = Fanout(Metrics())
    (gone, _), (ending, _) = stream(fanout, ["t"], b"1"), stream(fanout, ["u"], b"2")
    fanout.publish(rev("t", 1))
    fanout.publish(rev("u", 1))
    await next_turn()
    assert gone.lane is not None and ending.lane is not None
    fanout.publish(rev("t", 2))
    fanout.publish(rev("u", 2))
    fanout.forget("t")  # removed from the bucket before the flush
    ending.finish(EndReason.SHUTDOWN)  # the goodbye goes after what was pending (H63)
    await next_turn()
    assert [s.revision for s in gone.backlog.values()] == [2] and gone.lane is None
    assert [s.revision for s in ending.backlog.values()] == [2]
    assert ending.state is StreamState.ENDING and ending.lane is None


async def test_streams_following_two_tasks_or_fleet_events_stay_on_the_general_path() -> None:
    fanout = Fanout(Metrics())
    both, both_channel = stream(fanout, ["a", "b"], b"1")
    evented, _ = stream(fanout, ["a"], b"2")
    fanout.follow_events(evented, "alpha", "anonymous", ["tools"])
    plain, _ = stream(fanout, ["a"], b"3")
    for n in (1, 2):
        fanout.publish(rev("a", n))
        fanout.publish(rev("b", n))
        await next_turn()
    assert both.lane is None and evented.lane is None and plain.lane is not None
    assert len(both_channel.chunks) == 2  # one chunk of both states per turn


async def test_unfollowing_or_closing_leaves_the_lane() -> None:
    metrics = Metrics()
    fanout = Fanout(metrics)
    (a, _), (b, b_channel) = stream(fanout, ["t"], b"1"), stream(fanout, ["t"], b"2")
    fanout.publish(rev("t", 1))
    await next_turn()
    fanout.unsubscribe(a)
    b.lose()  # the client went away
    assert a.lane is None and b.lane is None and fanout.followers("t") == 1
    fanout.publish(rev("t", 2))
    await next_turn()
    assert len(b_channel.chunks) == 1  # nothing written after the end


def test_the_tick_counts_the_lanes_writes_as_the_streams_own() -> None:
    fanout = Fanout(Metrics())
    sub, channel = stream(fanout, ["t"])

    async def two_changes() -> None:
        for n in (1, 2):
            fanout.publish(rev("t", n))
            await next_turn()

    asyncio.run(two_changes())
    assert sub.lane is not None
    written = sub.lane.last_write
    fanout.tick(now=written + 10.0, keepalive=15.0, send_timeout=30.0)
    assert channel.chunks[-1] != b":\n\n" and sub.last_write == written
    fanout.tick(now=written + 15.0, keepalive=15.0, send_timeout=30.0)
    assert channel.chunks[-1] == b":\n\n"
