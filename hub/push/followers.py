"""The followers of one task, and the express lane that writes most of them in one pass.

A change reaches a follower through its backlog (hub/push/subscriber.py): offered, coalesced,
taken and written by the fan-out's flush as one chunk. Most followers are a client
listening for its own task on a stream of its own (hub/push/detached.py), writable, owing
nothing: for each of them that path spends, per frame, a backlog entry put and popped, a
place in the flush's dirty set and a dozen attribute reads, all in the interpreter. Those
streams ride the task's **express lane** instead: the flush writes the task's newest
revision to all of them at once, each stream's chunk joined and written by `map`, which
runs in C. That is the same chunk the general path writes for a stream owing one state,
in the same flush.

A stream joins the lane after the general path has written it a chunk of one state and it
is still live and writable, follows this one task and no fleet events, and its channel
says when it stops taking writes (`express`). It leaves the moment any of that ends: its
socket buffer fills or the client half-closes (hub/push/detached.py), the stream blocks, ends
or unfollows (hub/push/subscriber.py, hub/push/fanout.py). Leaving between a change and its flush,
it is handed that change as an offer, so nothing published is lost and nothing goes out
twice: a revision goes either to the lane or to backlogs, never both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import call
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from hub.push.sse_frames import chunk_head, chunk_tail
from hub.store.snapshot import TaskSnapshot

if TYPE_CHECKING:
    from hub.http.connection import Channel


class Member(Protocol):
    """What the lane needs of a follower: a listen stream (hub/push/subscriber.py)."""

    lane: Followers[Any] | None
    last_write: float  # loop time

    @property
    def prefix(self) -> bytes: ...

    @property
    def channel(self) -> Channel | None: ...

    def offer(self, snapshot: TaskSnapshot) -> bool: ...

    def wake(self) -> None: ...


_join = b"".join
# Lane members by the length of their frame prefix (one chunk size line each), as
# (length, their channels' write functions, their prefixes).
_Group = tuple[int, list[Callable[[bytes], None]], list[bytes]]


M = TypeVar("M", bound=Member)


class Followers(Generic[M]):
    """Who follows one task: `others` through their backlogs, `express` in the lane.

    `pending` is the revision published for the lane and not yet written; `last_write`
    the loop time of the lane's last write (its members' own `last_write` lags behind,
    and the tick brings it up with `sync_writes` before reading it)."""

    __slots__ = ("_groups", "express", "last_write", "others", "pending")

    def __init__(self) -> None:
        self.others: set[M] = set()
        self.express: dict[M, None] = {}
        self.pending: TaskSnapshot | None = None
        self.last_write = 0.0
        self._groups: list[_Group] | None = None  # made from `express` when next written

    def __len__(self) -> int:
        return len(self.others) + len(self.express)

    def __iter__(self) -> Iterator[M]:
        yield from self.others
        yield from self.express

    def add(self, subscriber: M) -> None:
        self.others.add(subscriber)

    def remove(self, subscriber: M) -> None:
        """Stop following; a change still pending for the lane is offered (it goes out)."""
        if subscriber.lane is self:
            self.leave(subscriber)
        self.others.discard(subscriber)

    # -- the lane ---------------------------------------------------------------------------

    def join(self, subscriber: M) -> None:
        """Into the lane (the caller checked that it may): changes skip its backlog."""
        self.others.discard(subscriber)
        self.express[subscriber] = None
        subscriber.lane = self
        self._groups = None

    def leave(self, subscriber: M) -> None:
        """Out of the lane, back to the backlog: a pending change is offered to it, and its
        writer woken to write it (once it can)."""
        del self.express[subscriber]
        subscriber.lane = None
        self._groups = None
        self.others.add(subscriber)
        if self.pending is not None:
            subscriber.offer(self.pending)
            subscriber.wake()

    def dissolve(self) -> list[M]:
        """Everyone out of the lane (the task is no longer followed); returns who was in
        it. A pending change is offered to each, as `leave` does."""
        members = list(self.express)
        pending, self.pending = self.pending, None
        self.express.clear()
        self._groups = None
        for subscriber in members:
            subscriber.lane = None
            if pending is not None:
                subscriber.offer(pending)
                subscriber.wake()
        return members

    def write_pending(self, now: float) -> int:
        """The pending change's frame to every member; returns how many were written.

        `pending` is cleared first: a member whose write fills its socket buffer leaves
        during the pass (`pause_writing` is called from inside the write), and must not
        be offered the change it was just written. The pass goes on over the lists as
        they were when it began."""
        snapshot, self.pending = self.pending, None
        if snapshot is None or not self.express:
            return 0
        groups = self._groups
        if groups is None:
            groups = self._groups = self._group()
        tail = chunk_tail(snapshot)
        written = 0
        for prefix_length, writes, prefixes in groups:
            head = chunk_head(prefix_length, len(tail))
            chunks = map(_join, zip(repeat(head), prefixes, repeat(tail)))
            deque(map(call, writes, chunks), maxlen=0)
            written += len(writes)
        self.last_write = now
        return written

    def sync_writes(self) -> None:
        """Bring each member's `last_write` up to the lane's (for the keep-alive tick)."""
        last_write = self.last_write
        for subscriber in self.express:
            if subscriber.last_write < last_write:
                subscriber.last_write = last_write

    def _group(self) -> list[_Group]:
        by_length: dict[int, _Group] = {}
        for subscriber in self.express:
            prefix = subscriber.prefix
            assert subscriber.channel is not None  # a member is writable
            group = by_length.get(len(prefix))
            if group is None:
                group = by_length[len(prefix)] = (len(prefix), [], [])
            group[1].append(subscriber.channel.write_chunks)
            group[2].append(prefix)
        return list(by_length.values())
