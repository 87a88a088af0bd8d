"""Receive the hub's forwarded tasks/update and tasks/cancel (contract 3; H49, H51).

One durable pull consumer per server id reads `mcp.tasks.ctl.<server>` and hands each
message to the server's handlers one at a time, in order, after re-reading the task from
the KV leader. Serial handling plus that re-read is why a duplicated client update is
harmless: the second copy finds its keys already answered and is dropped.

Guarantees, per input key: the input handler receives a key once it is outstanding, and
then no more, because `answer()` removes it before the message is acked (H49: keys not
outstanding are ignored). It is at-least-once only when the process dies between the
handler's success and the `answer()` write; a failed `answer()` in a live process is
retried without calling the handler again. A handler that raises gets its message back
with a delay; after `max_deliveries` the message is a dead letter: logged, counted, termed.
Each cancel message calls the cancel handler while the task is live (again if the handler
raised), so a repeated tasks/cancel calls it again: cancellation is cooperative (H51) and
the handler decides, idempotently, whether and when to write `cancelled()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, ServiceUnavailableError

from bridge.elections import CONSUMER_LEADER_ELECTED, LeaderElected, unless_elected
from bridge.states import TerminalStateError
from bridge.wire import (
    CONTROL_STREAM,
    TERMINAL,
    ControlMessage,
    InvalidEnvelope,
    TaskRecord,
    UpdateMessage,
    control_subject,
    decode_control,
)

log = logging.getLogger(__name__)

InputHandler = Callable[[str, dict[str, Any]], Awaitable[None]]  # (task_id, outstanding answers)
CancelHandler = Callable[[str], Awaitable[None]]  # (task_id)

_HANDED_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class ControlOptions:
    """How the consumer paces itself; the defaults suit production, tests shrink them."""

    ack_wait: float = 30.0  # unacked this long (e.g. the process died) → redelivered
    backoff: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0)  # nak delay per failed attempt; last repeats
    max_deliveries: int = 5  # a message that failed this many times is a dead letter
    fetch_timeout: float = 5.0  # long-poll length; an empty poll is normal, not an error
    retry_pause: float = 1.0  # after a NATS error, before trying again (never busy-spin)
    close_timeout: float = 5.0  # close() lets an in-flight handler finish this long

    def __post_init__(self) -> None:
        if not self.backoff or min(self.backoff) < 0:
            raise ValueError("backoff needs at least one delay, none negative")
        if self.max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        timings = (self.ack_wait, self.fetch_timeout, self.retry_pause)
        if min(timings) <= 0 or self.close_timeout < 0:
            raise ValueError("ack_wait, fetch_timeout and retry_pause must be positive")


@dataclass(slots=True)
class ControlStats:
    """What happened to control messages; each message is counted once, when settled."""

    processed: int = 0  # a handler ran (or a pending answer was written); acked
    ignored: int = 0  # acked without a handler: stale, foreign, terminal, unknown, no handler
    retried: int = 0  # a handler or read failed; nak'd for a delayed redelivery
    dead_letters: int = 0  # failed max_deliveries times; termed
    malformed: int = 0  # not a control message at all; termed


class Tasks(Protocol):
    """What the consumer needs of its server's tasks: `TaskBridge` (bridge/bridge.py)."""

    server_id: str

    async def get(self, task_id: str) -> TaskRecord | None: ...

    async def answer(self, task_id: str, keys: Iterable[str]) -> TaskRecord: ...


def refusal(record: TaskRecord | None, message: ControlMessage, server_id: str) -> str | None:
    """Why `message` must be acked without a handler call, or None if it should run."""
    if record is None:
        return "unknown task"
    if record.server != server_id:
        return f"task belongs to server {record.server!r}"
    if record.owner != message.principal:
        return "principal does not own the task"  # the hub checks too; defence in depth
    if record.task.status in TERMINAL:
        return f"task is {record.task.status}"
    if isinstance(message, UpdateMessage):
        if record.task.status != "input_required":
            return "task is not input_required"
        if not outstanding(record, message):
            return "no outstanding input key"  # H49: never issued, answered or superseded
    return None


def outstanding(record: TaskRecord, message: UpdateMessage) -> dict[str, Any]:
    """The message's responses for keys the task is still waiting for."""
    requests = record.task.inputRequests
    if not isinstance(requests, dict):
        return {}
    return {k: v for k, v in message.inputResponses.items() if k in requests}


