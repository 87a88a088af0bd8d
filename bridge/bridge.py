"""TaskBridge: a server's writer of task states into the KV bucket (contracts 3 and 4,
docs/architecture.md).

Its connection, its control consumer and the task operations a server calls; every write
and read of a task key goes through its `TaskStore` (bridge/task_store.py), the
compare-and-set loops. The rules themselves live in `bridge.states`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

import nats
from nats.aio.client import Client

from bridge import states
from bridge.control import (
    CancelHandler,
    ControlConsumer,
    ControlOptions,
    ControlStats,
    InputHandler,
)
from bridge.events import DEFAULT_SERVICE, FleetEvents
from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.states import BridgeEnvelope
from bridge.task_store import (
    CREATE_DEADLINE_S,
    Clock,
    TaskStore,
    message_ttl,
    record,
)
from bridge.wire import (
    CONTROL_STREAM,
    DEFAULT_BUCKET,
    SERVER_ID_RE,
    TaskError,
    TaskRecord,
    control_subject,
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class TaskBridge:
    """Writes one server's tasks; build it with `connect` or `attach`, then `close` it."""

    def __init__(
        self,
        nc: Client,
        server_id: str,
        *,
        bucket: str,
        owns_connection: bool,
        clock: Clock,
        control: ControlOptions | None = None,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self.server_id = server_id
        self.bucket = bucket
        self._owns_connection = owns_connection
        self._clock = clock
        self._store = TaskStore(nc, bucket, clock)  # the key reads and compare-and-set writes
        # Forwarded tasks/update and tasks/cancel; consuming starts with the first handler.
        self._control = ControlConsumer(self, nc, control or ControlOptions())

    @classmethod
    async def connect(
        cls,
        nats_url: str,
        server_id: str,
        *,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        clock: Clock = _utcnow,
        control: ControlOptions | None = None,
        **nats_options: Any,
    ) -> TaskBridge:
        """Open a NATS connection of our own; `close()` closes it.

        `nats_url` may list a cluster's servers comma-separated, as `taskhub serve
        --nats-url` does (passing `servers=` too would clash with it).
        """
        _check_server_id(server_id)
        servers = [url.strip() for url in nats_url.split(",") if url.strip()]
        # Replies to this server's requests on subjects only it may read (deploy/nats).
        nats_options.setdefault("inbox_prefix", f"_INBOX_{server_id}")
        nc = await nats.connect(servers, **nats_options)
        try:
            return await cls._start(nc, server_id, bucket, replicas, True, clock, control)
        except BaseException:
            await nc.close()
            raise

    @classmethod
    async def attach(
        cls,
        nc: Client,
        server_id: str,
        *,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        clock: Clock = _utcnow,
        control: ControlOptions | None = None,
    ) -> TaskBridge:
        """Borrow a connection; `close()` leaves it open."""
        _check_server_id(server_id)
        return await cls._start(nc, server_id, bucket, replicas, False, clock, control)

    @classmethod
    async def _start(
        cls,
        nc: Client,
        server_id: str,
        bucket: str,
        replicas: int,
        owns: bool,
        clock: Clock,
        control: ControlOptions | None,
    ) -> TaskBridge:
        bridge = cls(
            nc, server_id, bucket=bucket, owns_connection=owns, clock=clock, control=control
        )
        await ensure_bucket(bridge._js, bucket, replicas)
        await ensure_control_stream(bridge._js, replicas)
        return bridge

    def events(self, service: str = DEFAULT_SERVICE) -> FleetEvents:
        """Change events of `service` (tools, prompts, resources) on this bridge's connection."""
        return FleetEvents(self._nc, service)

    async def close(self) -> None:
        await self._control.stop()  # before the connection goes: an in-flight ack needs it
        await self._store.close()
        if self._owns_connection and not self._nc.is_closed:
            await self._nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- forwarded requests (bridge.control) ----------------------------------------------

    def on_input(self, handler: InputHandler) -> None:
        """Receive tasks/update answers: `handler(task_id, responses)`, outstanding keys only.

        Each key reaches the handler once; the bridge then marks it answered (see
        bridge.control for the exact guarantee). Replaces an earlier handler; the first
        handler of either kind starts consuming, so register both in one synchronous step.
        """
        self._control.input_handler = handler
        self._control.start()

    def on_cancel(self, handler: CancelHandler) -> None:
        """Receive tasks/cancel: `handler(task_id)` decides whether and when to cancel.

        Called for every cancel of a live task the caller owns, so a repeated cancel calls
        it again: make it idempotent. TerminalStateError from it (the task ended
        meanwhile) counts as done; any other exception has the cancel redelivered.
        """
        self._control.cancel_handler = handler
        self._control.start()

    @property
    def control_stats(self) -> ControlStats:
        """A snapshot of the control message counters."""
        return dataclasses.replace(self._control.stats)

    # -- writes ---------------------------------------------------------------------------

    async def create(
        self,
        *,
        owner: str,
        ttl_ms: int | None = None,
        poll_interval_ms: int | None = None,
        status_message: str | None = None,
        deadline_s: float = CREATE_DEADLINE_S,
    ) -> TaskRecord:
        """A new `working` task owned by `owner`, durable once this returns.

        A lost ack, a leader election or a reconnect does not orphan a task: the same id is
        written again (a KV create, so at most once) and read back until the outcome is
        known. If it cannot be known within `deadline_s`, `CreateOutcomeUnknown` names the
        id, which may or may not be stored; never retry with a new id without resolving it.
        """
        if not isinstance(owner, str) or not owner:
            raise ValueError("owner must be a non-empty principal")
        task_id = str(uuid.uuid4())  # 122 random bits (contract 3)
        now = self._clock()
        task = states.new_task(
            task_id,
            now,
            ttl_ms=ttl_ms,
            poll_interval_ms=poll_interval_ms,
            status_message=status_message,
        )
        envelope = BridgeEnvelope(owner=owner, server=self.server_id, task=task)
        store = self._store
        revision, envelope = await store.create(
            task_id, envelope, message_ttl(task, now), deadline_s
        )
        store.remember(task_id, revision, envelope)
        return record(task_id, revision, envelope)

    async def working(self, task_id: str, *, status_message: str | None = None) -> TaskRecord:
        return await self._store.change(
            task_id, lambda t, _, now: states.to_working(t, now, status_message=status_message)
        )

    async def require_input(
        self,
        task_id: str,
        input_requests: Mapping[str, Mapping[str, Any]],
        *,
        status_message: str | None = None,
    ) -> TaskRecord:
        """Add outstanding input requests; each key must be new for this task."""
        return await self._store.change(
            task_id,
            lambda t, issued, now: states.to_input_required(
                t, input_requests, now, issued_keys=issued, status_message=status_message
            ),
        )

    async def complete(
        self, task_id: str, result: Mapping[str, Any], *, status_message: str | None = None
    ) -> TaskRecord:
        return await self._store.change(
            task_id,
            lambda t, _, now: states.to_completed(t, result, now, status_message=status_message),
        )

    async def fail(
        self,
        task_id: str,
        error: TaskError | Mapping[str, Any],
        *,
        status_message: str | None = None,
    ) -> TaskRecord:
        return await self._store.change(
            task_id,
            lambda t, _, now: states.to_failed(t, error, now, status_message=status_message),
        )

    async def cancelled(self, task_id: str, *, status_message: str | None = None) -> TaskRecord:
        return await self._store.change(
            task_id, lambda t, _, now: states.to_cancelled(t, now, status_message=status_message)
        )

    async def answer(self, task_id: str, keys: Iterable[str]) -> TaskRecord:
        """Mark input keys answered; unknown or stale keys change nothing (no write)."""
        if isinstance(keys, str):
            raise TypeError("keys must be an iterable of keys, not one string")
        answered = frozenset(keys)
        return await self._store.change(task_id, lambda t, _, now: states.answer(t, answered, now))

    # -- reads ----------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskRecord | None:
        """The current stored state, read from the elected stream leader; None if there is
        none. Raises StoreUnavailable when no leader with its quorum and a store as new as
        this bridge has seen answered within the read's deadline (bridge/store_reads.py)."""
        entry = await self._store.read(task_id)
        return None if entry is None else record(task_id, *entry)

    async def forward(self, server: str, data: bytes, msg_id: str) -> None:
        """Queue a control message (an encoded `UpdateMessage` or `CancelMessage`) for
        `server`'s consumer, as the hub does; returns once JetStream stored it. `msg_id`
        (`wire.control_message_id`) makes a retried request count once."""
        await self._js.publish(
            control_subject(server), data, stream=CONTROL_STREAM, headers={"Nats-Msg-Id": msg_id}
        )


def _check_server_id(server_id: str) -> None:
    if not isinstance(server_id, str) or SERVER_ID_RE.fullmatch(server_id) is None:
        raise ValueError(f"server id {server_id!r} does not match [A-Za-z0-9_-]{{1,64}}")
