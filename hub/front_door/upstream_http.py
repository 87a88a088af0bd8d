"""HTTP/1.1 to the upstreams, on the event loop's own sockets: pooled connections read by httptools.

The front door's client (hub/front_door/upstream.py is its one user). A request goes out as one
write of its head and body; the answer is read by llhttp (httptools) as it arrives: its
status and head once, then its body's bytes as they came, chunked or framed by
`Content-Length` or by the connection's end, never gathered or re-framed here. What the
front door needs of a proxy's client and nothing more:

- a pool per host and port, most recently used first, at most `max_connections` open
  (a request waits for one, within its deadline) and `max_idle` idle, each idle one
  dropped after `idle_expiry` seconds, before an upstream would close it (uvicorn and
  Node close after 5 s, gunicorn after 2 s): reusing one the upstream is closing at
  that moment would fail the request with a reset;
- a connection goes back to the pool only after an answer read exactly to its end with
  nothing behind it. Bytes past an answer's end (in the same read, before the answer is
  closed, or while idle) would answer the connection's next request, perhaps another
  client's to another upstream: the connection is closed and `overran` tells the reader;
- an answer left before its end (the client gone, a limit) closes its connection, which
  is how the upstream learns to stop;
- reading pauses while more than `HIGH_WATER` bytes wait for the reader (an SSE answer
  relayed to a slow client), so the socket's buffer holds the rest;
- `gzip` and `deflate` content codings are decoded as they are read, a piece at a time
  (hub/front_door/content_coding.py); any other is an `invalid` fault (the hub asks only
  for these);
- faults are `UpstreamFault`s named as the front door's fault table names them:
  `refused`, `timeout`, `reset`, `invalid` (docs/front-door.md#upstream-errors).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from hub.front_door import content_coding

RawHeaders = list[tuple[bytes, bytes]]
HIGH_WATER = 256 << 10  # bytes of an answer waiting for its reader before reading pauses
MAX_HEAD_BYTES = 64 << 10  # an answer's head (or trailer, or chunk framing) at most
SMALL_BODY = 64 << 10  # a body up to this size is joined to its head for one write


class UpstreamFault(Exception):
    """No usable answer from the upstream: `kind` is refused | timeout | reset | invalid."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, eq=False)  # a pool's key by identity: one per upstream
class Origin:
    """Where requests for one upstream URL go: host and port, the request target, the
    `Host` header, and TLS for https."""

    host: str
    port: int
    target: bytes
    authority: bytes
    tls: bool
    request_line: bytes  # and the Host field: how every request's head starts

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        netloc = parts.netloc.rpartition("@")[2]  # never credentials in the Host header
        authority = netloc.encode("idna")
        line = b"POST %s HTTP/1.1\r\nhost: %s\r\n" % (target.encode(), authority)
        return cls(parts.hostname, port, target.encode(), authority, tls, line)

    def head(self, lines: bytes, length: int) -> bytes:
        """A POST's head: the target, `Host`, header `lines` as given, the body's length."""
        return b"%scontent-length: %d\r\n\r\n" % (self.request_line + lines, length)


