"""The front door's answers for tasks an upstream keeps itself (docs/front-door.md).

A task the snapshot holds is always the snapshot's (hub/mcp/handlers.py). Any other task the
hub has seen an upstream create, or learned from its answer, is served here:

- `tasks/get`: the last observed state while it is younger than the task's
  `pollIntervalMs` (D25, docs/protocol.md); else read anew from the upstream with the
  caller's own headers, one read at a time per task and credential however many wait;
- `tasks/update` and `tasks/cancel`: sent to the upstream as they came; once acked, the
  task is read anew and shared;
- `subscriptions/listen`: granted with the current state, then every change the hub sees
  by polling the upstream at the task's interval with a listener's headers, by whichever
  replica holds the task's lease (hub/front_door/kept_bucket.py);
- a task the hub does not know, asked at an upstream's endpoint: asked of that upstream.

Credentials never widen access: a state is served only to a caller the upstream answered
(hub/front_door/kept_tasks.py's rule), and a credential is used only while its caller is being
served (a request now, a listen stream open); it lives in this process only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
)
from hub.admission.auth import Identity
from hub.front_door.kept_bucket import KeptBucket
from hub.front_door.kept_tasks import (
    CredentialHasher,
    ForeignTaskError,
    KeptTask,
    KeptTasks,
    task_from_result,
)
from hub.front_door.upstream import Answer, Upstream, UpstreamError
from hub.rpc import jsonrpc
from hub.store.snapshot import TaskSnapshot
from hub.store.source import StoreUnavailable

log = logging.getLogger("taskhub.kept")

RawHeaders = list[tuple[bytes, bytes]]
# Headers of the caller's request not sent with the hub's own `tasks/get` of a task.
_REPLACED = frozenset({b"mcp-method", b"mcp-name", b"content-type", b"accept", b"content-length"})
_JSON_AND_SSE = b"application/json, text/event-stream"
RECENT_ENOUGH = 0.5  # of an interval: an observation this young needs no poll
LEASE_MIN_S = 2  # a lease lives at least this long (NATS counts message TTLs in seconds)
# The `_meta` of a request the hub makes with no caller's own to copy (a 2025-11-25 one's).
REQUEST_META: dict[str, Any] = {
    PROTOCOL_VERSION_KEY: PROTOCOL_VERSION,
    CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}},
    CLIENT_INFO_KEY: {"name": "taskhub", "version": "1"},
}


class PassThrough(Exception):
    """The upstream's own answer goes to the caller as it came (a 401 with its challenge)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"upstream answered HTTP {answer.status}")
        self.answer = answer


@dataclass
class Caller:
    """Who asks, and with what the hub may read a task on their behalf, right now."""

    identity: Identity
    credential: str  # the keyed hash of its credential headers
    headers: RawHeaders  # its request's head as it goes upstream
    caller: str  # whose share of the front door a read takes
    meta: dict[str, Any] = field(default_factory=dict)  # its request's `_meta`


@dataclass
class _Polling:
    """The listeners of one task on this replica, and the task polling for them."""

    listeners: dict[int, Caller] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    poke: asyncio.Event = field(default_factory=asyncio.Event)


