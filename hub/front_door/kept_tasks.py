"""Tasks an upstream keeps itself: what the hub last observed of each, and for whom.

A server behind the front door that writes nothing to NATS (any Tasks server, any
language) answers `tools/call` with a `CreateTaskResult` and serves `tasks/get` itself.
The hub records such a task when it sees one pass (or learns it from the upstream's own
`tasks/get`), and from then on answers for it as a cache in front of the upstream
(docs/front-door.md#tasks-the-upstream-keeps):

- its state is the upstream's last answer, held as a `TaskSnapshot` so the fan-out and
  the `tasks/get` encoder treat it as any other task; its revision is the sequence of the
  observation in the hubs' shared bucket (hub/front_door/kept_bucket.py), so every replica orders
  observations alike;
- who may read it: with hub authentication, the principal it was observed for; without,
  a caller whose credential (its `Authorization`, `Cookie` and `X-API-Key` headers) the
  upstream has answered for it, compared by a keyed hash. The credentials themselves
  never leave the process (hub/front_door/upstream_tasks.py holds the live ones);
- how long: until its TTL, else `retention` after it was last observed, and at most
  `limit` tasks (the oldest observed go first).

Everything here is synchronous bookkeeping; reading the upstream is
hub/front_door/upstream_tasks.py's.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from bridge.wire import DetailedTask, InvalidEnvelope, check_task, encode, expires_at
from hub.store.snapshot import TaskSnapshot

# Request headers that can carry a caller's credential to an upstream.
CREDENTIAL_HEADERS = ("authorization", "cookie", "x-api-key")
AUTHORIZED_KEPT = 16  # credential hashes remembered per task; the oldest goes first
MAX_FOREIGN_ID = 256  # characters of a task id the hub accepts from an upstream
UPSTREAM_SERVER = "upstream:"  # a kept snapshot's `server`: this and the upstream's label

_task_decoder = msgspec.json.Decoder(DetailedTask)


class KeptRecord(msgspec.Struct, omit_defaults=True, rename="camel"):
    """One observation as the hubs share it (never a credential, only keyed hashes)."""

    upstream: str
    owner: str
    authorized: list[str]
    observed_at: float  # epoch seconds
    task: msgspec.Raw  # the DetailedTask JSON, as the hub encodes it


class KeptTask(msgspec.Struct):
    """The hub's view of one upstream-kept task."""

    snapshot: TaskSnapshot
    upstream: str
    authorized: list[str]
    observed_at: float
    kept_until: float  # epoch seconds: its TTL's end, or retention after observed_at

    def fresh(self, now: float, default_interval: float) -> bool:
        """Observed within the task's poll interval: no upstream read is needed."""
        interval_ms = self.snapshot.poll_interval_ms
        interval = default_interval if interval_ms is None else interval_ms / 1000
        return self.snapshot.terminal or now - self.observed_at < interval


class ForeignTaskError(ValueError):
    """An upstream's task state that breaks the extension's wire rules."""


def task_from_result(result: Any, task_id: str | None = None) -> DetailedTask:
    """The DetailedTask in a `tasks/get` result or a `CreateTaskResult` (flat, D5), held
    to the wire rules; raises ForeignTaskError. `task_id`: the one asked for, if any."""
    if not isinstance(result, dict):
        raise ForeignTaskError("result is not an object")
    fields = {k: v for k, v in result.items() if k not in ("resultType", "_meta")}
    fields.setdefault("ttlMs", None)
    try:
        task = msgspec.convert(fields, DetailedTask)
        check_task(task, id_syntax=False)
    except (msgspec.ValidationError, InvalidEnvelope) as exc:
        raise ForeignTaskError(str(exc)) from None
    if not 0 < len(task.taskId) <= MAX_FOREIGN_ID or not task.taskId.isprintable():
        raise ForeignTaskError("taskId is empty, too long or not printable")
    if task_id is not None and task.taskId != task_id:
        raise ForeignTaskError(f"asked for task {task_id!r}, answered {task.taskId!r}")
    return task


class CredentialHasher:
    """Keyed hashes of callers' credentials; the key is the hubs' shared one."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def of(self, headers: Mapping[str, str]) -> str:
        """The hash of a request's credential headers (`headers` by lower-case name)."""
        digest = hmac.new(self.key, digestmod=hashlib.sha256)
        for name in CREDENTIAL_HEADERS:
            value = headers.get(name)
            if value is not None:
                data = value.encode("latin-1", "replace")
                digest.update(b"%s\x00%d\x00%s\x00" % (name.encode(), len(data), data))
        return digest.hexdigest()[:32]