class Response:
    """An answer whose head has come: `status`, `headers` (names in lower case) and its
    body through `chunks()`. `close()` it once done: read to its end, its connection
    goes back to the pool; otherwise it is closed."""

    __slots__ = (
        "_connection",
        "_done",
        "_error",
        "_held",
        "_pieces",
        "_waiter",
        "headers",
        "status",
    )

    def __init__(self, connection: _Connection, status: int, headers: RawHeaders) -> None:
        self._connection: _Connection | None = connection
        self.status = status
        self.headers = headers
        self._pieces: deque[bytes] = deque()
        self._held = 0
        self._done = False  # the answer's last byte has come
        self._error: UpstreamFault | None = None
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def media_type(self) -> bytes:
        value = self.header(b"content-type") or b""
        return value.split(b";", 1)[0].strip().lower()

    @property
    def complete(self) -> bool:
        return self._done and not self._pieces

    @property
    def overran(self) -> bool:
        """More bytes came after the answer's end: its connection is not reused."""
        connection = self._connection
        return connection is not None and connection.overran

    def arriving(self, limit: int) -> bool:
        """The body is still coming, unbroken, with at most `limit` bytes here unread."""
        return not self._done and self._error is None and self._held <= limit

    def whole(self) -> list[bytes] | None:
        """The whole body at once, if it has all come (and needs no decoding): taken, so
        `chunks()` yields nothing more; None otherwise."""
        if not self._done or self._error is not None or self.header(b"content-encoding"):
            return None
        pieces = list(self._pieces)
        self._pieces.clear()
        self._held = 0
        return pieces

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, content coding decoded; UpstreamFault when
        the answer breaks."""
        try:
            decoder = content_coding.decoder(self.header(b"content-encoding"))
        except content_coding.CodingError as exc:
            raise UpstreamFault("invalid", str(exc)) from None
        while True:
            while self._pieces:
                data = self._pieces.popleft()
                self._held -= len(data)
                if self._held < HIGH_WATER // 2 and self._connection is not None:
                    self._connection.resume()
                if decoder is None:
                    yield data
                    continue
                try:
                    for piece in content_coding.decode(decoder, data):
                        yield piece
                except content_coding.CodingError as exc:
                    raise UpstreamFault("invalid", str(exc)) from None
            if self._error is not None:
                raise self._error
            if self._done:
                if decoder is not None and not decoder.eof:
                    raise UpstreamFault("invalid", "undecodable answer (its coding ends early)")
                return
            assert self._connection is not None  # unread pieces, or an answer still coming
            self._waiter = self._connection.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.release(self._done and not self._pieces and self._error is None)

    # -- what the connection tells it ------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._pieces.append(data)
        self._held += len(data)
        if self._held > HIGH_WATER and self._connection is not None:
            self._connection.pause()
        self._wake()

    def _end(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, fault: UpstreamFault) -> None:
        if not self._done:
            self._error = fault
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Late(Protocol):
    """What `Client.due` tells when its deadline passes."""

    def late(self, timeout: float) -> None: ...


class Waiter(Protocol):
    """What waits for an exchange's answer head: a future (`Client.post`), or an object
    that acts on it with callbacks alone (hub/front_door/forward_now.py)."""

    def done(self) -> bool: ...

    def set_result(self, response: Response, /) -> None: ...

    def set_exception(self, fault: BaseException, /) -> None: ...


class _Connection(asyncio.Protocol):
    """One connection to an upstream: at most one exchange at a time."""

    def __init__(self, pool: Client, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: Waiter | None = None  # the exchange's answer head
        # Told after each read and at the connection's loss while set (by a waiter on
        # callbacks, which has no task to wake): the answer may have moved on.
        self.notify: Callable[[], None] | None = None
        self.response: Response | None = None
        self.headers: RawHeaders = []
        self.informational = False  # a 1xx head is being read: the answer follows it
        self.overran = False
        # Bytes fed to the parser since it last gave anything (a head, body bytes, the
        # end): at most MAX_HEAD_BYTES, so no head, trailer or framing grows without end.
        self.unread = 0
        self.keep_alive = True
        self.paused = False
        self.idle_since = 0.0

    # -- the exchange ----------------------------------------------------------------------

    def send(self, head: bytes, body: bytes, waiter: Waiter) -> None:
        """Write a request; `waiter` gets its answer's head."""
        assert self.transport is not None
        self.head = waiter
        self.response, self.headers, self.unread = None, [], 0
        if len(body) <= SMALL_BODY:
            self.transport.write(head + body)  # one write, one segment
        else:
            self.transport.writelines((head, body))  # no copy of a large body

    def late(self, timeout: float) -> None:
        """The answer's head is due and has not come: the request fails, the connection
        closes with it."""
        if self.head is not None and not self.head.done():
            self._broken(UpstreamFault("timeout", f"no answer within {timeout:g}s"))
            self.close()

    def release(self, clean: bool) -> None:
        """The reader is done with the answer; pooled if it ended cleanly."""
        self.response, self.notify = None, None
        if self.paused:
            self.resume()
        if clean and self.keep_alive and not self.overran:
            self.pool._idle_again(self)
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    # -- asyncio ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # idle in the pool, or its answer read: nothing may come now
            self.overran = True
            self.close()
            return
        self.unread += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response = self.response
            if response is not None and response._done:
                self.overran = True  # not HTTP, past the answer's end
            else:
                self._broken(UpstreamFault("invalid", f"no HTTP answer ({exc})"))
        if self.unread > MAX_HEAD_BYTES and not self.overran:
            # A head, a trailer or a chunk's framing that does not end: the parser would
            # hold it all. Bounded as an answer's head is (h11: 16 KiB, nginx: 4-8 KiB).
            what = "head" if self.response is None else "framing"
            self._broken(UpstreamFault("invalid", f"an answer {what} over {MAX_HEAD_BYTES} bytes"))
            self.close()
            return
        if self.overran or (not self.keep_alive and self.response is None):
            self.close()
        if self.notify is not None:
            self.notify()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool._gone(self)
        response = self.response
        if response is not None and not response._done and self._until_close(response):
            response._end()  # an answer framed by the connection's end: this is its end
            self.keep_alive = False
        reason = f"connection lost ({exc})" if exc else "connection lost"
        self._broken(UpstreamFault("reset", reason))
        if self.notify is not None:
            self.notify()

    def _broken(self, fault: UpstreamFault) -> None:
        self.keep_alive = False
        if self.head is not None and not self.head.done():
            self.head.set_exception(fault)
        elif self.response is not None:
            self.response._fail(fault)

    def _until_close(self, response: Response) -> bool:
        return response.header(b"content-length") is None and not any(
            name == b"transfer-encoding" for name, _ in response.headers
        )

    # -- httptools -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.response is not None and self.response._done:
            self.overran = True  # a second answer behind the first

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is None:  # a trailer field never joins the answer's head
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.unread = 0
        if self.overran:
            return
        status = self.parser.get_status_code()
        if status < 200:
            self.informational, self.headers = True, []
            return
        self.keep_alive = self.parser.should_keep_alive()
        head = self.head
        self.response = Response(self, status, self.headers)
        if head is not None and not head.done():
            head.set_result(self.response)

    def on_body(self, body: bytes) -> None:
        self.unread = 0
        if self.response is not None and not self.overran:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        self.unread = 0
        if self.informational:
            self.informational = False
            return
        if self.response is not None and not self.overran:
            self.response._end()