class UpstreamTasks:
    def __init__(
        self,
        *,
        auth: bool,
        retention: float,
        limit: int,
        default_interval: float,
        bucket: str,
        replicas: int,
        publish: Callable[[TaskSnapshot], None],
        remove: Callable[[TaskSnapshot], None],
        in_snapshot: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.auth = auth
        self.default_interval = default_interval
        self.kept = KeptTasks(retention=retention, limit=limit, on_change=publish, on_remove=remove)
        self.bucket = KeptBucket(self.kept, bucket, retention, replicas)
        self.hasher = CredentialHasher(b"")
        self.upstreams: dict[str, Upstream] = {}
        self._in_snapshot = in_snapshot
        self._reads: dict[tuple[str, str], asyncio.Future[TaskSnapshot]] = {}
        self._polling: dict[str, _Polling] = {}
        self._ids = itertools.count(1)

    async def start(self, js: Any) -> None:
        self.hasher.key = await self.bucket.start(js)

    async def stop(self) -> None:
        tasks = [p.task for p in self._polling.values() if p.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bucket.stop()

    def credential(self, headers: Mapping[str, str]) -> str:
        return self.hasher.of(headers)

    def holds(self, task_id: str) -> bool:
        return task_id in self.kept

    # -- what passes through the front door ----------------------------------------------

    def recorder(
        self, upstream: Upstream, caller: Callable[[], Caller]
    ) -> Callable[[bytes], Awaitable[None]]:
        """What `Upstream.forward` calls with each message of a `tools/call` answer that
        may carry a task: a `CreateTaskResult` the snapshot does not hold is recorded, and
        shared, before the client sees it. `caller` makes the Caller only then (its
        credential's keyed hash is most of what recording a call costs)."""

        async def record(data: bytes) -> None:
            try:
                message = msgspec.json.decode(data)
            except msgspec.DecodeError:
                return
            result = message.get("result") if isinstance(message, dict) else None
            if isinstance(result, dict) and result.get("resultType") == "task":
                await self.created(upstream, result, caller())

        return record

    async def created(self, upstream: Upstream, result: dict[str, Any], caller: Caller) -> None:
        """Record the task of a `CreateTaskResult` (the modern door's `recorder`, the legacy
        door's translation) unless the snapshot holds it or another upstream named it first."""
        try:
            task = task_from_result(result)
        except ForeignTaskError as exc:
            log.debug("upstream %s: no task recorded (%s)", upstream.spec.label, exc)
            return
        kept = self.kept.get(task.taskId)
        if kept is not None and kept.upstream != upstream.spec.label:
            return  # ids are the upstreams' own: the first to name one keeps it
        try:
            # The store, not only the cache: a bridge-written task's CreateTaskResult can
            # pass before the record brings the task, and it is the snapshot's all the same.
            if await self._in_snapshot(task.taskId):
                return
        except StoreUnavailable:
            return  # cannot tell: not recorded (the upstream is asked when it is wanted)
        await self._observe(upstream.spec.label, task, caller)

    def visible(self, caller: Caller) -> list[TaskSnapshot]:
        """Every kept task `caller` may read (the legacy door's `tasks/list`)."""
        return [
            kept.snapshot
            for task_id in self.kept.ids()
            if (kept := self.kept.get(task_id)) is not None and self._may_read(kept, caller)
        ]

    # -- the methods ---------------------------------------------------------------------

    async def get(self, task_id: str, caller: Caller, here: Upstream | None) -> TaskSnapshot:
        """The task's state for `caller` (tasks/get, and a listen's first state); raises
        the RpcError or PassThrough to answer instead."""
        kept = self.kept.get(task_id)
        if kept is None:
            upstream = here  # unknown here: the upstream of this endpoint decides
        elif self._may_read(kept, caller):
            if kept.fresh(time.time(), self.default_interval):
                return kept.snapshot
            upstream = self.upstreams.get(kept.upstream)
        else:
            upstream = self._asked_anew(kept, here)
        if upstream is None:
            raise jsonrpc.task_not_found()
        return await self._read_once(upstream, task_id, caller)

    def cached(
        self, task_id: str, identity: Identity, headers: Mapping[str, str]
    ) -> TaskSnapshot | None:
        """The state `get` would answer without reading the upstream, else None."""
        kept = self.kept.get(task_id)
        if kept is None or not kept.fresh(time.time(), self.default_interval):
            return None
        if self.auth:
            return kept.snapshot if kept.snapshot.owner == identity.principal else None
        return kept.snapshot if self.hasher.of(headers) in kept.authorized else None

    async def steer(
        self, task_id: str, body: bytes, request_id: Any, caller: Caller, here: Upstream | None
    ) -> Answer:
        """`tasks/update` or `tasks/cancel` of an upstream's task, sent as it came."""
        kept = self.kept.get(task_id)
        if kept is None:
            upstream = here
        elif self._may_read(kept, caller):
            upstream = self.upstreams.get(kept.upstream)
        else:
            upstream = self._asked_anew(kept, here)
        if upstream is None:
            raise jsonrpc.task_not_found()
        answer = await self._ask(upstream, body, request_id, caller)
        message = answer.message or {}
        if "result" in message:
            # Read anew, and shared with every replica, so the next ask anywhere shows
            # the effect (as far as the upstream shows it yet: its ack may come first).
            self.kept.stale(task_id)
            with contextlib.suppress(jsonrpc.RpcError, PassThrough):
                await self._read_once(upstream, task_id, caller)
            polling = self._polling.get(task_id)
            if polling is not None:
                polling.poke.set()
        elif _not_found(message) and kept is not None and self._may_read(kept, caller):
            await self.bucket.forget(task_id)
        if answer.status in (401, 403):
            self.kept.forget_credential(task_id, caller.credential)
        return answer

    def _asked_anew(self, kept: KeptTask, here: Upstream | None) -> Upstream | None:
        """Whom to ask for a kept task the caller may not read from the cache: without hub
        auth, its upstream, at that upstream's own endpoint (a credential it has not
        answered may still be one it accepts); with hub auth, nobody: another principal's."""
        if self.auth or here is None or here.spec.label != kept.upstream:
            return None
        return here

    def follow(self, task_id: str, caller: Caller) -> Callable[[], None]:
        """Poll the task for a listener until it is terminal, gone, or the returned
        function is called (the stream ended)."""
        polling = self._polling.setdefault(task_id, _Polling())
        key = next(self._ids)
        polling.listeners[key] = caller
        if polling.task is None or polling.task.done():
            polling.task = asyncio.create_task(self._poll(task_id, polling))

        def unfollow() -> None:
            polling.listeners.pop(key, None)
            polling.poke.set()  # the poller sees who is left

        return unfollow

    # -- reading the upstream ------------------------------------------------------------

    async def _read_once(self, upstream: Upstream, task_id: str, caller: Caller) -> TaskSnapshot:
        """`_read`, shared by every caller with the same credential asking meanwhile."""
        key = (task_id, caller.credential)
        reading = self._reads.get(key)
        if reading is None:
            reading = asyncio.ensure_future(self._read(upstream, task_id, caller))
            self._reads[key] = reading
            reading.add_done_callback(lambda _: self._reads.pop(key, None))
        return await asyncio.shield(reading)

    async def _read(self, upstream: Upstream, task_id: str, caller: Caller) -> TaskSnapshot:
        """The task read from `upstream` with the caller's headers, recorded and shared."""
        request_id = f"taskhub-{next(self._ids)}"
        body = msgspec.json.encode(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tasks/get",
                "params": {"taskId": task_id, "_meta": caller.meta or REQUEST_META},
            }
        )
        answer = await self._ask(upstream, body, request_id, caller, tasks_get_of=task_id)
        message = answer.message or {}
        kept = self.kept.get(task_id)
        if answer.status in (401, 403):
            if kept is not None:
                self.kept.forget_credential(task_id, caller.credential)
            raise PassThrough(answer)
        if "error" in message:
            if _not_found(message):
                if kept is not None and self._may_read(kept, caller):
                    await self.bucket.forget(task_id)  # the upstream no longer has it
                raise jsonrpc.task_not_found()
            raise _their_error(message["error"], answer.status)
        try:
            if message.get("id") != request_id:
                raise ForeignTaskError(f"answered request {message.get('id')!r}")
            task = task_from_result(message.get("result"), task_id)
        except ForeignTaskError as exc:
            fault = UpstreamError(502, "invalid", f"tasks/get answer is no task ({exc})")
            raise fault.rpc_error(upstream.spec.label) from None
        if kept is None:  # learning it: the snapshot's task, asked here, is not the upstream's
            with contextlib.suppress(StoreUnavailable):
                if await self._in_snapshot(task_id):
                    raise jsonrpc.task_not_found()
        return await self._observe(upstream.spec.label, task, caller)

    async def _ask(
        self,
        upstream: Upstream,
        body: bytes,
        request_id: Any,
        caller: Caller,
        *,
        tasks_get_of: str | None = None,
    ) -> Answer:
        headers = caller.headers
        if tasks_get_of is not None:
            headers = own_request_headers(headers, b"tasks/get", tasks_get_of)
        try:
            return await upstream.ask(body, headers, caller.caller, request_id)
        except UpstreamError as exc:
            upstream.metrics.upstream_requests.inc(1, upstream.spec.label, exc.fault)
            raise exc.rpc_error(upstream.spec.label) from None

    async def _observe(self, label: str, task: Any, caller: Caller) -> TaskSnapshot:
        owner = caller.identity.principal
        record = self.kept.record(task, label, owner, caller.credential)
        revision = await self.bucket.observe(task.taskId, record)
        kept = self.kept.apply(revision, record)
        if kept is None:
            raise jsonrpc.task_not_found()
        return kept.snapshot

    def _may_read(self, kept: KeptTask, caller: Caller) -> bool:
        """With hub auth: the principal it was observed for; without: a credential the
        upstream answered for it."""
        if self.auth:
            return kept.snapshot.owner == caller.identity.principal
        return caller.credential in kept.authorized

    # -- polling for listeners -----------------------------------------------------------

    async def _poll(self, task_id: str, polling: _Polling) -> None:
        """While the task has listeners here and is not final: read it every poll interval
        if this replica holds its lease (else the holder's observations come through the
        bucket). Ends with the lease given back."""
        loop = asyncio.get_running_loop()
        try:
            while polling.listeners:
                kept = self.kept.get(task_id)
                if kept is None or kept.snapshot.terminal:
                    break
                interval = _interval(kept, self.default_interval)
                due = loop.time() + interval  # a fixed cadence: the read's time is not added
                lease = max(LEASE_MIN_S, math.ceil(2 * interval))
                # Another reader's observation (a tasks/get anywhere) spares a read only
                # when clearly recent: a timer firing early must not skip a whole interval.
                recent = time.time() - kept.observed_at < interval * RECENT_ENOUGH
                if await self.bucket.lease(task_id, lease) and not recent:
                    await self._poll_once(task_id, polling)
                polling.poke.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(due):
                        await polling.poke.wait()
        finally:
            if self._polling.get(task_id) is polling and not polling.listeners:
                del self._polling[task_id]
            await self.bucket.release(task_id)

    async def _poll_once(self, task_id: str, polling: _Polling) -> None:
        """One read with the newest listener's credential; one the upstream refuses is
        used no more (its stream stays open: an expired token ends it as always)."""
        for key, caller in reversed(list(polling.listeners.items())):
            upstream = self._upstream_of(task_id)
            if upstream is None:
                return
            try:
                await self._read_once(upstream, task_id, caller)
                return
            except PassThrough:
                polling.listeners.pop(key, None)
            except jsonrpc.RpcError as err:
                if err.code != jsonrpc.INVALID_PARAMS:
                    return  # the upstream is failing: try again next interval
                polling.listeners.pop(key, None)

    def _upstream_of(self, task_id: str) -> Upstream | None:
        kept = self.kept.get(task_id)
        return None if kept is None else self.upstreams.get(kept.upstream)


def own_request_headers(headers: RawHeaders, method: bytes, name: str | None) -> RawHeaders:
    """A caller's head as it goes upstream (its credentials among it), for a request the
    hub makes on the caller's behalf: with the routing headers of `method` instead."""
    out = [(k, v) for k, v in headers if k not in _REPLACED]
    out += [
        (b"content-type", b"application/json"),
        (b"accept", _JSON_AND_SSE),
        (b"mcp-method", method),
    ]
    if name is not None:
        out.append((b"mcp-name", name.encode()))
    return out


def _interval(kept: KeptTask, default: float) -> float:
    interval_ms = kept.snapshot.poll_interval_ms
    return default if interval_ms is None else max(interval_ms / 1000, 0.05)


def _not_found(message: dict[str, Any]) -> bool:
    error = message.get("error")
    return isinstance(error, dict) and error.get("code") == jsonrpc.INVALID_PARAMS


def _their_error(error: Any, status: int) -> jsonrpc.RpcError:
    """The upstream's JSON-RPC error, passed on."""
    if not isinstance(error, dict) or not isinstance(error.get("code"), int):
        return jsonrpc.RpcError(jsonrpc.INTERNAL_ERROR, "Upstream error", http_status=502)
    message = error.get("message")
    return jsonrpc.RpcError(
        error["code"],
        message if isinstance(message, str) else "",
        data=error.get("data"),
        http_status=status if status >= 400 else 200,
    )
