"""Every private part of uvicorn the hub relies on, and nothing else, in one place.

The hub's connections (hub/http/connection.py) do four things uvicorn has no public API
for: write a whole response or a chunk of a streaming one without the ASGI `send`
coroutine, answer a whole request without uvicorn's parser or an ASGI task, hand the
connection over to a stream of its own (hub/push/detached.py), and replace the keep-alive
timer with a header deadline. Each needs uvicorn's httptools protocol and
its per-request `RequestResponseCycle` from the inside. This module is the only one
that touches them: `Protocol` turns uvicorn's private methods into named seams, and
the functions below read and change a cycle exactly as uvicorn's own `send` would.
`tests/test_uvicorn_internals.py` pins every attribute and method used here against
the installed uvicorn, so an upgrade that changes one fails there, by name, rather
than somewhere in a stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httptools
from starlette.types import Scope
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from hub.http import head_limits
from hub.http.framing import (
    REFUSAL_HEADERS,
    STATUS_LINE,
    HeaderBlock,
    chunk,
    whole_response,
)
from hub.http.head_limits import HeadRefused
from hub.rpc.routing_headers import head_lines
from hub.settings import HeadLimits

Cycle = RequestResponseCycle
RawHeaders = list[tuple[bytes, bytes]]

# What this module reads or writes, for the contract test.
CYCLE_ATTRIBUTES = (
    "scope",
    "transport",
    "flow",
    "default_headers",
    "message_event",
    "on_response",
    "disconnected",
    "keep_alive",
    "waiting_for_100_continue",
    "more_body",
    "response_started",
    "response_complete",
    "chunked_encoding",
)
PROTOCOL_ATTRIBUTES = (
    "cycle",
    "pipeline",
    "connections",
    "server_state",
    "transport",
    "flow",
    "loop",
    "logger",
    "scope",
    "app",
    "limit_concurrency",
    "tasks",
)
PROTOCOL_METHODS = (
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "connection_made",
    "connection_lost",
    "_start_asgi_task",
    "_unset_keepalive_if_required",
    "_should_upgrade",
    "handle_websocket_upgrade",
    "_unsupported_upgrade_warning",
    "shutdown",
)
# After refusing a head, the connection reads and drops what the client still sends, so
# that the client reads the refusal rather than a reset, for this long and this much.
LINGER_S = 1.0
LINGER_BYTES = 1 << 20


# -- one request's cycle -----------------------------------------------------------------


def scope_of(cycle: Cycle) -> Scope:
    return cycle.scope  # type: ignore[return-value]


def body_complete(cycle: Cycle) -> bool:
    """True once the whole request body is here: reading it cannot stall."""
    return not cycle.more_body


def can_respond(cycle: Cycle) -> bool:
    """True while `respond` may write: nothing sent yet, the client there, the socket
    buffer below its high-water mark."""
    return not (cycle.response_started or cycle.disconnected or cycle.flow.write_paused)


def respond(cycle: Cycle, status: int, headers: RawHeaders, body: bytes) -> None:
    """A whole response in one write, leaving the cycle as uvicorn's `send` leaves it
    after `http.response.start` and a final `http.response.body`; only if `can_respond`."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    head_only = cycle.scope["method"] == "HEAD"
    data, cycle.keep_alive = whole_response(
        HeaderBlock(cycle.default_headers),
        status,
        HeaderBlock(headers),
        body,
        cycle.keep_alive,
        head_only,
    )
    cycle.transport.write(data)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def _remote(name: object) -> tuple[str, int] | None:
    """A peer's socket name as uvicorn's `get_remote_addr` gives it from the socket: host
    and port of an IP socket (IPv6's four parts cut to two), nothing for a Unix one."""
    if isinstance(name, tuple | list) and len(name) >= 2:
        return (str(name[0]), int(name[1]))
    return None


def _local(name: object) -> tuple[str, int | None] | None:
    """The server's own name as `get_local_addr` gives it: as `_remote`, or a Unix
    socket's path with no port."""
    return (name, None) if isinstance(name, str) else _remote(name)


