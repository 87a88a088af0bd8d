"""The snapshot cache: the latest trusted state of every task, encoded once per revision.

Everything read from NATS passes `TaskCache.apply_put` / `apply_delete` (in this process,
or in a first read's worker process whose cache `merge` takes in), which enforce
the reader rules of contract 3: malformed values, key mismatches, stale revisions and
any change to a terminal task are refused and counted, so a bad writer can never make
the hub report something that was not legally written (invariant 2, H43).

A task is held as one bytes object (its revision, expiry, poll interval, status, owner,
server and DetailedTask JSON, packed) under its id, and handed out as a `TaskSnapshot`
made from it: one object per task, not eight
(docs/scaling.md#what-a-cached-task-costs-and-where-start-up-goes).
"""

from __future__ import annotations

import heapq
import math
import struct
import sys
import time
from collections.abc import Callable, Iterable

import msgspec

from bridge.wire import (
    TERMINAL,
    KeyMismatch,
    decode_stored,
    encode,
)
from hub.rpc.jsonrpc import line_safe
from hub.store.listener import NOBODY, Listener
from hub.store.snapshot import Rejected, TaskSnapshot

# A deleted key remembers its delete revision this long, so a slower read-through of
# an older value cannot bring the task back.
TOMBSTONE_SECONDS = 120.0
# Snapshots made for readers are kept for the next read of the same revision, up to this
# many (then all are let go at once): a polled task is unpacked once per revision.
RECENT_SNAPSHOTS = 16_384  # their size follows the tasks' (docs/architecture.md)

# A packed task: revision, expires_at (NaN: unlimited), pollIntervalMs (-1: none), status
# (an index into STATUSES), the lengths of owner and server; then owner, server and body.
# Lengths of 65,535 bytes and more are given as LONG after the head, both marked 0xFFFF.
# The body leaves out its opening `{"taskId":"<the key>",` (the id is the dict's key
# already) when it has one: status then carries _ID_LEFT_OUT. LAYOUT names all this in a
# checkpoint (hub/store/checkpoint_file.py): a change here is a new LAYOUT.
PACKED = struct.Struct("<QdqBHH")
_ID_LEFT_OUT = 0x80
_ID_OPEN, _ID_CLOSE = b'{"taskId":"', b'",'
_ID_FRAME = len(_ID_OPEN) + len(_ID_CLOSE)
_LONG = struct.Struct("<II")
_LONG_MARK = 0xFFFF
_EXPIRY = struct.Struct("<d")  # expires_at alone, at offset 8
STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
LAYOUT = f"packed-2 {PACKED.format} {','.join(STATUSES)}"
_STATUS_INDEX = {status: index for index, status in enumerate(STATUSES)}
_NO_EXPIRY = math.nan


class CachePart(msgspec.Struct, array_like=True):
    """A cache's tasks and indexes as `TaskCache.part` gives them, for `merge` (sent
    between processes as MessagePack)."""

    task_ids: list[str]
    packed: list[bytes]
    expiring: dict[int, list[int]]  # the second tasks expire by → their places in task_ids
    servers: dict[str, list[int]]  # server → [tasks, of which not terminal]
    tombstones: dict[str, tuple[int, float]]  # removed task → (revision, kept until)
    rejected: dict[str, int]  # Rejected's value → how many


