"""The `subscriptions/listen` SSE stream: ack, current states, every change, goodbye.

The stream's own task sends the response head, the ack and the current states (H56),
then parks: changes reach the socket from the fan-out's flush (hub/push/fanout.py). The
task wakes only when that cannot write (socket buffer full, or no direct channel under
another ASGI server), to await `send` and its drain, and at the end, to send the
completion result when the hub ends the stream (H63) or the token expires. A slow
client only ever delays itself (invariant 5).

sse-starlette is not used here: it runs four tasks per stream and patches uvicorn's
signal handling process-wide, while this stream needs no task of its own while idle,
a precise order (ack first) and a completion result on the hub's own shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from hub.http.connection import connection_of
from hub.http.framing import RawHeaders, streaming_head
from hub.metrics import Metrics
from hub.push.detached import DetachedStream
from hub.push.sse_frames import KEEPALIVE_FRAME
from hub.push.subscriber import EndReason, Subscriber

log = logging.getLogger("taskhub.sse")

HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # H19
]


class ListenStream:
    """An ASGI response that runs one listen subscription until either side ends it."""

    def __init__(
        self,
        subscriber: Subscriber,
        first_frame: bytes,
        *,
        metrics: Metrics,
        on_close: Callable[[Subscriber], None],
        ends_at: float | None = None,
    ) -> None:
        self.ends_at = ends_at  # epoch seconds: the caller's token expires
        self.subscriber = subscriber
        self.first_frame = first_frame
        self.metrics = metrics
        self.on_close = on_close
        self.extra_headers: RawHeaders = []  # CORS, on a stream run by `run_on`

    def run_on(
        self,
        transport: asyncio.Transport,
        default_headers: RawHeaders,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Run on a connection of its own, without this object or a task (hub/push/detached.py)."""
        headers = [*HEADERS, *self.extra_headers, (b"connection", b"close")]
        stream = DetachedStream(self.subscriber, self.metrics, self.on_close, loop)
        stream.start(
            transport, streaming_head(default_headers, 200, headers), self.first_frame, self.ends_at
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        subscriber = self.subscriber
        subscriber.task = asyncio.current_task()
        connection = connection_of(scope)
        channel = subscriber.channel = None if connection is None else connection.channel(scope)
        watcher = None
        if channel is not None:
            channel.on_lost = subscriber.lose
        else:  # another ASGI server: learn of the disconnect from `receive`
            watcher = asyncio.create_task(self._watch_disconnect(receive))
        self.metrics.streams_opened.inc(1, "asgi" if channel is None else "direct")
        expiry = subscriber.finish_at(self.ends_at)
        _forget_request_head(scope)
        try:
            await self._send(
                send, {"type": "http.response.start", "status": 200, "headers": HEADERS}
            )
            await self._write_first(send)
            subscriber.opened()
            while not subscriber.ended:
                if subscriber.pending:
                    await self._write_pending(send)
                elif subscriber.keepalive_due:
                    subscriber.keepalive_due = False
                    await self._write(send, KEEPALIVE_FRAME)
                elif subscriber.ending:
                    await self._write(send, subscriber.goodbye())
                    await self._send(send, {"type": "http.response.body", "body": b""})
                    break
                else:
                    await subscriber.park()
        except asyncio.CancelledError:
            if subscriber.end_reason is not EndReason.SEND_TIMEOUT:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        except OSError:
            pass
        finally:
            reason = subscriber.closed()
            if watcher is not None:
                watcher.cancel()
            if expiry is not None:
                expiry.cancel()
            self.on_close(subscriber)
            self.metrics.streams_closed.inc(1, reason.value)

    # The frames are held by these calls' locals only: not by the parked stream.

    async def _write_first(self, send: Send) -> None:
        first, self.first_frame = self.first_frame, b""
        await self._write(send, first)

    async def _write_pending(self, send: Send) -> None:
        data, count = self.subscriber.take_frames()
        await self._write(send, data)
        self.metrics.notifications_sent.inc(count)

    async def _write(self, send: Send, data: bytes) -> None:
        await self._send(send, {"type": "http.response.body", "body": data, "more_body": True})

    async def _send(self, send: Send, message: dict[str, object]) -> None:
        """`send`, timed by the fan-out's tick: a client that stops reading is dropped."""
        subscriber = self.subscriber
        if subscriber.ended:
            raise OSError("stream ended")
        loop = asyncio.get_running_loop()
        subscriber.blocking(loop.time())
        try:
            await send(message)
        finally:
            subscriber.unblocked(loop.time())
        if subscriber.ended:
            raise OSError("stream ended")

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.subscriber.lose()
                return


def _forget_request_head(scope: Scope) -> None:
    """Empty the request's header list: read and checked by now, and otherwise held by
    the server (uvicorn's connection keeps the same list) for the stream's whole life."""
    headers = scope.get("headers")
    if isinstance(headers, list):
        headers.clear()
