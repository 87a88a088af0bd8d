"""JetStream publishes awaited for their acknowledgement, many in flight on one inbox.

nats-py's `JetStreamContext.publish` pays, per message, for a request token, an
`asyncio.wait_for` (a timer and extra callbacks) and a stdlib-JSON decode of the ack
into a dataclass, all on a busy writer's hot path. This publisher keeps one
wildcard inbox subscription, numbers its requests, decodes acks with msgspec and
expires overdue requests from one sweep that runs while any are pending. Errors are
nats-py's own types, so callers handle them the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NoStreamResponseError

# How often overdue requests are failed: a deadline is met within this much.
SWEEP_S = 0.1


class _Ack(msgspec.Struct):
    seq: int = 0
    error: Any = None  # JetStream sends {"error": {...}, "seq": 0} when it refuses a write


class AckedPublisher:
    """`publish` returns the stored message's stream sequence once JetStream has it."""

    def __init__(self, nc: Client, timeout: float) -> None:
        self._nc = nc
        self._timeout = timeout
        self._prefix = ""
        self._next = 0
        self._pending: dict[str, tuple[asyncio.Future[int], float]] = {}
        self._sub: Any = None
        self._starting = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None
        self._decoder = msgspec.json.Decoder(_Ack)

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        if self._sub is None:
            await self._start()
        self._next += 1
        token = str(self._next)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending[token] = (future, loop.time() + self._timeout)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._expire_overdue())
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
            return await future
        finally:
            self._pending.pop(token, None)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(NatsTimeoutError())

    async def _start(self) -> None:
        async with self._starting:
            if self._sub is not None:
                return  # another publish started it meanwhile
            self._prefix = self._nc.new_inbox() + "."
            self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        entry = self._pending.get(msg.subject[len(self._prefix) :])
        if entry is None or entry[0].done():
            return  # answered after its deadline
        future = entry[0]
        if msg.headers and msg.headers.get("Status") == "503":
            future.set_exception(NoStreamResponseError())  # no stream has this subject
            return
        try:
            ack = self._decoder.decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            ack = None
        if ack is None or ack.error is not None or ack.seq <= 0:
            future.set_exception(_api_error(msg.data))
        else:
            future.set_result(ack.seq)

    async def _expire_overdue(self) -> None:
        """Runs while requests are pending: an idle bridge sleeps without a timer."""
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            for future, deadline in list(self._pending.values()):
                if deadline <= now and not future.done():
                    future.set_exception(NatsTimeoutError())


def _api_error(data: bytes) -> Exception:
    """The error JetStream sent instead of an ack, as nats-py would raise it."""
    try:
        error = json.loads(data)["error"]
        APIError.from_error(error)  # raises the matching subclass
    except APIError as exc:
        return exc
    except (ValueError, KeyError, TypeError):
        pass
    return APIError(description=f"unexpected JetStream reply: {data[:200]!r}")
