"""The bridge's writes and reads of task keys: compare-and-set loops on the KV bucket.

A `TaskStore` is what a `TaskBridge` (bridge/bridge.py) writes through. Every write is a
JetStream publish that returns only once stored (durable before reply) and is a
compare-and-set on the key's last sequence, so a concurrent writer can lose and retry but
never overwrite a terminal state; a write whose outcome is unknown (a lost ack, an
election, a reconnect) is looked up until it is known or its deadline passes. Reads come
from the elected stream leader (bridge/store_reads.py). The last revision of each of the
most recent tasks is kept, so most writes, which follow the bridge's own, skip the read.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    ServerError,
    ServiceUnavailableError,
)

from bridge import states
from bridge.publisher import AckedPublisher
from bridge.states import BridgeEnvelope
from bridge.store_reads import StoreUnavailable, StoreView, read_last
from bridge.wire import (
    TERMINAL,
    DetailedTask,
    TaskRecord,
    decode_envelope,
    encode,
    is_removal,
    is_task_id,
    kv_stream,
    kv_subject,
    parse_timestamp,
)

# JSStreamWrongLastSequenceErrF / ...ConstantErr: someone else wrote the key first.
_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
_EXPECTED_LAST = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
_EXPECTED_STREAM = api.Header.EXPECTED_STREAM.value
_MSG_TTL = api.Header.MSG_TTL.value
# As nats-py's JetStream default: a write not acknowledged by then raises TimeoutError.
PUBLISH_TIMEOUT_S = 5.0
# The server adds a TTL to now in int64 nanoseconds; ~292 years and up wraps around and
# expires the message at once, so longer lifetimes are capped at a century.
MAX_MESSAGE_TTL_S = 100 * 365 * 24 * 3600
# Losing the CAS this many times in a row means the key is hot; give up loudly.
MAX_ATTEMPTS = 8
# A state change: how long it keeps trying to learn whether its write landed, or to find
# an elected leader that takes it, before it raises StoreUnavailable.
WRITE_DEADLINE_S = 15.0
# create(): how long it keeps trying to learn whether its write landed (a lost ack, a
# leader election, a reconnect) before it raises CreateOutcomeUnknown; and its back-off.
CREATE_DEADLINE_S = 15.0
_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 1.0
# Failures after which a write's outcome is unknown or the cluster may yet answer: a lost
# ack, no JetStream responder (an election), a connection being re-made, a 503.
_TRANSIENT: tuple[type[Exception], ...] = (
    NatsTimeoutError,
    NoRespondersError,
    StaleConnectionError,
    ConnectionReconnectingError,
    OutboundBufferLimitError,
    NoStreamResponseError,
    ServiceUnavailableError,
    ServerError,
)
_WRITE_FAILURES: tuple[type[Exception], ...] = (APIError, *_TRANSIENT)
_READ_FAILURES: tuple[type[Exception], ...] = (*_TRANSIENT, StoreUnavailable)
_CACHE_SIZE = 4096
_UNKNOWN: Any = object()  # _look(): no answer to believe

Clock = Callable[[], datetime]
# A transition: (current task, every input key issued so far, now) → next task.
Step = Callable[[DetailedTask, frozenset[str], datetime], DetailedTask]


class TaskNotFound(LookupError):
    """No such task in the bucket (never created, deleted, purged or expired)."""


class TaskExpired(LookupError):
    """The task's ttlMs has elapsed; it may no longer be written."""


class WriteConflict(RuntimeError):
    """Every compare-and-set attempt lost to a concurrent writer."""


class CreateOutcomeUnknown(RuntimeError):
    """`create()` could not learn, within its deadline, whether the task was stored.

    The task may exist: `task_id` names it, so the caller can resolve it (`get` it later,
    or leave it to its TTL) instead of creating another and orphaning this one.
    """

    def __init__(self, task_id: str, deadline_s: float, cause: BaseException | None) -> None:
        super().__init__(
            f"create of task {task_id}: outcome unknown after {deadline_s:g}s"
            + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
        )
        self.task_id = task_id


class _IssuedKeys(msgspec.Struct):
    issuedInputKeys: list[str] = msgspec.field(default_factory=list)


_issued_decoder = msgspec.json.Decoder(_IssuedKeys)