class ControlConsumer:
    """The consumer loop behind `TaskBridge.on_input` / `on_cancel`; one task, serial."""

    def __init__(self, tasks: Tasks, nc: Client, options: ControlOptions) -> None:
        self._tasks = tasks
        self._nc = nc
        self._js: Any = nc.jetstream()
        self._options = options
        self.input_handler: InputHandler | None = None
        self.cancel_handler: CancelHandler | None = None
        self.stats = ControlStats()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._busy = False
        # Keys handed to the input handler whose answer() write failed: a retry (or a
        # duplicate update) writes the answer without calling the handler again.
        self._handed: dict[str, set[str]] = {}
        # A new leader for our consumer: a fetch waiting on the old one is asked again.
        self._elected = asyncio.Event()

    def start(self) -> None:
        """Start consuming (idempotent); needs a running event loop."""
        if self._task is None and not self._stopping:
            name = f"bridge-control-{self._tasks.server_id}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def stop(self) -> None:
        """Stop fetching; an in-flight message gets `close_timeout` to finish, else it stays
        unacked and JetStream redelivers it after ack_wait (to this server id's next bridge)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        if not self._busy:
            task.cancel()  # idle in a fetch: nothing to lose
        done, _ = await asyncio.wait({task}, timeout=self._options.close_timeout)
        if not done:
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            log.error("control consumer failed", exc_info=task.exception())

    async def _run(self) -> None:
        sub: Any = None
        clock = asyncio.get_running_loop().time
        subject = f"{CONSUMER_LEADER_ELECTED}{CONTROL_STREAM}.{self._tasks.server_id}"
        advisories = await self._nc.subscribe(subject, cb=self._on_leader_elected)
        try:
            while not self._stopping:
                try:
                    if sub is None:
                        sub = await self._subscribe()
                    started = clock()
                    try:
                        msgs = await self._fetch(sub)
                        if msgs is None:
                            continue  # a new leader: ask it at once
                    except TimeoutError:  # an empty long poll, or a reconnect in progress
                        if clock() - started < self._options.fetch_timeout / 2:
                            # nats-py also reports 409 statuses as timeouts, at once: pause.
                            await asyncio.sleep(self._options.retry_pause)
                        continue
                    for msg in msgs:
                        self._busy = True
                        try:
                            await self._handle(msg)
                        finally:
                            self._busy = False
                except Exception as exc:
                    if self._nc.is_closed:
                        log.warning("control consumer stops: the NATS connection is closed")
                        return
                    log.warning("control consumer: %r; retrying", exc)
                    if not isinstance(exc, ServiceUnavailableError):  # 503: no leader yet
                        await _unsubscribe(sub)
                        sub = None  # bind afresh: the consumer may have been deleted or moved
                    with contextlib.suppress(TimeoutError):  # at once on a new leader
                        async with asyncio.timeout(self._options.retry_pause):
                            await self._elected.wait()
        finally:
            await _unsubscribe(sub)
            await _unsubscribe(advisories)

    async def _fetch(self, sub: Any) -> list[Msg] | None:
        """One long poll; None when our consumer got a new leader meanwhile (after its node
        died the poll would wait out its whole timeout). A message the dropped poll still
        brings waits in the subscription for the next one."""
        self._elected.clear()
        try:
            msgs: list[Msg] = await unless_elected(
                sub.fetch(1, timeout=self._options.fetch_timeout), self._elected
            )
        except LeaderElected:
            return None
        return msgs

    async def _on_leader_elected(self, msg: Msg) -> None:
        log.info("control consumer leader elected: %s", msg.data[:200].decode(errors="replace"))
        self._elected.set()

    async def _subscribe(self) -> Any:
        """Create or update the durable consumer, then bind a pull subscription to it."""
        durable = self._tasks.server_id
        config = api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            description="taskhub bridge: tasks/update and tasks/cancel for this server",
            filter_subject=control_subject(durable),
            deliver_policy=api.DeliverPolicy.ALL,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self._options.ack_wait,
            # No server-side max_deliver: the bridge decides dead letters so each is logged.
        )
        try:
            await self._js.add_consumer(CONTROL_STREAM, config)
        except APIError as exc:
            # It exists with settings that cannot change in place: it holds our queue, use it.
            await self._js.consumer_info(CONTROL_STREAM, durable)
            log.warning("control consumer %s kept with its old settings: %s", durable, exc)
        return await self._js.pull_subscribe_bind(durable=durable, stream=CONTROL_STREAM)

    async def _handle(self, msg: Msg) -> None:
        """Decide one message's fate: ack, nak with a delay, or term. Never raises."""
        try:
            message = decode_control(msg.data)
        except InvalidEnvelope as exc:
            log.error("malformed control message dropped: %s", exc)
            await _settle(msg.term())
            self.stats.malformed += 1
            return
        delivered = msg.metadata.num_delivered
        limit = self._options.max_deliveries
        if delivered > limit:  # earlier deliveries ended with no verdict (crash, close)
            await self._dead_letter(msg, message, f"delivered {delivered} times")
            return
        keep_alive = asyncio.create_task(self._keep_alive(msg))
        try:
            handled = await self._process(message)
        except Exception as exc:
            if delivered >= limit:
                await self._dead_letter(msg, message, repr(exc))
                return
            delay = self._options.backoff[min(delivered, len(self._options.backoff)) - 1]
            attempt = f"{delivered} of {limit}"
            log.warning("%s failed (%s), retry in %ss: %r", _what(message), attempt, delay, exc)
            await _settle(msg.nak(delay=delay))
            self.stats.retried += 1
            return
        finally:
            keep_alive.cancel()
        await _settle(msg.ack_sync())
        if handled:
            self.stats.processed += 1
        else:
            self.stats.ignored += 1

    async def _process(self, message: ControlMessage) -> bool:
        """Run the handler if the stored task still wants it; True if it ran."""
        has_handler = (
            self.input_handler if isinstance(message, UpdateMessage) else self.cancel_handler
        ) is not None
        if not has_handler:
            log.debug("%s dropped: no handler registered", _what(message))
            return False
        record = await self._tasks.get(message.taskId)  # the leader's state, never a cache
        reason = refusal(record, message, self._tasks.server_id)
        if reason is not None or record is None:
            log.debug("%s ignored: %s", _what(message), reason)
            if record is None or record.task.status != "input_required":
                self._handed.pop(message.taskId, None)  # nothing of it can be answered now
            return False
        if isinstance(message, UpdateMessage):
            await self._deliver_input(record, message)
        elif self.cancel_handler is not None:
            with contextlib.suppress(TerminalStateError):  # it finished meanwhile: done
                await self.cancel_handler(message.taskId)
        return True

    async def _deliver_input(self, record: TaskRecord, message: UpdateMessage) -> None:
        task_id = message.taskId
        responses = outstanding(record, message)
        handed = self._handed.get(task_id, set())
        fresh = {k: v for k, v in responses.items() if k not in handed}
        if fresh and self.input_handler is not None:
            with contextlib.suppress(TerminalStateError):  # it finished meanwhile
                await self.input_handler(task_id, fresh)
            self._handed.setdefault(task_id, set()).update(fresh)
            if len(self._handed) > _HANDED_LIMIT:
                self._handed.pop(next(iter(self._handed)))  # a bound: forget the oldest
        # LookupError = TaskNotFound / TaskExpired: the task is gone, nothing to answer.
        with contextlib.suppress(LookupError, TerminalStateError):
            await self._tasks.answer(task_id, list(responses))
        left = self._handed.get(task_id, set()) - responses.keys()
        if left:
            self._handed[task_id] = left
        else:
            self._handed.pop(task_id, None)

    async def _dead_letter(self, msg: Msg, message: ControlMessage, why: str) -> None:
        delivered = msg.metadata.num_delivered
        log.error("dead letter: %s dropped after %d deliveries: %s", _what(message), delivered, why)
        await _settle(msg.term())
        self.stats.dead_letters += 1

    async def _keep_alive(self, msg: Msg) -> None:
        """A slow handler is not a dead one: keep resetting the ack_wait timer."""
        while True:
            await asyncio.sleep(self._options.ack_wait / 3)
            await _settle(msg.in_progress())


def _what(message: ControlMessage) -> str:
    """`update for task <id>` / `cancel for task <id>`, for logs."""
    op = "update" if isinstance(message, UpdateMessage) else "cancel"
    return f"{op} for task {message.taskId}"


async def _settle(reply: Awaitable[Any]) -> None:
    """Send an ack/nak/term; if NATS is away it is lost and ack_wait redelivers instead."""
    try:
        await reply
    except Exception as exc:
        log.warning("control message not settled (will be redelivered): %r", exc)


async def _unsubscribe(sub: Any) -> None:
    if sub is not None:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
