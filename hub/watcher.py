"""An operator stream's subscriber: every task through a filter, coalesced like a listen
stream, framed as named SSE events (docs/dashboard.md).

A listen stream follows the task ids it asked for; a watcher follows every task the fan-out
publishes (hub/fanout.py) and keeps those its filter passes. It reuses the listen stream's
states and writer (hub/subscriber.py, hub/sse.py): at most one unsent state per task, and a
removal replaces an unsent state (and a state an unsent removal), so a dashboard that falls
behind costs memory bounded by the tasks it shows, never by the change rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from hub.cache import TaskSnapshot
from hub.jsonrpc import line_safe
from hub.subscriber import EndReason, Subscriber

QUEUED, COALESCED = 1, 2  # what an offer did (0: nothing)
_PREFIX_MEMO_LIMIT = 4096


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks a watcher shows; None = any. Values within one field are alternatives."""

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


_prefixes: dict[tuple[str, str], bytes] = {}


def _task_prefix(owner: str, server: str) -> bytes:
    """`event: task` up to the task's JSON, memoised: a fleet has few owner/server pairs."""
    prefix = _prefixes.get((owner, server))
    if prefix is None:
        if len(_prefixes) >= _PREFIX_MEMO_LIMIT:
            _prefixes.clear()
        prefix = _prefixes[owner, server] = (
            b'event: task\ndata: {"owner":'
            + line_safe(msgspec.json.encode(owner))
            + b',"server":'
            + line_safe(msgspec.json.encode(server))
            + b',"task":'
        )
    return prefix


def task_events(snapshots: Iterable[TaskSnapshot]) -> bytes:
    """`event: task` frames: owner, server and the DetailedTask bytes `tasks/get` serves."""
    parts: list[bytes] = []
    for snapshot in snapshots:
        parts += (_task_prefix(snapshot.owner, snapshot.server), snapshot.body, b"}\n\n")
    return b"".join(parts)


def _removal_key(task_id: str) -> str:
    return "removed:" + task_id


class Watcher(Subscriber):
    """One operator stream: its filter, whether its caller sees the fleet's servers, and
    (when the filter narrows) which tasks it has shown, so a task leaving the view is
    announced."""

    __slots__ = ("filter", "fleet", "shown")

    def __init__(self, task_filter: TaskFilter, fleet: bool) -> None:
        super().__init__(b"null", ())
        self.filter = task_filter
        self.fleet = fleet
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
        return task_events(batch)

    def goodbye(self) -> bytes:
        reason = "token_expired" if self.end_reason is EndReason.TOKEN_EXPIRED else "shutdown"
        return sse_event("bye", {"reason": reason})
