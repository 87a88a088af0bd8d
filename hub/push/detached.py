"""A listen stream alone on its connection: no request cycle, no task, no ASGI.

A `subscriptions/listen` request that came whole in one read and needs no I/O (every
task it names is cached and the caller's) is answered by the connection itself
(hub/http/connection.py). The connection leaves uvicorn, as for uvicorn's own WebSocket
upgrade, and this protocol runs the stream on the transport; the HTTP protocol, its
parser, the request's scope and cycle are freed. What the stream's task does in
hub/push/listen_stream.py, callbacks do here:

- `start`: the response head, the ack and the current states, in one write;
- `pump`, run soon after the subscriber is woken (a change the flush could not write,
  a keep-alive due, the end) and when the socket takes writes again: it writes what is
  queued, the keep-alive or the goodbye while the socket takes them, and otherwise
  marks the stream blocked, so the fan-out's tick drops it past `--send-timeout`;
- `connection_lost`: the end, whoever caused it, and the only place the stream is
  released.

The response says `connection: close`: after the completion result (H63) the
connection closes, there being no HTTP protocol left to read another request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hub.http.framing import LAST_CHUNK, chunk
from hub.metrics import Metrics
from hub.push.sse_frames import KEEPALIVE_FRAME
from hub.push.subscriber import Subscriber


def _unstarted(data: bytes) -> None:
    raise RuntimeError("the stream has no transport")  # `writable` is False: not reached


class DetachedStream(asyncio.Protocol):
    """One listen stream's writer, as the transport's protocol; its `Channel` too."""

    __slots__ = (
        "_expiry",
        "_loop",
        "_woken",
        "metrics",
        "on_close",
        "subscriber",
        "transport",
        "writable",
        "write_chunks",
    )
    # Every change of `writable` to False below tells the subscriber first: the stream
    # may ride its task's express lane (hub/push/followers.py).
    express = True

    def __init__(
        self,
        subscriber: Subscriber,
        metrics: Metrics,
        on_close: Callable[[Subscriber], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.subscriber = subscriber
        self.metrics = metrics
        self.on_close = on_close
        self._loop = loop  # given: asking for it costs a getpid on CPython 3.11
        self._woken = False  # a pump is scheduled
        self._expiry: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        # The channel's two members the flush uses once per frame, kept rather than
        # computed: `writable` while the transport is ours and not paused, closing or
        # lost; `write_chunks` is the transport's own `write`.
        self.writable = False
        self.write_chunks: Callable[[bytes], None] = _unstarted

    def start(
        self, transport: asyncio.Transport, head: bytes, first: bytes, ends_at: float | None
    ) -> None:
        """Take the transport over; write the response `head`, the `first` frame (the
        ack) and the current states, in one chunk."""
        self.transport = transport
        transport.set_protocol(self)  # before writing: pause_writing now comes here
        self.writable = not transport.is_closing()
        self.write_chunks = transport.write
        subscriber = self.subscriber
        subscriber.channel = self
        subscriber.on_wake = self._wake
        self.metrics.streams_opened.inc(1, "in_place")
        self._expiry = subscriber.finish_at(ends_at)
        states, count = subscriber.take_frames()
        transport.write(head + chunk(first + states))
        self.metrics.notifications_sent.inc(count)
        subscriber.last_write = self._loop.time()
        subscriber.opened()
        self.pump()  # the hub may be closing already

    # -- the channel the fan-out writes through --------------------------------------------

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(chunk(data))

    def abort(self) -> None:
        self.subscriber.leave_lane()
        self.writable = False
        if self.transport is not None:
            self.transport.abort()

    # -- the writer --------------------------------------------------------------------

    def _wake(self) -> None:
        # Soon, not now: a wake comes from inside the fan-out's loops and transitions.
        if not self._woken:
            self._woken = True
            self._loop.call_soon(self._pump_soon)

    def _pump_soon(self) -> None:
        self._woken = False
        self.pump()

    def pump(self) -> None:
        """Write what the stream owes while the socket takes it."""
        subscriber = self.subscriber
        while not subscriber.ended:
            owes = subscriber.pending or subscriber.keepalive_due or subscriber.ending
            if not owes:
                return
            now = self._loop.time()
            if not self.writable:
                if subscriber.stalled_since() is None:
                    subscriber.blocking(now)  # the tick's send timeout runs from here
                return
            subscriber.last_write = now
            if subscriber.pending:
                data, count = subscriber.take_frames()
                self.write(data)
                self.metrics.notifications_sent.inc(count)
            elif subscriber.keepalive_due:
                subscriber.keepalive_due = False
                self.write(KEEPALIVE_FRAME)
            else:  # ending: the completion result, the last chunk, and close
                assert self.transport is not None
                self.write(subscriber.goodbye())
                self.transport.write(LAST_CHUNK)
                if self.transport.get_write_buffer_size():
                    subscriber.blocking(now)  # a client that never reads it is dropped
                self.writable = False
                self.transport.close()
                return

    # -- the transport's callbacks ---------------------------------------------------------

    def pause_writing(self) -> None:
        self.subscriber.leave_lane()
        self.writable = False

    def resume_writing(self) -> None:
        transport = self.transport
        self.writable = transport is not None and not transport.is_closing()
        if self.subscriber.stalled_since() is not None:
            self.subscriber.unblocked(self._loop.time())
        self.pump()

    def data_received(self, data: bytes) -> None:
        pass  # a listening client has nothing more to say; a new request needs a new connection

    def eof_received(self) -> None:
        self.subscriber.leave_lane()
        self.writable = False  # the client is done: the transport closes itself (returning None)

    def connection_lost(self, exc: Exception | None) -> None:
        subscriber = self.subscriber
        if self._expiry is not None:
            self._expiry.cancel()
        subscriber.lose()
        reason = subscriber.closed()
        subscriber.on_wake = None
        self.writable = False
        self.write_chunks = _unstarted
        self.transport = None
        self.on_close(subscriber)
        self.metrics.streams_closed.inc(1, reason.value)
