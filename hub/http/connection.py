"""The hub's HTTP connections: uvicorn's httptools protocol plus what the hub needs.

Limits. A request head larger than `--max-head-bytes` (or with a target, a field or
more fields than their limits allow) is refused with 414 or 431 before anything reads
it, whichever path reads it (hub/http/head_limits.py).

Deadlines. uvicorn's only timer is the keep-alive one, armed after a response and
cancelled by the first byte that arrives, so a client that trickles its headers one
byte at a time would keep the connection forever. Here a connection owes a complete
request head within `--header-timeout` of being opened or of its previous response
(which also bounds an idle keep-alive). One sweep per server, every quarter deadline
and at least once a second, closes the overdue, instead of two timers armed and
cancelled per request. Bodies get their own deadline where they are read
(hub/mcp/endpoint.py).

Direct writes. ASGI's `send` is a coroutine, and uvicorn writes a response's head and
body in two system calls; pushing a frame through it costs a task wake-up per stream
and frame, which with thousands of streams following one task is most of the hub's
CPU. Each request's scope carries this connection's `Connection` under
`extensions["taskhub.connection"]`: `respond` writes a whole small response in one
call, and `channel` opens a `DirectChannel` through which the fan-out writes chunks of
a streaming body straight to the socket while the socket takes them, and which learns
at once when the connection is lost. A stream whose socket buffer is full goes back to
awaiting `send`, which waits for the drain. Under another ASGI server the extension
is absent and everything takes the ordinary path.

Answers in place. `hub_protocol` is given the app's `answer_now` hook explicitly (not
looked up on whatever uvicorn wrapped the app in). A read that holds exactly one plain
`POST` request (hub/http/whole_post.py) and arrives while the connection is at rest goes to
it first: when the answer needs no I/O (a cached `tasks/get`, `server/discover`, every
refusal) the connection writes it at once, without uvicorn's parser, scope, request
cycle or an ASGI task; a forward runs on the connection (`InPlaceCycle`), on callbacks or
as one task; otherwise the read goes to uvicorn as if nothing had looked.

Everything uvicorn-private lives in hub/http/uvicorn_internals.py; this module only uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, cast

import msgspec
from starlette.types import Message, Scope

from hub.http import uvicorn_internals as uv
from hub.http import whole_post
from hub.http.framing import LAST_CHUNK, chunk
from hub.http.uvicorn_internals import Cycle, RawHeaders
from hub.settings import HeadLimits

CONNECTION = "taskhub.connection"


class Channel(Protocol):
    """Where a stream's chunks go when they can go straight out (only while `writable`).

    `express`: `writable` turns False only through calls that tell the stream first
    (`Subscriber.leave_lane`), so the stream may ride an express lane (hub/push/followers.py)."""

    express: bool

    @property
    def writable(self) -> bool: ...

    def write(self, data: bytes) -> None:
        """`data` as one HTTP/1.1 chunk."""

    def write_chunks(self, data: bytes) -> None:
        """`data` as it is: bytes already framed as chunks (the fan-out's usual write)."""

    def abort(self) -> None: ...


class Detachable(Protocol):
    """An answer that takes the connection over: a listen stream that runs on the
    transport by itself (hub/push/detached.py), with no request cycle or task."""

    def run_on(
        self,
        transport: asyncio.Transport,
        default_headers: RawHeaders,
        loop: asyncio.AbstractEventLoop,
    ) -> None: ...


class InPlace(Protocol):
    """An answer that needs I/O (a forward, hub/front_door/forward_call.py), run by the
    connection: on callbacks (`InPlaceCycle.write_whole`) or as one task (`run`), with no
    uvicorn cycle, scope or ASGI task. The connection tells it when the client leaves."""

    def start_in_place(self, cycle: InPlaceCycle) -> None: ...


class WholeResponse(msgspec.Struct, frozen=True, gc=False):
    """A response to write at once (a Struct: one is built for every request)."""

    status: int
    body: bytes
    headers: RawHeaders


# The app's `answer_now(path, headers, body, scope)` for a whole POST: a response, a
# `Detachable`, an `InPlace`, or None to decline. `scope` holds the request's raw
# `headers`, `client` and `scheme`, as an ASGI scope would.
AnswerNow = Callable[
    [str, Mapping[str, str], bytes, Scope], "WholeResponse | Detachable | InPlace | None"
]


class InPlaceCycle:
    """One request answered by an `InPlace` on the connection. On callbacks, the answer
    calls `write_whole` once, or `run` to go on as a task; `gone`, while set, is called
    if the client leaves first (a task is cancelled instead). A task's `send` takes ASGI's
    response messages and writes them as uvicorn's would, a whole answer's head with its
    body in one write, a streaming one chunked; it waits for the drain when the socket's
    buffer is full. The head of a streaming answer goes out with its first chunk if that
    comes in the same turn of the loop, else alone right after."""

    __slots__ = ("_chunked", "_done", "_head", "_protocol", "gone", "task")

    def __init__(self, protocol: uv.Protocol, answer: InPlace) -> None:
        self._protocol = protocol
        self._head: bytes | None = None  # the head, until the first body bytes go with it
        self._chunked = False
        self._done = False  # the whole response is written
        self.task: asyncio.Task[None] | None = None
        self.gone: Callable[[], None] | None = None
        protocol.begin_in_place()
        answer.start_in_place(self)

    def write_whole(self, status: int, lines: bytes, body: bytes) -> None:
        """The whole answer in one write, its header `lines` (encoded, its length among
        them) after the server's own: answered."""
        protocol = self._protocol
        self.gone = None
        if not protocol.transport.is_closing():
            protocol.transport.write(protocol.response_head_of(status, lines) + body)
        self._done = True
        protocol.end_in_place(True)

    def run(self, answer: Coroutine[Any, Any, None]) -> None:
        """The rest of the answer as a task, writing through `send`."""
        self.gone = None
        self.task = self._protocol.loop.create_task(self._run(answer))

    def cancel(self) -> None:
        """The client left: the answer ends (done already, or cut short)."""
        if self.task is not None:
            self.task.cancel()
        elif self.gone is not None:
            gone, self.gone = self.gone, None
            gone()
            self._protocol.end_in_place(False)

    async def _run(self, answer: Coroutine[Any, Any, None]) -> None:
        try:
            await answer
        except asyncio.CancelledError:
            pass  # the client left (counted by the answer)
        except Exception:
            self._protocol.logger.exception("answering in place failed")
            if self._head is None and not self._done:
                self._protocol.transport.write(_INTERNAL_ERROR)  # then the connection closes
            self._done = False
        finally:
            self._protocol.end_in_place(self._done)

    async def send(self, message: Message) -> None:
        protocol = self._protocol
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            # A whole answer's head ends with its length (hub/front_door/upstream.py), or holds it.
            framed = bool(headers) and headers[-1][0] == b"content-length"
            framed = framed or any(name == b"content-length" for name, _ in headers)
            self._chunked = not framed
            framing = b"" if framed else b"transfer-encoding: chunked\r\n"
            self._head = protocol.response_head(message["status"], headers, framing)
            if self._chunked:
                protocol.loop.call_soon(self._flush_head)
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self._chunked:
            data = chunk(body) if body else b""
            if not more:
                data += LAST_CHUNK
        else:
            data = body
        if self._head is not None:
            data, self._head = self._head + data, None
        if data and not protocol.transport.is_closing():
            protocol.transport.write(data)
        if not more:
            self._done = True
        elif protocol.write_paused():
            await protocol.drain()

    def _flush_head(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._protocol.transport.is_closing():
            self._protocol.transport.write(head)


_INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class DirectChannel:
    """Chunks of one chunked response body, written without the ASGI `send` coroutine."""

    __slots__ = ("_cycle", "on_lost")
    express = False  # `writable` is read off uvicorn's state: nothing tells the stream

    def __init__(self, cycle: Cycle) -> None:
        self._cycle = cycle
        self.on_lost: Callable[[], None] | None = None  # called once the connection is gone

    @property
    def writable(self) -> bool:
        """True while a write goes straight out (see `uvicorn_internals.chunk_writable`)."""
        return uv.chunk_writable(self._cycle)

    @property
    def finished(self) -> bool:
        return uv.finished(self._cycle)

    def write(self, data: bytes) -> None:
        """One HTTP/1.1 chunk; only while `writable`."""
        uv.write_chunk(self._cycle, data)

    def write_chunks(self, data: bytes) -> None:
        """Bytes framed as chunks already; only while `writable`."""
        uv.write_chunks(self._cycle, data)

    def abort(self) -> None:
        """Drop the connection now (a client that stopped reading)."""
        uv.abort(self._cycle)

    def lost(self) -> None:
        if self.on_lost is not None:
            self.on_lost()


class Connection:
    """What a request's app may do with its connection beyond ASGI (see the module doc)."""

    __slots__ = ("_channels", "_protocol")

    def __init__(self, protocol: uv.Protocol) -> None:
        self._protocol = protocol
        self._channels: list[DirectChannel] = []

    def _cycle_of(self, scope: Scope) -> Cycle | None:
        cycle = self._protocol.current_cycle
        # A request pipelined behind this one has no cycle of its own yet: ASGI it is.
        return cycle if cycle is not None and uv.scope_of(cycle) is scope else None

    def respond(self, scope: Scope, status: int, headers: RawHeaders, body: bytes) -> bool:
        """The whole response in one write, as uvicorn's `send` would frame it; False
        (nothing written) when it must go through `send` instead."""
        cycle = self._cycle_of(scope)
        if cycle is None or not uv.can_respond(cycle):
            return False
        uv.respond(cycle, status, headers, body)
        return True

    def body_received(self, scope: Scope) -> bool:
        """True when the whole request body is already here: reading it cannot stall."""
        cycle = self._cycle_of(scope)
        return cycle is not None and uv.body_complete(cycle)

    def channel(self, scope: Scope) -> DirectChannel | None:
        """A direct channel for this request's streaming body, or None (use `send`)."""
        cycle = self._cycle_of(scope)
        if cycle is None:
            return None
        channel = DirectChannel(cycle)
        self._channels = [c for c in self._channels if not c.finished]
        self._channels.append(channel)
        return channel

    def lost(self) -> None:
        channels, self._channels = self._channels, []
        for channel in channels:
            channel.lost()


def connection_of(scope: Scope) -> Connection | None:
    connection = scope.get("extensions", {}).get(CONNECTION)
    return connection if isinstance(connection, Connection) else None


def hub_protocol(
    header_timeout: float,
    answer_now: AnswerNow | None = None,
    limits: HeadLimits | None = None,
) -> type[uv.Protocol]:
    """An httptools protocol with header deadlines and size limits (the defaults unless
    given), direct writes and, given the app's `answer_now`, answers in place."""
    period = min(1.0, header_timeout / 4)
    limits = limits or HeadLimits()
    heads = whole_post.Heads(limits)  # one per server: what its clients' heads parse to

    class HubProtocol(uv.Protocol):
        head_limits = limits  # type: ignore[assignment]
        # One sweep over this server's connections instead of two timers per request.
        _sweeper: asyncio.Task[None] | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Loop time since which the connection owes us a complete request head:
            # from the connection, or from the previous response (the idle keep-alive).
            self.waiting_since: float | None = None
            self._in_place: InPlaceCycle | None = None  # the last request answered in place
            self._connection = Connection(self)
            self.extensions[CONNECTION] = self._connection

        def answer_whole(self, data: bytes) -> bool:
            if answer_now is None:
                return False
            request = heads.parse(data)
            if request is None or self.over_concurrency_limit():
                return False
            head, body = request
            scope = {"client": self.client, "scheme": self.scheme, "headers": head.raw}
            try:
                reply = answer_now(head.path, head.headers, body, scope)
            except Exception:
                self.logger.exception("answering in place failed; the app answers instead")
                return False
            if reply is None:
                return False
            self.waiting_since = None  # the head is in: as `head_complete`
            if isinstance(reply, WholeResponse):
                self.respond_at_rest(reply.status, reply.headers, reply.body)
            elif hasattr(reply, "start_in_place"):  # not `isinstance`: a Protocol's is slow
                self._in_place = InPlaceCycle(self, cast(InPlace, reply))
            else:
                self.detach(reply)
            return True

        def detach(self, stream: Detachable) -> None:
            """Hand the connection to `stream` for good: out of uvicorn's connection set
            (as for its WebSocket upgrade), so neither the header deadline nor uvicorn's
            shutdown touches it; the stream closes it when it ends."""
            self.connected_protocols().discard(self)
            stream.run_on(self.transport, self.server_state.default_headers, self.loop)

        def connected(self) -> None:
            self.waiting_since = self.loop.time()
            cls = type(self)
            if cls._sweeper is None or cls._sweeper.done():
                cls._sweeper = self.loop.create_task(_sweep(self.connected_protocols()))

        def request_begun(self) -> None:
            if self.waiting_since is None:  # a head pipelined behind a complete one
                self.waiting_since = self.loop.time()

        def head_complete(self) -> None:
            self.waiting_since = None

        def idle(self) -> None:
            if self.waiting_since is None:
                self.waiting_since = self.loop.time()

        def disconnected(self) -> None:
            self.waiting_since = None
            self._connection.lost()
            if self._in_place is not None:
                self._in_place.cancel()  # done already, or the client left: it ends
                self._in_place = None

    async def _sweep(connections: set[Any]) -> None:
        """Close connections that owe a request head for longer than the deadline;
        ends with the last connection (the next one starts it again)."""
        loop = asyncio.get_running_loop()
        while connections:
            await asyncio.sleep(period)
            overdue = loop.time() - header_timeout
            for protocol in list(connections):
                since = getattr(protocol, "waiting_since", None)
                if since is not None and since <= overdue:
                    protocol.waiting_since = None
                    protocol.close()

    return HubProtocol
