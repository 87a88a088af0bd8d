"""A forward answered on callbacks alone: the front door's common case, with no task.

A request that came whole in one read (hub/http/connection.py `InPlaceCycle`) goes out on an
idle pooled connection from that read, and an answer that is whole JSON when its head has
come goes to the client from the read that completed it: no task, no future, no ASGI
messages. Whatever else happens goes on as `Upstream.forward` does, in a task taking over
from where this left it: no idle connection (`forward` makes one), an SSE answer, one
still coming or in a content coding, one that may carry a task to record, one larger than
a write slice. The checks, faults, budget and caller's slot are `Upstream`'s own.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Send

from hub.front_door.forwarding import AnswerHead
from hub.front_door.upstream import (
    SEND_SLICE,
    Record,
    Upstream,
    UpstreamError,
    WholeAnswer,
    error_answer,
)
from hub.front_door.upstream_http import Response, UpstreamFault
from hub.http.cors import adding_headers
from hub.rpc import jsonrpc
from hub.rpc.routing_headers import head_lines

if TYPE_CHECKING:
    from hub.front_door.upstream_http import _Connection

RawHeaders = list[tuple[bytes, bytes]]


class Out(Protocol):
    """Where an answer in place goes (hub/http/connection.py `InPlaceCycle`)."""

    gone: Callable[[], None] | None  # called if the client leaves before the answer

    @property
    def send(self) -> Send:
        """ASGI's `send`, for the task that `run` starts."""

    def write_whole(self, status: int, lines: bytes, body: bytes) -> None:
        """The whole answer in one write, its header `lines` encoded; answered."""

    def run(self, answer: Coroutine[Any, Any, None]) -> None:
        """The rest of the answer as a task."""


class Counted(Protocol):
    """What counts a forward's outcome (hub/front_door/forward_call.py `Forwarding`)."""

    def tally(self, outcome: str) -> None: ...

    def counted(self, answer: Coroutine[Any, Any, str]) -> Coroutine[Any, Any, None]: ...


def start(
    upstream: Upstream,
    out: Out,
    body: bytes,
    request_id: jsonrpc.RequestId | None,
    lines: bytes,
    caller: str,
    record: Record | None,
    extra: RawHeaders,
    counted: Counted,
) -> bool:
    """Send the request on an idle connection and answer it on callbacks; False (nothing
    done) when there is no idle connection."""
    pool = upstream.pool
    refusal = pool.admit(caller)
    if refusal is not None:
        _write(out, error_answer(request_id, refusal), extra)
        counted.tally("limited")
        return True
    connection = pool.client.idle(upstream.origin)
    if connection is None:
        pool.release(caller)
        return False
    exchange = _Exchange(upstream, out, connection, request_id, caller, record, extra, counted)
    connection.send(upstream.origin.head(lines, len(body)), body, exchange)
    connection.notify = exchange.update
    pool.client.due(exchange, connection.loop.time() + pool.timeout, pool.timeout)
    out.gone = exchange.gone
    return True


class _Exchange:
    """One request on callbacks: the waiter of its answer's head, told after each read."""

    __slots__ = (
        "caller",
        "connection",
        "counted",
        "ended",
        "extra",
        "head",
        "out",
        "record",
        "request_id",
        "response",
        "upstream",
        "waiting",
    )

    def __init__(
        self,
        upstream: Upstream,
        out: Out,
        connection: _Connection,
        request_id: jsonrpc.RequestId | None,
        caller: str,
        record: Record | None,
        extra: RawHeaders,
        counted: Counted,
    ) -> None:
        self.upstream = upstream
        self.out = out
        self.connection = connection
        self.request_id = request_id
        self.caller = caller
        self.record = record
        self.extra = extra
        self.counted = counted
        self.response: Response | None = None
        self.head: AnswerHead | None = None  # what the answer's head comes to
        self.ended = False  # answered, handed to a task, or the client left
        self.waiting = False  # for the rest of the body, after the head

    # -- the connection's waiter ---------------------------------------------------------

    def done(self) -> bool:
        return self.ended or self.response is not None

    def set_result(self, response: Response) -> None:
        """The head has come (its body may follow in the same read: see `update`)."""
        self.response = response
        self.head = self.upstream.pool.answer_heads.of(response.headers)
        self.upstream.healthy()

    def set_exception(self, fault: BaseException) -> None:
        """No answer: the client gets the fault, as `Upstream.forward` answers it."""
        assert isinstance(fault, UpstreamFault)
        self._end()
        self._fail(self.upstream.fault(fault))

    # -- after each read -----------------------------------------------------------------

    def update(self) -> None:
        response = self.response
        if response is None or self.ended:
            return
        head = self.head
        assert head is not None  # it came with the response
        if not head.stream and response.arriving(SEND_SLICE):
            if not self.waiting:  # the rest within the deadline anew, as `Upstream` reads it
                self.waiting = True
                pool = self.upstream.pool
                pool.client.due(self, self.connection.loop.time() + pool.timeout, pool.timeout)
            return
        self._end()
        upstream = self.upstream
        content = None
        if not head.stream and not head.coded:
            try:
                content = upstream.body_now(response)
            except UpstreamError as exc:
                response.close()
                self._fail(exc)
                return
        if content is None or len(content) > SEND_SLICE or self._to_record(content):
            self._hand_over(response, content)
            return
        refusal = upstream.refusal(response, content)
        upstream.pool.buffer.give(len(content))
        response.close()  # pooled before the client's next request may want it
        if refusal is not None:
            self._fail(refusal)
            return
        upstream.pool.release(self.caller)
        self.counted.tally("ok")
        lines = head.lines + b"content-length: %d\r\n" % len(content)
        if self.extra:
            lines += head_lines(self.extra)
        self.out.write_whole(response.status, lines, content)

    def gone(self) -> None:
        """The client left before its answer: the request goes with it."""
        self._end()
        if self.response is not None:
            self.response.close()  # not read to its end: closed
        self.connection.close()  # how the upstream learns to stop
        self.upstream.pool.release(self.caller)
        self.counted.tally("client_gone")

    def late(self, timeout: float) -> None:
        """The deadline passed: for the head (the connection fails the request), or for
        the rest of the body."""
        if self.ended:
            return
        if self.response is None:
            self.connection.late(timeout)
            return
        self._end()
        self.response.close()
        self._fail(self.upstream.failed(504, "timeout", f"answer not complete within {timeout:g}s"))

    def _end(self) -> None:  # then the answer is written or run, which clears `out.gone`
        self.ended = True
        self.connection.notify = None
        self.upstream.pool.client.undue(self)

    def _to_record(self, content: bytes) -> bool:
        return self.record is not None and b'"task"' in content

    def _hand_over(self, response: Response, content: bytes | None) -> None:
        send = adding_headers(self.out.send, self.extra)
        answer = self.upstream.answer(
            response, send, self.request_id, self.record, self.caller, content
        )
        self.out.run(self.counted.counted(answer))

    def _fail(self, error: UpstreamError) -> None:
        self.upstream.pool.release(self.caller)
        self.counted.tally(error.fault)
        rpc_error = error.rpc_error(self.upstream.spec.label)
        _write(self.out, error_answer(self.request_id, rpc_error), self.extra)


def _write(out: Out, answer: WholeAnswer, extra: RawHeaders) -> None:
    out.write_whole(answer.status, head_lines(answer.headers + extra), answer.body)
