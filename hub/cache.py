"""The snapshot cache: the latest trusted state of every task, encoded once per revision.

Everything read from NATS passes `TaskCache.apply_put` / `apply_delete`, which enforce
the reader rules of contract 3: malformed values, key mismatches, stale revisions and
any change to a terminal task are refused and counted, so a bad writer can never make
the hub report something that was not legally written (invariant 2, H43).
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections.abc import Callable
from enum import Enum

import msgspec

from bridge.wire import (
    TERMINAL,
    InvalidEnvelope,
    KeyMismatch,
    decode_envelope,
    encode,
)
from bridge.wire import expires_at as task_expires_at  # `expires_at` names a field here
from hub.jsonrpc import line_safe

# A deleted key remembers its delete revision this long, so a slower read-through of
# an older value cannot bring the task back.
TOMBSTONE_SECONDS = 120.0
SHARED_INTS = 1024  # distinct pollIntervalMs values held once each


class Rejected(Enum):
    MALFORMED = "malformed"
    KEY_MISMATCH = "key_mismatch"
    STALE = "stale"
    TERMINAL_CHANGE = "terminal_change"
    OWNER_CHANGE = "owner_change"


class TaskSnapshot(msgspec.Struct, frozen=True):
    """One revision of one task; `body` is its DetailedTask JSON, shared by every reader."""

    task_id: str
    owner: str
    server: str
    revision: int
    status: str
    expires_at: float | None  # epoch seconds; None = unlimited
    body: bytes
    poll_interval_ms: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


ChangeListener = Callable[[TaskSnapshot], None]
RemoveListener = Callable[[TaskSnapshot], None]
RejectListener = Callable[[Rejected], None]


def _ignore(_: object) -> None:
    return None


class TaskCache:
    """Holds snapshots by task id; calls `on_change` for every accepted new revision and
    `on_remove` with the last snapshot of every task it drops."""

    def __init__(
        self,
        *,
        on_change: ChangeListener = _ignore,
        on_remove: RemoveListener = _ignore,
        on_reject: RejectListener = _ignore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._tasks: dict[str, TaskSnapshot] = {}
        self._tombstones: dict[str, tuple[int, float]] = {}
        # Expiry: task ids by the whole second they expire by, and a heap of those seconds.
        # One entry per task and distinct expiry (not per revision): a few bytes each.
        self._expiring: dict[int, list[str]] = {}
        self._expiry_seconds: list[int] = []
        self._ints: dict[int, int] = {}
        # Per server: [tasks, of which not terminal] (the operator stream's fleet view).
        self._servers: dict[str, list[int]] = {}
        self._on_change = on_change
        self._on_remove = on_remove
        self._on_reject = on_reject
        self._clock = clock

    def __len__(self) -> int:
        return len(self._tasks)

    def get(self, task_id: str) -> TaskSnapshot | None:
        """The current snapshot, or None when unknown or past its TTL."""
        snapshot = self._tasks.get(task_id)
        if snapshot is None or snapshot.expired(self._clock()):
            return None
        return snapshot

    def server_counts(self) -> dict[str, tuple[int, int]]:
        """Per server id: its tasks held, and how many of them are not terminal."""
        return {server: (tasks, active) for server, (tasks, active) in self._servers.items()}

    def live(self) -> list[TaskSnapshot]:
        """Every task not past its TTL (a scan: an operator stream's first states)."""
        now = self._clock()
        return [s for s in self._tasks.values() if not s.expired(now)]

    def owned_by(self, owner: str) -> list[TaskSnapshot]:
        """Every live task of `owner` (a scan: the legacy `tasks/list` is its one user)."""
        now = self._clock()
        return [s for s in self._tasks.values() if s.owner == owner and not s.expired(now)]

    def apply_put(self, key: str, revision: int, data: bytes) -> TaskSnapshot | None:
        """Ingest one KV value; returns the new snapshot if it was accepted."""
        try:
            envelope = decode_envelope(key, data)
        except KeyMismatch:
            self._reject(Rejected.KEY_MISMATCH)
            return None
        except InvalidEnvelope:
            self._reject(Rejected.MALFORMED)
            return None
        task = envelope.task
        try:
            expires_at = task_expires_at(task.createdAt, task.ttlMs)
        except ValueError:
            self._reject(Rejected.MALFORMED)
            return None

        tombstone = self._tombstones.get(key)
        if tombstone is not None and revision <= tombstone[0]:
            self._reject(Rejected.STALE)
            return None
        current = self._tasks.get(key)
        body = line_safe(encode(task))
        if current is not None:
            if revision == current.revision:
                return None  # the same message twice (watch and read-through)
            if revision < current.revision:
                self._reject(Rejected.STALE)
                return None
            if current.terminal:
                if body == current.body:
                    return None  # rewritten unchanged: nothing to report
                self._reject(Rejected.TERMINAL_CHANGE)
                return None
            if envelope.owner != current.owner:
                self._reject(Rejected.OWNER_CHANGE)
                return None

        poll = task.pollIntervalMs
        snapshot = TaskSnapshot(
            task_id=key,
            # A fleet has few owners and servers: one string each, not one per task.
            owner=sys.intern(envelope.owner),
            server=sys.intern(envelope.server),
            revision=revision,
            status=task.status,
            expires_at=expires_at,
            body=body,
            poll_interval_ms=self._small_int(poll) if isinstance(poll, int) else None,
        )
        self._tasks[key] = snapshot
        if current is not None:
            self._count(current, -1)
        self._count(snapshot, 1)
        if expires_at is not None and (current is None or current.expires_at != expires_at):
            self._expire_by(key, expires_at)
        self._on_change(snapshot)
        return snapshot

    def apply_delete(self, key: str, revision: int) -> bool:
        """A KV delete, purge or expiry marker; returns True if a task was removed."""
        current = self._tasks.get(key)
        if current is not None and revision < current.revision:
            self._reject(Rejected.STALE)
            return False
        self._tombstones[key] = (revision, self._clock() + TOMBSTONE_SECONDS)
        if current is None:
            return False
        self._drop(current)
        return True

    def reset(self) -> None:
        """Forget everything (the bucket was recreated); listeners hear of each removal."""
        removed, self._tasks = self._tasks, {}
        self._tombstones.clear()
        self._expiring.clear()
        self._expiry_seconds.clear()
        self._servers.clear()
        for snapshot in removed.values():
            self._on_remove(snapshot)

    def sweep(self) -> int:
        """Evict tasks past their TTL and old tombstones; returns how many tasks went."""
        now = self._clock()
        evicted = 0
        seconds = self._expiry_seconds
        while seconds and seconds[0] <= now:
            for key in self._expiring.pop(heapq.heappop(seconds)):
                current = self._tasks.get(key)
                # A later revision may carry a new ttlMs: a task is dropped only once
                # expired, and an entry for its older expiry finds it alive or gone.
                if current is not None and current.expired(now):
                    self._drop(current)
                    evicted += 1
        stale = [key for key, (_, until) in self._tombstones.items() if until <= now]
        for key in stale:
            del self._tombstones[key]
        return evicted

    def _expire_by(self, key: str, expires_at: float) -> None:
        # Rounded up: every task in second s has expired once the clock reaches s.
        second = math.ceil(expires_at) if math.isfinite(expires_at) else sys.maxsize
        keys = self._expiring.get(second)
        if keys is None:
            keys = self._expiring[second] = []
            heapq.heappush(self._expiry_seconds, second)
        keys.append(key)

    def _small_int(self, value: int) -> int:
        """Poll intervals repeat: the same int object for each distinct value (bounded)."""
        held = self._ints.get(value)
        if held is None:
            if len(self._ints) >= SHARED_INTS:
                return value
            held = self._ints[value] = value
        return held

    def _drop(self, snapshot: TaskSnapshot) -> None:
        del self._tasks[snapshot.task_id]
        self._count(snapshot, -1)
        self._on_remove(snapshot)

    def _count(self, snapshot: TaskSnapshot, sign: int) -> None:
        counts = self._servers.get(snapshot.server)
        if counts is None:
            counts = self._servers[snapshot.server] = [0, 0]
        counts[0] += sign
        if not snapshot.terminal:
            counts[1] += sign
        if counts[0] <= 0:
            del self._servers[snapshot.server]

    def _reject(self, reason: Rejected) -> None:
        self._on_reject(reason)
