"""The `subscriptions/listen` SSE stream: ack, current states, every change, goodbye.

One writer per stream drains the subscriber's coalescing backlog, so a slow client
only ever delays itself (invariant 5). Frames are spliced from the task's bytes,
encoded once per revision, and a per-stream prefix; nothing is re-encoded per
subscriber. No `id:` lines: streams cannot be resumed (H25).

sse-starlette is not used here: it runs four tasks per stream and patches uvicorn's
signal handling process-wide, while this stream needs one writer, a precise order
(ack first, H56) and a completion result on the hub's own shutdown (H63).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec
from starlette.types import Message, Receive, Scope, Send

from hub.cache import TaskSnapshot
from hub.fanout import Subscriber
from hub.metrics import Metrics

log = logging.getLogger("taskhub.sse")

SUBSCRIPTION_ID_KEY = b'"io.modelcontextprotocol/subscriptionId":'
KEEPALIVE_FRAME = b":\n\n"
HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # H19
]


def event(payload: bytes) -> bytes:
    """One SSE event carrying one JSON-RPC message (JSON never contains a raw newline)."""
    return b"data: " + payload + b"\n\n"


def ack_frame(subscription_id: bytes, task_ids: list[str] | None) -> bytes:
    """`notifications/subscriptions/acknowledged` with the granted subset (H56, H57)."""
    granted = b"" if task_ids is None else b'"taskIds":' + msgspec.json.encode(task_ids)
    return event(
        b'{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b'},"notifications":{'
        + granted
        + b"}}}"
    )


def notification_prefix(subscription_id: bytes) -> bytes:
    return (
        b'data: {"jsonrpc":"2.0","method":"notifications/tasks","params":{"_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b"},"
    )


def task_frame(prefix: bytes, snapshot: TaskSnapshot) -> bytes:
    """`notifications/tasks` = the same DetailedTask bytes `tasks/get` serves (H60)."""
    return prefix + snapshot.body[1:] + b"}\n\n"


def completion_frame(subscription_id: bytes) -> bytes:
    """The listen request's own result, sent when the hub ends the stream (H63)."""
    return event(
        b'{"jsonrpc":"2.0","id":'
        + subscription_id
        + b',"result":{"resultType":"complete","_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b"}}}"
    )


class ListenStream:
    """An ASGI response that runs one listen subscription until either side ends it."""

    def __init__(
        self,
        subscriber: Subscriber,
        first_frame: bytes,
        *,
        keepalive: float,
        send_timeout: float,
        metrics: Metrics,
        on_close: Callable[[Subscriber], None],
        ends_at: float | None = None,
    ) -> None:
        self.ends_at = ends_at  # epoch seconds: the caller's token expires
        self.subscriber = subscriber
        self.first_frame = first_frame
        self.keepalive = keepalive
        self.send_timeout = send_timeout
        self.metrics = metrics
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        subscriber = self.subscriber
        watcher = asyncio.create_task(self._watch_disconnect(receive))
        reason = "client"
        try:
            await self._send(
                send, {"type": "http.response.start", "status": 200, "headers": HEADERS}
            )
            await self._write(send, self.first_frame)
            prefix = notification_prefix(subscriber.subscription_id)
            while not subscriber.disconnected:
                batch = subscriber.take()
                if batch:
                    await self._write(send, b"".join(task_frame(prefix, s) for s in batch))
                    self.metrics.notifications_sent.inc(len(batch))
                    continue
                if subscriber.closing or self._expired():
                    reason = "shutdown" if subscriber.closing else "token_expired"
                    await self._write(send, completion_frame(subscriber.subscription_id))
                    await self._send(send, {"type": "http.response.body", "body": b""})
                    break
                woken = await subscriber.wait(self._next_wake())
                if not woken and not self._expired():
                    await self._write(send, KEEPALIVE_FRAME)  # H20
        except TimeoutError:
            reason = "send_timeout"  # a client that stopped reading: free its slot
        except OSError:
            reason = "client"
        finally:
            watcher.cancel()
            self.on_close(subscriber)
            self.metrics.streams_closed.inc(1, reason)

    def _expired(self) -> bool:
        return self.ends_at is not None and time.time() >= self.ends_at

    def _next_wake(self) -> float:
        if self.ends_at is None:
            return self.keepalive
        return max(0.0, min(self.keepalive, self.ends_at - time.time()))

    async def _write(self, send: Send, data: bytes) -> None:
        await self._send(send, {"type": "http.response.body", "body": data, "more_body": True})

    async def _send(self, send: Send, message: Message) -> None:
        if self.subscriber.disconnected:
            raise OSError("client disconnected")
        async with asyncio.timeout(self.send_timeout):
            await send(message)

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.subscriber.close(disconnected=True)  # H23: send nothing more
                return