class KeptTasks:
    """Every upstream-kept task this hub knows, by task id; calls `on_change` with each
    new state (a new body) and `on_remove` with the last state of each task dropped."""

    def __init__(
        self,
        *,
        retention: float,
        limit: int,
        on_change: Callable[[TaskSnapshot], None],
        on_remove: Callable[[TaskSnapshot], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.retention = retention
        self.limit = limit
        self._tasks: dict[str, KeptTask] = {}
        self._on_change = on_change
        self._on_remove = on_remove
        self._clock = clock
        self._revision = 0  # local revisions, when no bucket numbers them

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: str) -> bool:
        return self.get(task_id) is not None

    def ids(self) -> list[str]:
        return list(self._tasks)

    def get(self, task_id: str) -> KeptTask | None:
        kept = self._tasks.get(task_id)
        if kept is not None and self._clock() >= kept.kept_until:
            self.remove(task_id)
            return None
        return kept

    def local_revision(self) -> int:
        self._revision += 1
        return self._revision

    def record(self, task: DetailedTask, upstream: str, owner: str, credential: str) -> KeptRecord:
        """The record of a fresh observation of `task` for `owner`, answered for `credential`:
        what goes into the shared bucket, then through `apply`."""
        kept = self._tasks.get(task.taskId)
        authorized = [] if kept is None or kept.snapshot.owner != owner else kept.authorized
        authorized = [c for c in authorized if c != credential][-(AUTHORIZED_KEPT - 1) :]
        return KeptRecord(
            upstream, owner, [*authorized, credential], self._clock(), encode_raw(task)
        )

    def apply(self, revision: int, record: KeptRecord) -> KeptTask | None:
        """Take an observation in (from this hub or another, through the bucket); older
        ones than held are ignored, as is any change to a terminal state; None for a
        record that holds no valid task."""
        try:
            task = _task_decoder.decode(record.task)
            check_task(task, id_syntax=False)
        except (msgspec.DecodeError, InvalidEnvelope):
            return None
        held = self._tasks.get(task.taskId)
        if held is not None and held.snapshot.revision >= revision:
            return held
        if held is not None and held.snapshot.terminal and held.snapshot.owner == record.owner:
            # A terminal state is final (D18); a later observation only refreshes who may read it.
            held.authorized = record.authorized
            return held
        body = encode(task)
        snapshot = TaskSnapshot(
            task.taskId,
            record.owner,
            UPSTREAM_SERVER + record.upstream,
            revision,
            task.status,
            _expiry(task),
            body,
            None if task.pollIntervalMs is msgspec.UNSET else task.pollIntervalMs,
        )
        ttl_end = snapshot.expires_at if snapshot.expires_at is not None else math.inf
        kept = KeptTask(
            snapshot,
            record.upstream,
            record.authorized,
            record.observed_at,
            min(ttl_end, record.observed_at + self.retention),
        )
        self._tasks.pop(task.taskId, None)  # kept in the order last observed
        self._tasks[task.taskId] = kept
        if held is None and len(self._tasks) > self.limit:
            self.remove(next(iter(self._tasks)))  # the least recently observed
        if held is None or held.snapshot.body != body or held.snapshot.owner != record.owner:
            self._on_change(snapshot)
        return kept

    def forget_credential(self, task_id: str, credential: str) -> None:
        """The upstream refused `credential` for the task: it reads the task no more."""
        kept = self._tasks.get(task_id)
        if kept is not None:
            kept.authorized = [c for c in kept.authorized if c != credential]

    def stale(self, task_id: str) -> None:
        """Read it again at the next ask (a `tasks/update` or `tasks/cancel` was acked)."""
        kept = self._tasks.get(task_id)
        if kept is not None and not kept.snapshot.terminal:
            kept.observed_at = -math.inf

    def remove(self, task_id: str) -> None:
        kept = self._tasks.pop(task_id, None)
        if kept is not None:
            self._on_remove(kept.snapshot)

    def sweep(self) -> None:
        """Drop every task past its TTL or retention."""
        now = self._clock()
        for task_id in [t for t, kept in self._tasks.items() if now >= kept.kept_until]:
            self.remove(task_id)


def encode_raw(task: DetailedTask) -> msgspec.Raw:
    return msgspec.Raw(encode(task))


def _expiry(task: DetailedTask) -> float | None:
    try:
        return expires_at(task.createdAt, task.ttlMs)
    except (ValueError, OverflowError):
        return None