def decode_bridge_envelope(task_id: str, data: bytes) -> BridgeEnvelope:
    """Validate with the hub's own decoder, then pick up the bridge's extra field."""
    envelope = decode_envelope(task_id, data)
    extra = _issued_decoder.decode(data)
    return BridgeEnvelope(
        owner=envelope.owner,
        server=envelope.server,
        task=envelope.task,
        issuedInputKeys=extra.issuedInputKeys,
    )


def message_ttl(task: DetailedTask, now: datetime) -> int | None:
    """Whole seconds left until createdAt + ttlMs, rounded up; None when unlimited."""
    if task.ttlMs is None:
        return None
    age_ms = (now - parse_timestamp(task.createdAt)).total_seconds() * 1000
    remaining_ms = task.ttlMs - age_ms
    if remaining_ms <= 0:
        raise TaskExpired(f"task {task.taskId} expired")
    # NATS TTLs have one-second granularity; never cut a lifetime short.
    return min(max(1, math.ceil(remaining_ms / 1000)), MAX_MESSAGE_TTL_S)


def record(task_id: str, revision: int, envelope: BridgeEnvelope) -> TaskRecord:
    return TaskRecord(task_id, revision, envelope.owner, envelope.server, envelope.task)


class TaskStore:
    """One bridge's writes and reads of task keys; `close` it with the bridge."""

    def __init__(self, nc: Client, bucket: str, clock: Clock) -> None:
        self._js = nc.jetstream()
        self.publisher = AckedPublisher(nc, timeout=PUBLISH_TIMEOUT_S)
        self.bucket = bucket
        self._stream = kv_stream(bucket)
        self._clock = clock
        # The last (revision, envelope) written or read per task: most writes follow our
        # own previous write, so they skip the read. The CAS catches staleness.
        self._cache: OrderedDict[str, tuple[int, BridgeEnvelope]] = OrderedDict()
        # The newest stream sequence seen (acks, reads): a read is believed only from a
        # store at least as new (bridge/store_reads.py).
        self._view = StoreView()

    async def close(self) -> None:
        await self.publisher.close()
        self._cache.clear()

    async def create(
        self, task_id: str, envelope: BridgeEnvelope, ttl_s: int | None, deadline_s: float
    ) -> tuple[int, BridgeEnvelope]:
        """Write the new key until its outcome is known; never under another id.

        Expected last sequence 0 makes the write a KV create, so repeating it is safe: the
        id is new and ours alone, so a "wrong last sequence" answer means an earlier attempt
        of ours landed, and whatever is stored under the id is this create.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        delay = _RETRY_FIRST_S
        cause: BaseException | None = None
        while True:
            try:
                return await self.publish(task_id, envelope, 0, ttl_s), envelope
            except APIError as exc:
                if exc.err_code in _WRONG_LAST_SEQUENCE:
                    entry = await self.read_settled(task_id, deadline)
                    if entry is not None:
                        return entry
                    raise CreateOutcomeUnknown(task_id, deadline_s, exc) from exc
                if not isinstance(exc, _TRANSIENT):
                    raise  # refused outright: nothing was stored
                cause = exc
            except _TRANSIENT as exc:
                cause = exc
                # The write may have landed with its ack lost: look before writing again.
                entry = await self.look(task_id)
                if entry is not None and entry is not _UNKNOWN:
                    return entry  # type: ignore[no-any-return]
            if loop.time() + delay > deadline:
                raise CreateOutcomeUnknown(task_id, deadline_s, cause) from cause
            await asyncio.sleep(delay)  # back off while the cluster elects or reconnects
            delay = min(delay * 2, _RETRY_MAX_S)

    async def read_settled(
        self, task_id: str, deadline: float
    ) -> tuple[int, BridgeEnvelope] | None:
        """The stored entry of a key known to exist, read until the deadline allows."""
        loop = asyncio.get_running_loop()
        delay = _RETRY_FIRST_S
        while True:
            entry = await self.look(task_id)
            if entry is not None and entry is not _UNKNOWN:
                return entry  # type: ignore[no-any-return]
            if loop.time() + delay > deadline:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    async def read(self, task_id: str) -> tuple[int, BridgeEnvelope] | None:
        if not is_task_id(task_id):
            return None  # also keeps wildcards and dots out of the subject
        # The elected leader answers, so we see our own and others' latest write.
        subject = kv_subject(self.bucket, task_id)
        msg = await read_last(self._js, self._stream, subject, self._view)
        if msg is None:
            return None
        if is_removal(msg.headers):
            self._cache.pop(task_id, None)
            return None
        if msg.seq is None or msg.data is None:
            return None
        envelope = decode_bridge_envelope(task_id, msg.data)
        self.remember(task_id, msg.seq, envelope)
        return msg.seq, envelope

    # -- the compare-and-set loop --------------------------------------------------------

    async def change(self, task_id: str, step: Step) -> TaskRecord:
        """Compute the next state from the stored one and write it if the key is unchanged.

        A "wrong last sequence" refusal is a lost race only when the elected leader shows a
        newer revision that is not ours: the same revision means a write still pending
        for the key (ours, its ack lost, on a leader cut off from the others), so this
        waits and writes again; a stored state equal to one of our own attempts is our
        write, landed. A write whose ack is lost is looked up the same way. So within
        WRITE_DEADLINE_S this returns, or raises what the stored state says (TaskNotFound,
        a refused transition, WriteConflict after MAX_ATTEMPTS lost races); past it, with
        no answer to believe, StoreUnavailable (the write may or may not be stored).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WRITE_DEADLINE_S
        delay = _RETRY_FIRST_S
        entry: Any = self._cache.get(task_id) if is_task_id(task_id) else None
        fresh, lost = False, 0
        attempts: list[BridgeEnvelope] = []  # written, and not known to be refused
        while True:
            if entry is None:
                entry, fresh = await self.look(task_id), True
            if entry is None:
                raise TaskNotFound(f"no task {task_id!r}")
            if entry is not _UNKNOWN:
                revision, envelope = entry
                if envelope in attempts:  # what is stored is our own earlier attempt
                    return record(task_id, revision, envelope)
                now = self._clock()
                try:
                    task = step(envelope.task, frozenset(envelope.issuedInputKeys), now)
                except ValueError:
                    if fresh:
                        raise
                    entry = None  # a refusal must come from the stored state, not our cache
                    continue
                if task is envelope.task:  # nothing to write (answer() with stale keys)
                    if fresh:
                        return record(task_id, revision, envelope)
                    entry = None
                    continue
                updated = states.with_task(envelope, task)
                attempts.append(updated)
                try:
                    new_revision = await self.publish(
                        task_id, updated, revision, message_ttl(task, now)
                    )
                except _WRITE_FAILURES as exc:
                    wrong_last = isinstance(exc, APIError) and exc.err_code in _WRONG_LAST_SEQUENCE
                    if not wrong_last and not isinstance(exc, _TRANSIENT):
                        raise  # refused outright: nothing was stored
                    entry, fresh = await self.look(task_id), True
                    if entry is None or entry is _UNKNOWN or entry[1] in attempts:
                        continue  # gone, unknown (wait below), or ours
                    if entry[0] != revision:
                        lost += 1  # another writer got there first: compute on theirs
                        if lost >= MAX_ATTEMPTS:
                            raise WriteConflict(
                                f"task {task_id}: {MAX_ATTEMPTS} concurrent writes in a row won"
                            ) from exc
                        continue
                else:
                    self._view.saw(new_revision)
                    self.remember(task_id, new_revision, updated)
                    return record(task_id, new_revision, updated)
            # No answer to believe, or the key unchanged behind a pending write or a lost
            # ack: wait for the cluster (an election, a heal), then look again.
            if loop.time() + delay > deadline:
                raise StoreUnavailable(
                    f"task {task_id}: no elected leader took the write within "
                    f"{WRITE_DEADLINE_S:g}s; it may or may not be stored"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)
            entry = None

    async def look(self, task_id: str) -> Any:
        """The stored entry, None if there is none, or _UNKNOWN when the store gave no
        answer to believe now."""
        try:
            return await self.read(task_id)
        except _READ_FAILURES:
            return _UNKNOWN

    async def publish(
        self, task_id: str, envelope: BridgeEnvelope, last: int, ttl_s: int | None
    ) -> int:
        headers = {_EXPECTED_STREAM: self._stream, _EXPECTED_LAST: str(last)}
        if ttl_s is not None:
            headers[_MSG_TTL] = str(ttl_s)
        return await self.publisher.publish(
            kv_subject(self.bucket, task_id), encode(envelope), headers
        )

    def remember(self, task_id: str, revision: int, envelope: BridgeEnvelope) -> None:
        if envelope.task.status in TERMINAL:
            # No write can follow; a later attempt reads the stored state and is refused.
            self._cache.pop(task_id, None)
            return
        cached = self._cache.get(task_id)
        if cached is not None and cached[0] >= revision:
            return
        self._cache[task_id] = (revision, envelope)
        self._cache.move_to_end(task_id)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