def chunk_writable(cycle: Cycle) -> bool:
    """True while a chunk of a streaming body may be written straight out: the response
    started chunked, is not finished, the client is there and the socket takes more."""
    return (
        cycle.chunked_encoding is True
        and not cycle.response_complete
        and not cycle.disconnected
        and not cycle.flow.write_paused
    )


def write_chunk(cycle: Cycle, data: bytes) -> None:
    """One HTTP/1.1 chunk; only if `chunk_writable`."""
    cycle.transport.write(chunk(data))


def write_chunks(cycle: Cycle, data: bytes) -> None:
    """Bytes framed as HTTP/1.1 chunks already; only if `chunk_writable`."""
    cycle.transport.write(data)


def finished(cycle: Cycle) -> bool:
    return bool(cycle.response_complete or cycle.disconnected)


def abort(cycle: Cycle) -> None:
    """Drop the connection now, unsent bytes and all."""
    cycle.transport.abort()


# -- the connection ----------------------------------------------------------------------


class LazyFlowControl(FlowControl):
    """uvicorn's flow control (its source pinned by the contract test) with its event
    made only when a write pauses: most connections never pause, and uvicorn's makes one
    `asyncio.Event` per connection, for nothing in a storm of listen streams."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Event | None = None  # made when a write first pauses

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable.wait()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            if self._writable is None:
                self._writable = asyncio.Event()
            self._writable.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            if self._writable is not None:
                self._writable.set()


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with named seams for a subclass to fill in.

    - `answer_whole(data)`: a read that arrived while no request is under way (none
      being read, answered or pipelined) and the socket takes writes; True if it
      answered the read as one whole request (with `respond_at_rest`), so uvicorn's
      parser never sees it; False hands it to the parser as usual.
    - `request_begun()`, `head_complete()`: around a request head uvicorn reads.
    - `idle()`: a response finished and nothing is pipelined behind it, where uvicorn
      would arm its keep-alive timer (which this protocol never arms).
    - `connected()`, `disconnected()`: the connection's two ends.

    It also bounds what a request head may cost before anything reads it
    (hub/http/head_limits.py, `head_limits`): the head's bytes are counted as they arrive and
    the parser is never fed past `head_limits.head` of them; the target, each field and
    the number of fields are judged once the parser has the whole head. A head over a
    limit gets 414 or 431 and the connection closes (after reading, for a moment, what
    the client still sends, so the client sees the answer). Trailer fields of a chunked
    body never join the request's headers: the head that was checked is the head the app
    sees, and what a request sends after its head is bounded too (`head_limits.rest`): the
    connection is dropped past it.
    """

    head_limits = HeadLimits()  # a subclass sets the server's own
    # What uvicorn's `__init__` looks up anew for every connection and is the same for
    # all of a server's: its loop (`get_event_loop`, a getpid each time on CPython 3.11),
    # its two loggers (the logging module's lock each) and whether access is logged.
    _per_server: tuple[Any, ...] | None = None

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # uvicorn's `__init__` (pinned by the contract test), the per-server part once.
        shared = self._per_server
        if shared is None or shared[0] is not config:
            if not config.loaded:
                config.load()
            loop = _loop or asyncio.get_event_loop()
            access_logger = logging.getLogger("uvicorn.access")
            error_logger = logging.getLogger("uvicorn.error")
            shared = (config, loop, error_logger, access_logger, access_logger.hasHandlers())
            type(self)._per_server = shared
        _, self.loop, self.logger, self.access_logger, self.access_log = shared
        self.config = config
        self.app = config.loaded_app
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.ws_protocol_class = config.ws_protocol_class
        self.root_path = config.root_path
        self.asgi_version = config.asgi_version
        self.limit_concurrency = config.limit_concurrency
        self.app_state = app_state
        self.timeout_keep_alive_task = None
        self.timeout_keep_alive = config.timeout_keep_alive
        self.server_state = server_state
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.transport = None  # type: ignore[assignment]
        self.flow = None  # type: ignore[assignment]
        self.server = None
        self.client = None
        self.scheme = None
        self.pipeline = deque()
        self.scope = None  # type: ignore[assignment]
        self.headers = None  # type: ignore[assignment]
        self.expect_100_continue = False
        self.cycle = None  # type: ignore[assignment]
        # The hub's own.
        self.extensions: dict[str, object] = {}  # put in every request's scope
        self._in_message = False  # the parser is inside a request
        self._defaults = HeaderBlock([])  # server_state.default_headers, encoded
        self._headers = HeaderBlock([])  # the last response's own headers, encoded
        self._head_done = False  # the current request's head is read (its body may follow)
        self._heads = 0  # heads read on this connection
        self._head_left = self.head_limits.head  # bytes the head being read may still take
        self._rest_left = self.head_limits.rest  # bytes its request may still send after it
        self._refusal: HeadRefused | None = None  # why a parser callback stopped the head
        self._discarded = -1  # bytes dropped since a head was refused; -1: none was
        # While a request taken by `answer_whole` is answered by a coroutine of its own
        # (`begin_in_place`): what the client sends meanwhile, read once it is answered.
        self._held: list[bytes] | None = None
        self._last = False  # shutting down: the in-place answer is the connection's last

    # seams --------------------------------------------------------------------------

    def answer_whole(self, data: bytes) -> bool:
        return False

    def request_begun(self) -> None:
        pass

    def head_complete(self) -> None:
        pass

    def idle(self) -> None:
        pass

    def connected(self) -> None:
        pass

    def disconnected(self) -> None:
        pass

    # what a subclass may ask or do --------------------------------------------------

    @property
    def current_cycle(self) -> Cycle | None:
        """The cycle of the request being read or answered (None before the first)."""
        return self.cycle

    def close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def connected_protocols(self) -> set[Any]:
        """Every open connection of this server (uvicorn's own set)."""
        return self.connections

    def over_concurrency_limit(self) -> bool:
        """Where uvicorn would answer the next request with its 503 stand-in."""
        limit = self.limit_concurrency
        return limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)

    def respond_at_rest(self, status: int, headers: RawHeaders, body: bytes) -> None:
        """A whole response to a request `answer_whole` took, finished as uvicorn
        finishes one: counted, and the connection idle (or closed, if the headers say
        so). A header list is never changed once given here: the same list again is
        not encoded again."""
        # uvicorn renews its default headers each second; most replies share one list.
        defaults = self._defaults = HeaderBlock.of(
            self.server_state.default_headers, self._defaults
        )
        block = self._headers = HeaderBlock.of(headers, self._headers)
        data, keep_alive = whole_response(defaults, status, block, body, keep_alive=True)
        self.transport.write(data)
        self.server_state.total_requests += 1
        if keep_alive:
            self.idle()
        else:
            self.transport.close()

    def begin_in_place(self) -> None:
        """A request `answer_whole` took is answered by a coroutine (a forward) that
        writes with `response_head` and the socket itself: until `end_in_place`, what
        the client sends is held (up to one head's worth, then reading pauses)."""
        self._held = []

    @property
    def in_place(self) -> bool:
        return self._held is not None

    def response_head(self, status: int, headers: RawHeaders, framing: bytes) -> bytes:
        """A response's head as `respond_at_rest` frames it; `framing` is its
        `transfer-encoding` line, or empty when `headers` hold its `content-length`.
        `headers` never say `connection: close` (a forward's are end-to-end only)."""
        return self.response_head_of(status, head_lines(headers) + framing)

    def response_head_of(self, status: int, lines: bytes) -> bytes:
        """`response_head` for header `lines` encoded already, each ending in CRLF."""
        defaults = self._defaults = HeaderBlock.of(
            self.server_state.default_headers, self._defaults
        )
        return b"".join((STATUS_LINE[status], defaults.lines, lines, b"\r\n"))

    def write_paused(self) -> bool:
        return bool(self.flow.write_paused)

    async def drain(self) -> None:
        """Returns once the socket takes writes again."""
        await self.flow.drain()

    def end_in_place(self, complete: bool) -> None:
        """The in-place answer is done: counted, then the connection reads on (what the
        client sent meanwhile first), or closes if the answer was cut short."""
        held, self._held = self._held or [], None
        self.server_state.total_requests += 1
        if not complete or self._last:
            self.close()
            return
        self.flow.resume_reading()
        if held:
            self.data_received(b"".join(held))
        else:
            self.idle()

    # uvicorn's methods, with the seams in place -------------------------------------

    def shutdown(self) -> None:
        """uvicorn's, which would close a connection whose in-place answer is still
        under way: it ends once that answer is written."""
        if self._held is not None:
            self._last = True
            return
        super().shutdown()

    def connection_made(self, transport: Any) -> None:
        """uvicorn's, with the two addresses read from the transport's names: uvicorn
        asks for its "socket", for which uvloop makes a socket object on every
        connection, a visible part of what a listen stream opened in one read costs."""
        self.connections.add(self)
        self.transport = transport
        self.flow = LazyFlowControl(transport)
        self.server = _local(transport.get_extra_info("sockname"))
        self.client = _remote(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            prefix = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made", prefix)
        self.connected()

    def data_received(self, data: bytes) -> None:
        held = self._held
        if held is not None:  # an in-place answer is under way: this waits for it
            held.append(data)
            if sum(map(len, held)) > self.head_limits.head:
                self.flow.pause_reading()
            return
        if self._discarded >= 0:  # refused: read and drop until the linger ends
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES:
                self.transport.abort()
            return
        cycle = self.cycle
        if (
            not self._in_message
            and (cycle is None or cycle.response_complete)
            and not self.pipeline
            and not self.flow.write_paused
            and not self.transport.is_closing()
            and self.answer_whole(data)
        ):
            return
        # After the head: counted against what a request may send after it. A head
        # pipelined behind a body in the same read is bounded by that read; its later
        # reads are counted as a head's.
        if self._head_done:
            self._rest_left -= len(data)
            if self._rest_left < 0:
                self.transport.abort()  # far more than any body the hub reads
                return
            self._feed(data)
            return
        left = self._head_left
        if len(data) <= left:
            self._head_left = left - len(data)
            self._feed(data)
            return
        # The head would pass its limit within this read, unless it ends first.
        heads = self._heads
        if left:
            self._feed(memoryview(data)[:left])
        if self._discarded >= 0 or self.parser is None:
            return
        if self._heads == heads:
            self._refuse(head_limits.head_too_large(self.head_limits))
            return
        self._rest_left -= len(data) - left
        self._feed(memoryview(data)[left:])

    def _feed(self, data: bytes | memoryview) -> None:
        """uvicorn's `data_received` (the source it repeats is pinned by the contract
        test), with a head refused by a limit answered as such."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(self._refusal)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _refuse(self, refusal: HeadRefused) -> None:
        """Answer a head over a limit, close, and read no further request."""
        self._discarded = 0
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # An answer to an earlier request is under way: it is the last one.
            cycle.keep_alive = False
            self.flow.pause_reading()
            return
        data, _ = whole_response(
            HeaderBlock(self.server_state.default_headers),
            refusal.status,
            REFUSAL_HEADERS,
            refusal.message.encode("ascii"),
            keep_alive=False,
        )
        self.transport.write(data)
        self.loop.call_later(LINGER_S, self.transport.abort)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        self.scope["extensions"] = self.extensions  # type: ignore[typeddict-item]
        self.request_begun()

    def on_headers_complete(self) -> None:
        # The head's bytes were counted as they came; its parts are judged here, once,
        # before uvicorn makes a request of them (it is all in memory by now, bounded).
        refusal = head_limits.judge(self.head_limits, self.url, self.headers)
        if refusal is not None:
            self._refusal = refusal  # the parser stops with a callback error: `_feed` answers
            raise refusal
        self._head_done = True
        self._heads += 1
        self._rest_left = self.head_limits.rest
        self.head_complete()
        super().on_headers_complete()
        # Trailer fields of a chunked body are reported like header fields, and uvicorn
        # appends them to this same list, the request's `scope["headers"]`: from here on
        # they go to a list no one reads.
        self.headers = []

    def on_message_complete(self) -> None:
        self._in_message = False
        self._head_done = False
        self._head_left = self.head_limits.head  # the next head starts after this message
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's own, with `idle()` in place of arming the keep-alive timer.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.idle()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.disconnected()
