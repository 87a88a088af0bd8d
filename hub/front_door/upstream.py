"""The hub as front door: every request it does not answer itself goes to an upstream MCP server.

An `Upstream` is one MCP endpoint (one server, or a load balancer over identical replicas)
reached through the hub's own pooled HTTP/1.1 client (hub/front_door/upstream_http.py). `forward`
sends the client's body and end-to-end headers unchanged and streams the reply back as it
arrives: an SSE reply chunk by chunk (a tool call's progress and `input_required` requests
reach the client as they are sent), a JSON reply whole once it has been read and checked.
A client that disconnects closes the upstream request, which is how the upstream learns to
cancel it.

What the client gets when the upstream fails (docs/front-door.md#upstream-errors): a JSON-RPC
error `-32603` naming the upstream and the fault, with HTTP 502 (refused, reset, an answer
that is no MCP response or runs past its own end), 503 (the hub holds as many answer bytes
as it may) or 504 (no answer within `--upstream-timeout`); never a hang. An SSE reply cut
off mid-stream ends with that error as its last event. Upstream health is passive: each
outcome moves `taskhub_upstream_up` and a change is logged once.

What one caller may take (docs/front-door.md#limits): at most `--max-forwards-per-caller`
requests in flight (429 past it), and all answers read whole, over every caller, at most
`--max-upstream-buffer-bytes` at once. A connection goes back to the pool only after an
answer read exactly to its end: one cut short, or followed by more bytes, is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import msgspec
from starlette.types import Receive, Send

from hub.front_door import forwarding
from hub.front_door.event_reader import EventReader, EventTooLarge, json_message
from hub.front_door.upstream_http import Origin, Response, UpstreamFault
from hub.front_door.upstream_pool import Pool
from hub.metrics import Metrics
from hub.rpc import jsonrpc
from hub.rpc.routing_headers import encode_headers, head_lines
from hub.settings import UpstreamSpec

log = logging.getLogger("taskhub.upstream")

RawHeaders = list[tuple[bytes, bytes]]
MAX_JSON_REPLY = 64 << 20  # bytes; a JSON answer larger than this is refused, not buffered
EVENT_STREAM = b"text/event-stream"
SEND_SLICE = 256 << 10  # a whole answer goes to the client in writes of this size
RECORDED_EVENT = 1 << 20  # an SSE event larger than this carries no task worth recording
Record = Callable[[bytes], Awaitable[None]]


class Answer(NamedTuple):
    """An upstream's answer the hub read whole: its status, its head as the client would
    get it, its JSON bytes, and the JSON-RPC message in them (None: no JSON-RPC body)."""

    status: int
    headers: RawHeaders
    body: bytes
    message: dict[str, Any] | None


class Declined(Exception):
    """The upstream answered a request the hub made for itself, but not as asked (an error,
    or JSON where a stream was wanted)."""

    def __init__(self, status: int, message: dict[str, Any] | None) -> None:
        super().__init__(f"answered HTTP {status}: {message}")
        self.status = status
        self.message = message


class UpstreamError(Exception):
    """The upstream gave no usable answer: the JSON-RPC error and HTTP status to send."""

    def __init__(self, status: int, fault: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.fault = fault  # refused | timeout | reset | invalid | status | overloaded

    def rpc_error(self, upstream: str) -> jsonrpc.RpcError:
        return jsonrpc.RpcError(
            jsonrpc.INTERNAL_ERROR,
            f"Upstream {upstream!r}: {self}",
            data={"upstream": upstream, "fault": self.fault},
            http_status=self.status,
            # The hub's own memory is full, not the upstream broken: try again shortly.
            headers={"Retry-After": "1"} if self.fault == "overloaded" else None,
        )


class Upstream:
    def __init__(self, spec: UpstreamSpec, pool: Pool, metrics: Metrics) -> None:
        self.spec = spec
        self.origin = Origin.of(spec.url)
        self.pool = pool
        self.metrics = metrics
        self.up: bool | None = None  # unknown until the first answer
        metrics.upstream_up.set(-1, spec.label)

    async def forward(
        self,
        send: Send,
        body: bytes,
        request_id: jsonrpc.RequestId | None,
        lines: bytes,
        caller: str,
        record: Record | None = None,
    ) -> str:
        """Send the request upstream and its answer to the client; returns the outcome label.

        Its header `lines` go upstream as they are (`forwarding.OutgoingHeads` made them);
        `request_id` (read by the hub while routing) is what a failed forward answers.
        `record` sees each JSON-RPC message of the answer that may carry a task (a JSON
        answer, or an SSE event, naming `"task"`) before the client does. Whoever runs it
        cancels it when the client leaves (`forward_until_gone`, or the connection that
        answers in place): the upstream's connection closes with it."""
        refusal = self.pool.admit(caller)
        if refusal is not None:
            await _send_whole(send, error_answer(request_id, refusal))
            return "limited"
        try:
            response = await self._send(body, lines)
        except UpstreamError as exc:
            self.pool.release(caller)
            await self._fail(send, request_id, exc)
            return exc.fault
        except BaseException:
            self.pool.release(caller)
            raise
        return await self.answer(response, send, request_id, record, caller)

    async def answer(
        self,
        response: Response,
        send: Send,
        request_id: jsonrpc.RequestId | None,
        record: Record | None,
        caller: str,
        content: bytes | None = None,
    ) -> str:
        """`forward` once the answer's head has come: its body to the client (`content`
        if read whole already, held in the budget), then the response closed and the
        caller's slot given back."""
        try:
            if content is not None:
                return await self.pass_whole(response, content, send, request_id, record)
            if response.media_type == EVENT_STREAM:
                return await self._stream(response, send, request_id, record)
            return await self._whole(response, send, request_id, record)
        finally:
            response.close()
            self.pool.release(caller)

    async def forward_until_gone(
        self,
        receive: Receive,
        send: Send,
        body: bytes,
        request_id: jsonrpc.RequestId | None,
        lines: bytes,
        caller: str,
        record: Record | None = None,
    ) -> str:
        """`forward` for an ASGI request, ended when `receive` says the client left."""
        running = asyncio.ensure_future(self.forward(send, body, request_id, lines, caller, record))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((running, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if running.done():
            return running.result()
        running.cancel()
        await asyncio.wait((running,))
        return "client_gone"

    async def ask(self, body: bytes, headers: RawHeaders, caller: str, request_id: Any) -> Answer:
        """One request whose answer the hub reads itself (`server/discover`, the tasks the
        upstream keeps): from a JSON reply, or the message answering `request_id` on an SSE
        stream. Any 4xx passes as it came, as do errors in JSON-RPC."""
        with self.pool.slot(caller):
            response = await self._send(body, head_lines(headers))
            try:
                kept = forwarding.response_headers(response.headers)
                if response.media_type == EVENT_STREAM:
                    message = await self._answer_on_stream(response, request_id)
                    kept = [(k, v) for k, v in kept if k != b"content-type"]
                    kept.append((b"content-type", b"application/json"))
                    return Answer(response.status, kept, msgspec.json.encode(message), message)
                content = await self._read_body(response)
                try:
                    if not _acceptable(response, content):
                        raise self._invalid(response)
                    message = json_message(content) if content else None
                    if message is None and 200 <= response.status < 300:
                        raise self._invalid(response)
                finally:
                    self.pool.buffer.give(len(content))
                return Answer(response.status, kept, content, message)
            finally:
                response.close()

    async def messages(
        self, body: bytes, headers: RawHeaders, caller: str
    ) -> AsyncIterator[dict[str, Any]]:
        """The JSON-RPC messages of a long-lived SSE answer, as they come (the hub's own
        `subscriptions/listen` at the upstream, hub/front_door/upstream_events.py). An answer that
        is no event stream raises `Declined` with what it said; faults are UpstreamErrors."""
        with self.pool.slot(caller):
            response = await self._send(body, head_lines(headers))
            try:
                if response.media_type != EVENT_STREAM:
                    content = await self._read_body(response)
                    self.pool.buffer.give(len(content))
                    raise Declined(response.status, json_message(content) if content else None)
                events = EventReader(RECORDED_EVENT)
                try:
                    async for chunk in response.chunks():
                        for data in events.feed(chunk):
                            message = json_message(data)
                            if message is not None:
                                yield message
                except EventTooLarge:
                    raise self.failed(502, "invalid", "an event larger than 1 MiB") from None
                except UpstreamFault as exc:
                    raise self.fault(exc) from None
            finally:
                response.close()

    async def exchange(self, body: bytes, headers: RawHeaders, request_id: Any, caller: str) -> Any:
        """One request the hub makes itself (the legacy door's translations): the final
        JSON-RPC answer to `request_id`, from a JSON reply or from an SSE stream's
        messages (notifications and requests on that stream are not relayed). An event
        is held to the same limits as a JSON answer."""
        with self.pool.slot(caller):
            response = await self._send(body, head_lines(headers))
            try:
                if response.media_type != EVENT_STREAM:
                    return await self._read_json(response)
                return await self._answer_on_stream(response, request_id)
            finally:
                response.close()

    # -- the request ---------------------------------------------------------------------

    async def _send(self, body: bytes, lines: bytes) -> Response:
        """The answer once its head has come (within `--upstream-timeout`)."""
        head = self.origin.head(lines, len(body))
        try:
            response = await self.pool.client.post(self.origin, head, body, self.pool.timeout)
        except UpstreamFault as exc:
            raise self.fault(exc) from None
        self.healthy()
        return response

    # -- the answer ----------------------------------------------------------------------

    async def _whole(
        self,
        response: Response,
        send: Send,
        request_id: jsonrpc.RequestId | None,
        record: Record | None,
    ) -> str:
        try:
            content = await self._read_body(response)
        except UpstreamError as exc:
            await self._fail(send, request_id, exc)
            return exc.fault
        return await self.pass_whole(response, content, send, request_id, record)

    async def pass_whole(
        self,
        response: Response,
        content: bytes,
        send: Send,
        request_id: jsonrpc.RequestId | None,
        record: Record | None,
    ) -> str:
        """A whole answer's `content` (held in the budget, given back here) to the client."""
        try:
            headers = self.whole_head(response, content)
            if isinstance(headers, UpstreamError):
                await self._fail(send, request_id, headers)
                return headers.fault
            if record is not None and b'"task"' in content:
                await record(content)
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            # In slices: each waits for the client to take the last, so the answer's bytes
            # are held (and counted) until they are on their way, not in a socket buffer.
            last = max(0, len(content) - 1) // SEND_SLICE * SEND_SLICE  # the last slice's start
            for start in range(0, last, SEND_SLICE):
                piece = content[start : start + SEND_SLICE]
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": content[last:] if last else content})
        finally:
            self.pool.buffer.give(len(content))
        return "ok"

    async def _stream(
        self,
        response: Response,
        send: Send,
        request_id: jsonrpc.RequestId | None,
        record: Record | None,
    ) -> str:
        """Relay an SSE reply chunk by chunk until it ends (or the client leaves, which
        cancels this)."""
        headers = forwarding.response_headers(response.headers)
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        fault = await self._relay(response, send, record)
        if fault is not None:  # cut off mid-stream: the request's answer is this error
            error = jsonrpc.encode_error(request_id, fault.rpc_error(self.spec.label))
            with contextlib.suppress(OSError):  # another ASGI server's "client gone"
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"event: message\ndata: " + error + b"\n\n",
                        "more_body": True,
                    }
                )
        await send({"type": "http.response.body", "body": b""})
        return "ok" if fault is None else fault.fault

    async def _relay(
        self, response: Response, send: Send, record: Record | None
    ) -> UpstreamError | None:
        # Only a watched answer's events are read; one too large to carry a task ends that.
        events = None if record is None else EventReader(RECORDED_EVENT)
        try:
            async for chunk in response.chunks():  # decoded: content-encoding is dropped
                if events is not None and record is not None:
                    try:
                        for data in events.feed(chunk):
                            if b'"task"' in data:
                                await record(data)
                    except EventTooLarge:
                        events = None
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamFault as exc:
            return self.fault(exc)
        return self._stray() if response.overran else None

    def refusal(self, response: Response, content: bytes) -> UpstreamError | None:
        """The fault when a whole answer's `content` is no answer to pass on."""
        return None if _acceptable(response, content) else self._invalid(response)

    def whole_head(self, response: Response, content: bytes) -> RawHeaders | UpstreamError:
        """The head the client gets with a whole answer's `content`, or the fault when
        it is no answer to pass on."""
        refusal = self.refusal(response, content)
        if refusal is not None:
            return refusal
        headers = forwarding.response_headers(response.headers)
        headers.append((b"content-length", b"%d" % len(content)))
        return headers

    def body_now(self, response: Response) -> bytes | None:
        """`_read_body` when the whole answer is here already (no content coding to
        decode): its bytes held in the budget; None when it is still coming."""
        whole = response.whole()
        if whole is None:
            return None
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in whole:
                size = self._hold(chunks, size, chunk)
            if response.overran:
                raise self._stray()
        except BaseException:
            self.pool.buffer.give(size)
            raise
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _read_body(self, response: Response) -> bytes:
        """The whole answer, its bytes held in the pool's budget (the caller gives them
        back); an UpstreamError when it is too large, too slow, broken or overruns."""
        content = self.body_now(response)
        if content is not None:  # here with its head, as most are: nothing to wait for
            return content
        timeout = self.pool.timeout
        chunks: list[bytes] = []
        size = 0  # what `chunks` holds, all of it taken from the budget
        try:
            async with asyncio.timeout(timeout):
                async for chunk in response.chunks():
                    size = self._hold(chunks, size, chunk)
            if response.overran:
                raise self._stray()
        except BaseException as exc:
            self.pool.buffer.give(size)
            if isinstance(exc, TimeoutError):
                message = f"answer not complete within {timeout:g}s"
                raise self.failed(504, "timeout", message) from None
            if isinstance(exc, UpstreamFault):
                raise self.fault(exc) from None
            raise
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _hold(self, chunks: list[bytes], size: int, chunk: bytes) -> int:
        """`chunk` taken from the budget and added to `chunks` (holding `size` bytes): the
        new size, or the fault that refuses it, with nothing more taken."""
        if size + len(chunk) > MAX_JSON_REPLY:
            raise self.failed(502, "invalid", f"answer larger than {MAX_JSON_REPLY} bytes")
        if not self.pool.buffer.take(len(chunk)):
            raise self._overloaded()
        chunks.append(chunk)
        return size + len(chunk)

    async def _read_json(self, response: Response) -> Any:
        content = await self._read_body(response)
        try:
            if not _acceptable(response, content) or not content:
                raise self._invalid(response)
            return msgspec.json.decode(content)
        finally:
            self.pool.buffer.give(len(content))

    async def _answer_on_stream(self, response: Response, request_id: Any) -> Any:
        """The answer to `request_id` among an SSE reply's messages."""
        events = EventReader(MAX_JSON_REPLY)
        held = 0
        try:
            async with asyncio.timeout(self.pool.timeout):
                async for chunk in response.chunks():
                    for data in events.feed(chunk):
                        message = json_message(data)
                        if message is not None and _answers(message, request_id):
                            return message
                    self.pool.buffer.give(held)  # held anew: what the reader holds now
                    held = 0
                    if not self.pool.buffer.take(events.held):
                        raise self._overloaded()
                    held = events.held
        except EventTooLarge:
            raise self.failed(
                502, "invalid", f"an event larger than {MAX_JSON_REPLY} bytes"
            ) from None
        except TimeoutError:
            raise self.failed(504, "timeout", "no answer on the stream in time") from None
        except UpstreamFault as exc:
            raise self.fault(exc) from None
        finally:
            self.pool.buffer.give(held)
        if response.overran:
            raise self._stray()
        raise self.failed(502, "invalid", "the stream ended without the answer")

    def _stray(self) -> UpstreamError:
        """An answer, read to its end, that more bytes followed (they would have answered
        the connection's next request: its connection was closed)."""
        return self.failed(502, "invalid", "answered past the end of its answer")

    # -- failures ------------------------------------------------------------------------

    def _invalid(self, response: Response) -> UpstreamError:
        if response.status >= 500:
            return self.failed(502, "status", f"answered HTTP {response.status}")
        kind = (response.header(b"content-type") or b"no content type").decode("latin-1")
        return self.failed(
            502,
            "invalid",
            f"answered HTTP {response.status} with {kind} that is no JSON-RPC message",
        )

    def fault(self, exc: UpstreamFault) -> UpstreamError:
        """A fault of the connection or of the answer's bytes, as the fault table names it."""
        return self.failed(504 if exc.kind == "timeout" else 502, exc.kind, str(exc))

    def _overloaded(self) -> UpstreamError:
        """The hub holds as many answer bytes as it may: not the upstream's fault, so its
        health is not judged by it."""
        self.metrics.upstream_faults.inc(1, self.spec.label, "overloaded")
        limit = self.pool.buffer.limit
        return UpstreamError(503, "overloaded", f"the hub holds {limit} bytes of answers already")

    def failed(self, status: int, fault: str, message: str) -> UpstreamError:
        self.metrics.upstream_faults.inc(1, self.spec.label, fault)
        if self.up is not False:
            log.warning("upstream %s (%s) is failing: %s", self.spec.label, self.spec.url, message)
        self.up = False
        self.metrics.upstream_up.set(0, self.spec.label)
        return UpstreamError(status, fault, message)

    def healthy(self) -> None:
        if self.up is not True:
            if self.up is False:
                log.info("upstream %s (%s) answers again", self.spec.label, self.spec.url)
            self.up = True
            self.metrics.upstream_up.set(1, self.spec.label)

    async def _fail(
        self, send: Send, request_id: jsonrpc.RequestId | None, exc: UpstreamError
    ) -> None:
        await _send_whole(send, error_answer(request_id, exc.rpc_error(self.spec.label)))