class TaskCache:
    """Holds snapshots by task id; calls `on_change` for every accepted new revision and
    `on_remove` with the last snapshot of every task it drops."""

    def __init__(
        self,
        listener: Listener = NOBODY,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._tasks: dict[str, bytes] = {}  # task id → pack(snapshot)
        self._recent: dict[str, TaskSnapshot] = {}  # unpacked for a reader, still current
        self._tombstones: dict[str, tuple[int, float]] = {}
        # Expiry: task ids by the whole second they expire by, and a heap of those seconds.
        # One entry per task and distinct expiry (not per revision): a few bytes each.
        self._expiring: dict[int, list[str]] = {}
        self._expiry_seconds: list[int] = []
        # Per server: [tasks, of which not terminal] (the operator stream's fleet view).
        self._servers: dict[str, list[int]] = {}
        self._rejected: dict[str, int] = {}  # by reason: what `part` hands on
        self._on_change = listener.changed  # bound once: called for every change
        self._on_remove = listener.removed
        self._on_reject = listener.rejected
        self._clock = clock

    def __len__(self) -> int:
        return len(self._tasks)

    def get(self, task_id: str) -> TaskSnapshot | None:
        """The current snapshot, or None when unknown or past its TTL."""
        snapshot = self._current(task_id)
        if snapshot is None or snapshot.expired(self._clock()):
            return None
        return snapshot

    def _current(self, task_id: str, *, keep: bool = True) -> TaskSnapshot | None:
        """The snapshot held for `task_id`, expired or not; kept for the next read unless
        the caller is about to replace it (`keep=False`)."""
        recent = self._recent
        snapshot = recent.get(task_id)
        if snapshot is None:
            packed = self._tasks.get(task_id)
            if packed is None:
                return None
            snapshot = unpack(task_id, packed)
            if keep:
                self._keep(task_id, snapshot)
        return snapshot

    def _keep(self, task_id: str, snapshot: TaskSnapshot) -> None:
        """Hold the current `snapshot` unpacked (at most RECENT_SNAPSHOTS of them)."""
        recent = self._recent
        if len(recent) >= RECENT_SNAPSHOTS and task_id not in recent:
            recent.clear()
        recent[task_id] = snapshot

    def server_counts(self) -> dict[str, tuple[int, int]]:
        """Per server id: its tasks held, and how many of them are not terminal."""
        return {server: (tasks, active) for server, (tasks, active) in self._servers.items()}

    def live(self) -> list[TaskSnapshot]:
        """Every task not past its TTL (a scan: an operator stream's first states). When
        they all fit, the snapshots are kept as a get keeps them, for the next stream."""
        now = self._clock()
        snapshots: Iterable[TaskSnapshot | None]
        if len(self._tasks) <= RECENT_SNAPSHOTS:
            snapshots = list(map(self._current, list(self._tasks)))
        else:
            snapshots = (unpack(task_id, packed) for task_id, packed in self._tasks.items())
        return [s for s in snapshots if s is not None and not s.expired(now)]

    def owned_by(self, owner: str) -> list[TaskSnapshot]:
        """Every live task of `owner` (a scan: the legacy `tasks/list` is its one user)."""
        wanted = owner.encode()
        now = self._clock()
        snapshots = (
            unpack(task_id, packed)
            for task_id, packed in self._tasks.items()
            if _owner_of(packed) == wanted
        )
        return [s for s in snapshots if not s.expired(now)]

    def packed(self) -> tuple[list[str], list[bytes]]:
        """Every task held, expired or not, packed: what a checkpoint saves."""
        return list(self._tasks), list(self._tasks.values())

    def task_ids(self) -> list[str]:
        """The id of every task held (a copy: not for a hot path at a million tasks)."""
        return list(self._tasks)

    def packed_of(self, task_ids: list[str]) -> tuple[list[str], list[bytes]]:
        """`packed()` for just these ids, as they are held now (the ones no longer held
        are left out): a checkpoint written a slice at a time."""
        held = self._tasks
        ids = [task_id for task_id in task_ids if task_id in held]
        return ids, [held[task_id] for task_id in ids]

    def restore(self, task_ids: list[str], packed: list[bytes]) -> int:
        """Fill an empty cache from a checkpoint's `packed()`, leaving out what has expired;
        returns how many tasks it holds. No listener hears of them: nobody can be listening
        before the hub has started. Raises ValueError, holding nothing, if any value is not
        a packed task."""
        if self._tasks:
            raise RuntimeError("restore needs an empty cache")
        if len(task_ids) != len(packed):
            raise ValueError("as many task ids as values are needed")
        now = self._clock()
        tasks = self._tasks
        by_server: dict[bytes, list[int]] = {}  # decoded once each, below
        terminal = {STATUSES.index(status) for status in TERMINAL}
        try:
            for task_id, value in zip(task_ids, packed, strict=True):
                _, expires_at, _, status, owner_at, server_at, body_at = _head(value)
                status &= ~_ID_LEFT_OUT
                if status >= len(STATUSES):
                    raise ValueError(f"status {status} is not one of {len(STATUSES)}")
                if now >= expires_at:  # never for NaN: unlimited
                    continue
                value[owner_at:server_at].decode()  # the owner: valid UTF-8 too
                tasks[task_id] = value
                server = value[server_at:body_at]
                counts = by_server.get(server)
                if counts is None:
                    counts = by_server[server] = [0, 0]
                counts[0] += 1
                if status not in terminal:
                    counts[1] += 1
                if expires_at == expires_at:
                    self._expire_by(task_id, expires_at)
            self._servers = {server.decode(): counts for server, counts in by_server.items()}
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            self.reset()
            raise ValueError(f"not a packed task: {exc}") from None
        return len(tasks)

    def part(self) -> CachePart:
        """Everything held, with its indexes: what `merge` takes in another process."""
        task_ids = list(self._tasks)
        index = dict(zip(task_ids, range(len(task_ids)), strict=True))
        expiring = {  # a removed task's entries left out
            second: [index[key] for key in keys if key in index]
            for second, keys in self._expiring.items()
        }
        return CachePart(
            task_ids,
            list(self._tasks.values()),
            expiring,  # as places in task_ids: sent as ids, each would arrive a copy
            self._servers,
            self._tombstones,
            self._rejected,
        )

    def merge(self, part: CachePart) -> int:
        """Take in a cache filled in another process (the other half of a first read,
        hub/store/first_read/worker.py); returns how many tasks came over as they were.

        A task this cache neither holds nor removed comes over as it is, with its expiry
        and server counts, and no listener hears of it (as of a checkpoint's: nobody
        follows a task the hub has never held). A task both hold, or one removed in either,
        goes through the reader rules as if read here, so the later revision wins and its
        followers hear of it. What the other cache refused is counted here too."""
        tasks, tombstones = self._tasks, self._tombstones
        ids, packed, servers = part.task_ids, part.packed, part.servers
        both: list[int] = []
        if not (tasks.keys().isdisjoint(ids) and tombstones.keys().isdisjoint(ids)):  # rare
            both = [i for i, task_id in enumerate(ids) if task_id in tasks or task_id in tombstones]
        held_too = [unpack(ids[i], packed[i]) for i in both]
        for snapshot in held_too:  # counted below as read here, if the rules let them in
            counts = servers[snapshot.server]
            counts[0] -= 1
            if not snapshot.terminal:
                counts[1] -= 1
        if both:
            left_out = set(both)
            kept = [i for i in range(len(ids)) if i not in left_out]
            ids, packed = [ids[i] for i in kept], [packed[i] for i in kept]
        tasks.update(zip(ids, packed, strict=True))
        for server, (held, active) in servers.items():
            counts = self._servers.setdefault(server, [0, 0])
            counts[0] += held
            counts[1] += active
            if counts[0] <= 0:
                del self._servers[server]
        for second, places in part.expiring.items():  # a task left out's entry: harmless
            keys = list(map(part.task_ids.__getitem__, places))
            if second in self._expiring:
                self._expiring[second].extend(keys)
            else:
                self._expiring[second] = keys
                heapq.heappush(self._expiry_seconds, second)
        for snapshot in held_too:
            self._replace(snapshot)
        for key, (revision, _) in part.tombstones.items():
            self.apply_delete(key, revision)
        for reason, count in part.rejected.items():
            for _ in range(count):
                self._reject(Rejected(reason))
        return len(ids)

    def apply_put(self, key: str, revision: int, data: bytes) -> TaskSnapshot | None:
        """Ingest one KV value; returns the new snapshot if it was accepted."""
        try:
            envelope, expires_at = decode_stored(key, data)
        except KeyMismatch:
            self._reject(Rejected.KEY_MISMATCH)
            return None
        except ValueError:  # InvalidEnvelope, or an expiry the clock cannot hold
            self._reject(Rejected.MALFORMED)
            return None
        task = envelope.task
        body = encode(task)
        if not body.isascii():  # line_safe's usual case, without its call
            body = line_safe(body)
        poll = task.pollIntervalMs
        snapshot = TaskSnapshot(  # in field order (positional: this runs once per value read)
            key,
            envelope.owner,
            envelope.server,
            revision,
            task.status,
            expires_at,
            body,
            poll if isinstance(poll, int) else None,
        )
        # A task not held and never removed (every one, in a first read) needs no checks.
        if key in self._tasks or (self._tombstones and key in self._tombstones):
            return self._replace(snapshot)
        # `pack` and `_count` written out: this runs a million times in a first read. The
        # body opens with its id (`taskId` is DetailedTask's first field, and the key).
        self._tasks[key] = _packed(
            revision,
            expires_at,
            snapshot.poll_interval_ms,
            _STATUS_INDEX[task.status] | _ID_LEFT_OUT,
            _encoded(envelope.owner),
            _encoded(envelope.server),
            body[len(key) + _ID_FRAME :],
        )
        counts = self._servers.get(envelope.server)
        if counts is None:
            counts = self._servers[envelope.server] = [0, 0]
        counts[0] += 1
        if task.status not in TERMINAL:
            counts[1] += 1
        if expires_at is not None:
            self._expire_by(key, expires_at)
        self._on_change(snapshot)
        return snapshot

    def _replace(self, snapshot: TaskSnapshot) -> TaskSnapshot | None:
        """`apply_put` for a task held or removed before: the reader rules decide."""
        key, revision = snapshot.task_id, snapshot.revision
        tombstone = self._tombstones.get(key)
        if tombstone is not None and revision <= tombstone[0]:
            self._reject(Rejected.STALE)
            return None
        current = self._current(key, keep=False)
        if current is not None:
            if revision == current.revision:
                return None  # the same message twice (watch and read-through)
            if revision < current.revision:
                self._reject(Rejected.STALE)
                return None
            if current.terminal:
                if snapshot.body == current.body:
                    return None  # rewritten unchanged: nothing to report
                self._reject(Rejected.TERMINAL_CHANGE)
                return None
            if snapshot.owner != current.owner:
                self._reject(Rejected.OWNER_CHANGE)
                return None
        self._tasks[key] = pack(snapshot)
        if current is not None:
            # A task that changes once changes again: its next revision, and the readers
            # meanwhile, find this one unpacked (a first read's tasks are not kept).
            self._keep(key, snapshot)
            self._count(current.server, current.terminal, -1)
        self._count(snapshot.server, snapshot.terminal, 1)
        expires_at = snapshot.expires_at
        if expires_at is not None and (current is None or current.expires_at != expires_at):
            self._expire_by(key, expires_at)
        self._on_change(snapshot)
        return snapshot

    def apply_delete(self, key: str, revision: int) -> bool:
        """A KV delete, purge or expiry marker; returns True if a task was removed."""
        current = self._current(key, keep=False)
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
        self._recent.clear()
        self._tombstones.clear()
        self._expiring.clear()
        self._expiry_seconds.clear()
        self._servers.clear()
        for task_id, packed in removed.items():
            self._on_remove(unpack(task_id, packed))

    def sweep(self) -> int:
        """Evict tasks past their TTL and old tombstones; returns how many tasks went."""
        now = self._clock()
        evicted = 0
        seconds = self._expiry_seconds
        while seconds and seconds[0] <= now:
            for key in self._expiring.pop(heapq.heappop(seconds)):
                packed = self._tasks.get(key)
                # A later revision may carry a new ttlMs: a task is dropped only once
                # expired, and an entry for its older expiry finds it alive or gone.
                if packed is not None and now >= _EXPIRY.unpack_from(packed, 8)[0]:
                    self._drop(unpack(key, packed))
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

    def _drop(self, snapshot: TaskSnapshot) -> None:
        del self._tasks[snapshot.task_id]
        self._recent.pop(snapshot.task_id, None)
        self._count(snapshot.server, snapshot.terminal, -1)
        self._on_remove(snapshot)

    def _count(self, server: str, terminal: bool, sign: int) -> None:
        counts = self._servers.get(server)
        if counts is None:
            counts = self._servers[server] = [0, 0]
        counts[0] += sign
        if not terminal:
            counts[1] += sign
        if counts[0] <= 0:
            del self._servers[server]

    def _reject(self, reason: Rejected) -> None:
        self._rejected[reason.value] = self._rejected.get(reason.value, 0) + 1
        self._on_reject(reason)


# Owners and servers as bytes: a fleet has a few of each, in many tasks. Bounded, since a
# hostile writer could name a new one in each value.
ENCODED_KEPT = 4096
_encoded_names: dict[str, bytes] = {}


def _encoded(name: str) -> bytes:
    encoded = _encoded_names.get(name)
    if encoded is None:
        if len(_encoded_names) >= ENCODED_KEPT:
            _encoded_names.clear()
        encoded = _encoded_names[name] = name.encode()
    return encoded


def pack(snapshot: TaskSnapshot) -> bytes:
    """One bytes object for the cache to hold (PACKED, then owner, server and body)."""
    status = _STATUS_INDEX[snapshot.status]
    body = snapshot.body
    opening = b"".join((_ID_OPEN, snapshot.task_id.encode(), _ID_CLOSE))
    if body.startswith(opening):
        body = body[len(opening) :]  # a copy, but cheaper than a memoryview of it
        status |= _ID_LEFT_OUT
    return _packed(
        snapshot.revision,
        snapshot.expires_at,
        snapshot.poll_interval_ms,
        status,
        snapshot.owner.encode(),
        snapshot.server.encode(),
        body,
    )


def _packed(
    revision: int,
    expires_at: float | None,
    poll: int | None,
    status: int,
    owner: bytes,
    server: bytes,
    body: bytes,
) -> bytes:
    long = len(owner) >= _LONG_MARK or len(server) >= _LONG_MARK
    head = PACKED.pack(
        revision,
        _NO_EXPIRY if expires_at is None else expires_at,
        -1 if poll is None else poll,
        status,
        _LONG_MARK if long else len(owner),
        _LONG_MARK if long else len(server),
    )
    if long:
        head += _LONG.pack(len(owner), len(server))
    return b"".join((head, owner, server, body))


def _head(packed: bytes) -> tuple[int, float, int, int, int, int, int]:
    """Revision, expiry, poll interval and status, and where owner, server and body begin."""
    revision, expires_at, poll, status, owner_length, server_length = PACKED.unpack_from(packed)
    owner_at = PACKED.size
    if owner_length == _LONG_MARK and server_length == _LONG_MARK:
        owner_length, server_length = _LONG.unpack_from(packed, owner_at)
        owner_at += _LONG.size
    server_at = owner_at + owner_length
    body_at = server_at + server_length
    if body_at > len(packed):
        raise ValueError("owner and server run past the value")
    return revision, expires_at, poll, status, owner_at, server_at, body_at


def _owner_of(packed: bytes) -> bytes:
    _, _, _, _, owner_at, server_at, _ = _head(packed)
    return packed[owner_at:server_at]


def unpack(task_id: str, packed: bytes) -> TaskSnapshot:
    """The snapshot `pack` packed."""
    revision, expires_at, poll, status, owner_at, server_at, body_at = _head(packed)
    if status & _ID_LEFT_OUT:
        rest = memoryview(packed)[body_at:]
        body = b"".join((_ID_OPEN, task_id.encode(), _ID_CLOSE, rest))
    else:
        body = packed[body_at:]
    return TaskSnapshot(
        task_id,
        packed[owner_at:server_at].decode(),
        packed[server_at:body_at].decode(),
        revision,
        STATUSES[status & ~_ID_LEFT_OUT],
        None if expires_at != expires_at else expires_at,  # NaN: unlimited
        body,
        None if poll < 0 else poll,
    )