class Client:
    """The pools of every upstream's connections; one per hub process, closed with it."""

    def __init__(
        self,
        *,
        max_connections: int = 1024,
        max_idle: int = 64,
        idle_expiry: float = 1.0,
        tick: float = 1.0,
    ) -> None:
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.idle_expiry = idle_expiry
        # Deadlines: what is due when, looked over every `tick` seconds while any is
        # pending (one timer for all, not one armed and cancelled per request).
        self.tick = tick
        self._due: dict[Late, tuple[float, float]] = {}  # what → (when, its timeout)
        self._ticking: asyncio.TimerHandle | None = None
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._open: set[_Connection] = set()
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the one its connections run on

    async def post(self, origin: Origin, head: bytes, body: bytes, timeout: float) -> Response:
        """Send one request; its answer once the head has come, within `timeout` seconds
        for a free connection, the connection and the head together."""
        # The loop kept, not asked for: CPython 3.11 asks the kernel for its pid each time.
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + timeout
        connection = self._take_idle(origin, now)
        if connection is None:
            connection = await self._connect(origin, deadline, timeout)
        answer: asyncio.Future[Response] = loop.create_future()
        connection.send(head, body, answer)
        self.due(connection, deadline, timeout)
        try:
            return await answer
        except asyncio.CancelledError:
            connection.close()  # the request goes with it: the upstream learns to stop
            raise
        finally:
            self.undue(connection)

    def due(self, what: Late, when: float, timeout: float) -> None:
        """Call `what.late(timeout)` at loop time `when` (within a tick after it), unless
        `undue(what)` comes first."""
        self._due[what] = (when, timeout)
        if self._ticking is None:
            assert self._loop is not None
            self._ticking = self._loop.call_later(self.tick, self._check)

    def undue(self, what: Late) -> None:
        self._due.pop(what, None)

    def _check(self) -> None:
        self._ticking = None
        assert self._loop is not None
        now = self._loop.time()
        overdue = [(what, timeout) for what, (when, timeout) in self._due.items() if when <= now]
        for what, _ in overdue:
            del self._due[what]
        if self._due:  # armed again first: what `late` does cannot stop the others' ticks
            self._ticking = self._loop.call_later(self.tick, self._check)
        for what, timeout in overdue:
            what.late(timeout)

    def idle(self, origin: Origin) -> _Connection | None:
        """A pooled connection to `origin` to send on now, or None (then `post`)."""
        loop = self._loop
        return None if loop is None else self._take_idle(origin, loop.time())

    async def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        if self._sweep is not None:
            self._sweep.cancel()
        if self._ticking is not None:
            self._ticking.cancel()

    # -- the pool --------------------------------------------------------------------------

    def _take_idle(self, origin: Origin, now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            transport = connection.transport
            fresh = now - connection.idle_since < self.idle_expiry
            if fresh and transport is not None and not transport.is_closing():
                return connection
            connection.close()  # too old (then so are the rest, closed in turn), or closing
        return None

    async def _connect(self, origin: Origin, deadline: float, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        self._loop = loop
        while len(self._open) >= self.max_connections:
            if not self._close_an_idle():
                waiter = loop.create_future()
                self._waiting.append(waiter)
                try:
                    async with asyncio.timeout_at(deadline):
                        await waiter
                except TimeoutError:
                    raise UpstreamFault("timeout", "every upstream connection is busy") from None
                finally:
                    if waiter in self._waiting:
                        self._waiting.remove(waiter)
            reused = self._take_idle(origin, loop.time())
            if reused is not None:
                return reused
        connection = _Connection(self, origin, loop)
        self._open.add(connection)
        try:
            async with asyncio.timeout_at(deadline):
                # uvloop may call `connection_made` only after this returns.
                connection.transport, _ = await loop.create_connection(
                    lambda: connection,
                    origin.host,
                    origin.port,
                    ssl=self._tls_context() if origin.tls else None,
                    server_hostname=origin.host if origin.tls else None,
                )
        except TimeoutError:
            self._gone(connection)
            raise UpstreamFault("timeout", f"no connection within {timeout:g}s") from None
        except OSError as exc:
            self._gone(connection)
            raise UpstreamFault("refused", f"cannot connect ({exc.strerror or exc})") from None
        except BaseException:
            self._gone(connection)
            connection.close()
            raise
        return connection

    def _idle_again(self, connection: _Connection) -> None:
        connection.head = None
        if connection not in self._open or self._idle_count >= self.max_idle:
            connection.close()
            return
        loop = connection.loop
        connection.idle_since = loop.time()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._idle_count += 1
        if self._waiting:
            self._wake_one()
        if self._sweep is None:
            self._sweep = loop.call_later(self.idle_expiry, self._expire)

    def _gone(self, connection: _Connection) -> None:
        if connection not in self._open:
            return
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
            self._idle_count -= 1
        self._wake_one()

    def _close_an_idle(self) -> bool:
        """Make room for a connection to another origin: close the longest idle."""
        oldest = min(
            (idle[0] for idle in self._idle.values() if idle),
            key=lambda c: c.idle_since,
            default=None,
        )
        if oldest is None:
            return False
        self._idle[oldest.origin].remove(oldest)
        self._idle_count -= 1
        self._open.discard(oldest)
        oldest.close()
        return True

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _expire(self) -> None:
        self._sweep = None
        loop = self._loop
        assert loop is not None  # armed by a connection going idle
        oldest_kept = loop.time() - self.idle_expiry
        for idle in self._idle.values():
            while idle and idle[0].idle_since <= oldest_kept:
                idle.pop(0).close()
                self._idle_count -= 1
        if self._idle_count:
            self._sweep = loop.call_later(self.idle_expiry, self._expire)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