class WholeAnswer(NamedTuple):
    status: int
    headers: RawHeaders
    body: bytes


def error_answer(request_id: jsonrpc.RequestId | None, err: jsonrpc.RpcError) -> WholeAnswer:
    """What the client gets for a request the hub answers with `err` itself."""
    body = jsonrpc.encode_error(request_id, err)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    return WholeAnswer(err.http_status, headers + encode_headers(err.headers), body)


async def _send_whole(send: Send, answer: WholeAnswer) -> None:
    start = {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
    await send(start)
    await send({"type": "http.response.body", "body": answer.body})


def _acceptable(response: Response, content: bytes) -> bool:
    """Pass it on unchanged? A 5xx only as a JSON-RPC message; a 2xx only empty or as JSON;
    any other status (401 with its challenge, 404, 405) as the upstream sent it."""
    status = response.status
    if status < 500 and not 200 <= status < 300:
        return True
    if not content:
        return status < 500
    try:
        return _jsonrpc_of(content).jsonrpc == "2.0"
    except msgspec.DecodeError:  # not JSON, not an object, or no string `jsonrpc`
        return False


class _Envelope(msgspec.Struct):
    """What `_acceptable` reads of a JSON answer: the rest is checked as JSON, not built."""

    jsonrpc: str


_jsonrpc_of = msgspec.json.Decoder(_Envelope).decode


def _answers(message: dict[str, Any], request_id: Any) -> bool:
    return message.get("id") == request_id and ("result" in message or "error" in message)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client hangs up (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
