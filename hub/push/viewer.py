"""An operator stream's subscriber: every task through a filter, coalesced like a listen
stream, framed as named SSE events (docs/dashboard.md).

A listen stream follows the task ids it asked for; a viewer follows every task the fan-out
publishes (hub/push/fanout.py) and keeps those its filter passes. It reuses the listen stream's
states and writer (hub/push/subscriber.py, hub/push/listen_stream.py): at most one unsent state per
task, and a removal replaces an unsent state (and a state an unsent removal), so a dashboard that
falls behind costs memory bounded by the tasks it shows, never by the change rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from hub.push.subscriber import EndReason, Subscriber
from hub.rpc.jsonrpc import line_safe
from hub.store.snapshot import TaskSnapshot

QUEUED, COALESCED = 1, 2  # what an offer did (0: nothing)
FRAME_MEMO_LIMIT = 32_768  # tasks whose latest frame is kept (each about its task's JSON)
PREFIX_MEMO_LIMIT = 4096


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks a viewer shows; None = any. Values within one field are alternatives."""

    servers: frozenset[str] | None = None
    statuses: frozenset[str] | None = None
    owners: frozenset[str] | None = None

    def matches(self, snapshot: TaskSnapshot) -> bool:
        return (
            (self.servers is None or snapshot.server in self.servers)
            and (self.statuses is None or snapshot.status in self.statuses)
            and (self.owners is None or snapshot.owner in self.owners)
        )

    @property
    def narrows(self) -> bool:
        return not (self.servers is None and self.statuses is None and self.owners is None)

    def describe(self) -> dict[str, list[str]]:
        fields = {"server": self.servers, "status": self.statuses, "owner": self.owners}
        return {name: sorted(values) for name, values in fields.items() if values is not None}


def sse_event(name: str, data: Any) -> bytes:
    """One named SSE event whose data is `data` as one line of JSON."""
    return b"event: " + name.encode() + b"\ndata: " + line_safe(msgspec.json.encode(data)) + b"\n\n"


class TaskEvents:
    """`event: task` frames, made once per task revision and shared by every viewer (and
    every new stream's first states), as a listen stream's frames are spliced from bytes
    encoded once. Bounded: beyond `limit` tasks the oldest frames go, to be made again."""

    def __init__(self, limit: int = FRAME_MEMO_LIMIT) -> None:
        self._limit = limit
        self._frames: dict[str, tuple[int, bytes]] = {}
        self._prefixes: dict[tuple[str, str], bytes] = {}  # a fleet has few of these pairs

    def __len__(self) -> int:
        return len(self._frames)

    def frame(self, snapshot: TaskSnapshot) -> bytes:
        task_id = snapshot.task_id
        held = self._frames.get(task_id)
        if held is not None:
            if held[0] == snapshot.revision:
                return held[1]
            del self._frames[task_id]  # re-inserted below: the newest go last
        elif len(self._frames) >= self._limit:
            del self._frames[next(iter(self._frames))]
        frame = self._prefix(snapshot.owner, snapshot.server) + snapshot.body + b"}\n\n"
        self._frames[task_id] = (snapshot.revision, frame)
        return frame

    def join(self, snapshots: Iterable[TaskSnapshot]) -> bytes:
        return b"".join(map(self.frame, snapshots))

    def forget(self, task_id: str) -> None:
        self._frames.pop(task_id, None)

    def clear(self) -> None:
        self._frames.clear()
        self._prefixes.clear()

    def _prefix(self, owner: str, server: str) -> bytes:
        prefix = self._prefixes.get((owner, server))
        if prefix is None:
            if len(self._prefixes) >= PREFIX_MEMO_LIMIT:
                self._prefixes.clear()
            prefix = self._prefixes[owner, server] = (
                b'event: task\ndata: {"owner":'
                + line_safe(msgspec.json.encode(owner))
                + b',"server":'
                + line_safe(msgspec.json.encode(server))
                + b',"task":'
            )
        return prefix


def _removal_key(task_id: str) -> str:
    return "removed:" + task_id


class Viewer(Subscriber):
    """One operator stream: its filter, whether its caller sees the fleet's servers, and
    (when the filter narrows) which tasks it has shown, so a task leaving the view is
    announced."""

    __slots__ = ("filter", "fleet", "frames", "shown")

    def __init__(self, task_filter: TaskFilter, fleet: bool, frames: TaskEvents) -> None:
        super().__init__(b"null", ())
        self.filter = task_filter
        self.fleet = fleet
        self.frames = frames
        # Unfiltered, every task is shown; narrowed, only those that matched.
        self.shown: set[str] | None = set() if task_filter.narrows else None

    def initial(self, snapshots: Iterable[TaskSnapshot]) -> list[TaskSnapshot]:
        """The current states this stream starts with (and marks shown)."""
        matching = [snapshot for snapshot in snapshots if self.filter.matches(snapshot)]
        if self.shown is not None:
            self.shown.update(snapshot.task_id for snapshot in matching)
        return matching

    def offer_task(self, snapshot: TaskSnapshot) -> int:
        """A new revision: queue it if the filter passes it, or its removal from the view
        if it no longer does; returns QUEUED, COALESCED or 0."""
        task_id = snapshot.task_id
        if self.filter.matches(snapshot):
            if self.shown is not None:
                self.shown.add(task_id)
            if self.events:
                self.events.pop(_removal_key(task_id), None)
            return COALESCED if self.offer(snapshot) else QUEUED
        if self.shown is not None and task_id in self.shown:
            return self.offer_removal(snapshot)
        return 0

    def offer_removal(self, snapshot: TaskSnapshot) -> int:
        """The task left the cache (or the view): queue its `removed`, dropping an unsent
        state; returns QUEUED, COALESCED or 0."""
        task_id = snapshot.task_id
        if self.shown is None:
            if not self.filter.matches(snapshot):
                return 0
        elif task_id in self.shown:
            self.shown.discard(task_id)
        else:
            return 0
        replaced = self.backlog.pop(task_id, None) is not None
        self.events[_removal_key(task_id)] = sse_event("removed", {"taskId": task_id})
        return COALESCED if replaced else QUEUED

    def frame_states(self, batch: list[TaskSnapshot]) -> bytes:
        return self.frames.join(batch)

    def goodbye(self) -> bytes:
        reason = "token_expired" if self.end_reason is EndReason.TOKEN_EXPIRED else "shutdown"
        return sse_event("bye", {"reason": reason})
