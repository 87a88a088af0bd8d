"""The hub as front door: every request it does not answer itself goes to an upstream MCP server.

An `Upstream` is one MCP endpoint (one server, or a load balancer over identical replicas)
reached through a pooled HTTP client (httpx2). `forward` sends the client's body and
end-to-end headers unchanged and streams the reply back as it arrives: an SSE reply frame by
frame (a tool call's progress and `input_required` requests reach the client as they are
sent), a JSON reply whole once it has been read and checked. A client that disconnects
closes the upstream request, which is how the upstream learns to cancel it.

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
from dataclasses import dataclass
from typing import Any, NamedTuple

# httpx2 (pydantic's fork, also what the mcp SDK uses): its pool's cost per request stays
# flat with concurrency, where httpcore 1.0.9's grows with every queued request.
import httpx2 as httpx
import msgspec
from starlette.types import Receive, Send

from bridge.events import DEFAULT_SERVICE
from hub import forwarding, jsonrpc
from hub.event_reader import EventReader, EventTooLarge, json_message
from hub.headers import encode_headers
from hub.httpx2_internals import guard, guard_of, stray_after_end
from hub.metrics import Metrics
from hub.upstream_pool import Pool

log = logging.getLogger("taskhub.upstream")

RawHeaders = list[tuple[bytes, bytes]]
MAX_JSON_REPLY = 64 << 20  # bytes; a JSON answer larger than this is refused, not buffered
# What breaks an answer while it is read: the connection, or its content coding.
BROKEN = (httpx.TransportError, httpx.DecodingError)
SEND_SLICE = 256 << 10  # a whole answer goes to the client in writes of this size
WATCHED_EVENT = 1 << 20  # an SSE event larger than this carries no task worth recording
Watch = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class UpstreamSpec:
    """`--upstream [NAME=]URL`: NAME is None for the one served at `/mcp`."""

    name: str | None
    url: str

    @property
    def label(self) -> str:
        """The service name: fleet events (bridge/events.py), metrics, logs and errors."""
        return self.name or DEFAULT_SERVICE

    @property
    def path(self) -> str:
        return "/mcp" if self.name is None else f"/servers/{self.name}/mcp"

    @property
    def legacy_path(self) -> str:
        """Its 2025-11-25 door (hub/legacy/endpoint.py), beside `path`."""
        return "/legacy/mcp" if self.name is None else f"/servers/{self.name}/legacy/mcp"


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
        self.pool = pool
        self.metrics = metrics
        self.up: bool | None = None  # unknown until the first answer
        metrics.upstream_up.set(-1, spec.label)

    async def forward(
        self,
        receive: Receive,
        send: Send,
        body: bytes,
        request_id: jsonrpc.RequestId | None,
        headers: RawHeaders,
        caller: str,
        watch: Watch | None = None,
    ) -> str:
        """Send the request upstream and its answer to the client; returns the outcome label.

        `headers` go upstream as they are (`forwarding.request_headers` made them);
        `request_id` (read by the hub while routing) is what a failed forward answers.
        `watch` sees each JSON-RPC message of the answer that may carry a task (a JSON
        answer, or an SSE event, naming `"task"`) before the client does."""
        refusal = self.pool.admit(caller)
        if refusal is not None:
            error = jsonrpc.encode_error(request_id, refusal)
            await _send_whole(send, refusal.http_status, error, refusal)
            return "limited"
        try:
            try:
                response = await self._open(self._request(body, headers), receive)
            except UpstreamError as exc:
                await self._fail(send, request_id, exc)
                return exc.fault
            if response is None:
                return "client_gone"
            try:
                if _is_event_stream(response):
                    guard(response)  # pooled only if nothing follows the stream (`_overrun`)
                    return await self._stream(response, receive, send, request_id, watch)
                return await self._whole(response, send, request_id, watch)
            finally:
                await response.aclose()
        finally:
            self.pool.release(caller)

    async def ask(self, body: bytes, headers: RawHeaders, caller: str, request_id: Any) -> Answer:
        """One request whose answer the hub reads itself (`server/discover`, the tasks the
        upstream keeps): from a JSON reply, or the message answering `request_id` on an SSE
        stream. Any 4xx passes as it came, as do errors in JSON-RPC."""
        with self.pool.slot(caller):
            response = await self._send(self._request(body, headers))
            try:
                kept = forwarding.response_headers(response.headers.raw)
                if _is_event_stream(response):
                    guard(response)  # pooled only if nothing follows the stream (`_overrun`)
                    message = await self._answer_on_stream(response, request_id)
                    kept = [(k, v) for k, v in kept if k != b"content-type"]
                    kept.append((b"content-type", b"application/json"))
                    return Answer(response.status_code, kept, msgspec.json.encode(message), message)
                content = await self._read_body(response)
                try:
                    if not _acceptable(response, content):
                        raise self._invalid(response, content)
                    message = json_message(content) if content else None
                    if message is None and 200 <= response.status_code < 300:
                        raise self._invalid(response, content)
                finally:
                    self.pool.buffer.give(len(content))
                return Answer(response.status_code, kept, content, message)
            finally:
                await response.aclose()

    async def messages(
        self, body: bytes, headers: RawHeaders, caller: str
    ) -> AsyncIterator[dict[str, Any]]:
        """The JSON-RPC messages of a long-lived SSE answer, as they come (the hub's own
        `subscriptions/listen` at the upstream, hub/upstream_events.py). An answer that is
        no event stream raises `Declined` with what it said; faults are UpstreamErrors."""
        with self.pool.slot(caller):
            response = await self._send(self._request(body, headers))
            try:
                if not _is_event_stream(response):
                    content = await self._read_body(response)
                    self.pool.buffer.give(len(content))
                    raise Declined(response.status_code, json_message(content) if content else None)
                guard(response)  # pooled only if nothing follows the stream
                events = EventReader(WATCHED_EVENT)
                try:
                    async for chunk in response.aiter_bytes():
                        for data in events.feed(chunk):
                            message = json_message(data)
                            if message is not None:
                                yield message
                except EventTooLarge:
                    raise self._failed(502, "invalid", "an event larger than 1 MiB") from None
                except BROKEN as exc:
                    raise self._broken(exc, "stream cut off") from None
            finally:
                await response.aclose()

    async def exchange(self, body: bytes, headers: RawHeaders, request_id: Any, caller: str) -> Any:
        """One request the hub makes itself (the legacy door's translations): the final
        JSON-RPC answer to `request_id`, from a JSON reply or from an SSE stream's
        messages (notifications and requests on that stream are not relayed). An event
        is held to the same limits as a JSON answer."""
        with self.pool.slot(caller):
            response = await self._send(self._request(body, headers))
            try:
                if not _is_event_stream(response):
                    return await self._read_json(response)
                guard(response)  # pooled only if nothing follows the stream (`_overrun`)
                return await self._answer_on_stream(response, request_id)
            finally:
                await response.aclose()

    # -- the request ---------------------------------------------------------------------

    def _request(self, body: bytes, headers: RawHeaders) -> httpx.Request:
        return self.pool.client.build_request("POST", self.spec.url, content=body, headers=headers)

    async def _open(self, request: httpx.Request, receive: Receive) -> httpx.Response | None:
        """The upstream's answer head, or None if the client left first."""
        sending = asyncio.ensure_future(self._send(request))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((sending, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not sending.done():  # the client left: drop the upstream request with it
                sending.cancel()
        if gone.done() and not gone.cancelled():
            # The client left; the answer, if it came all the same, goes nowhere.
            await asyncio.wait((sending,))
            if not sending.cancelled() and sending.exception() is None:
                await sending.result().aclose()
            return None
        return sending.result()  # the answer head, or the UpstreamError

    async def _send(self, request: httpx.Request) -> httpx.Response:
        timeout = self.pool.timeout
        try:
            async with asyncio.timeout(timeout):
                response = await self.pool.client.send(request, stream=True)
        except TimeoutError:
            raise self._failed(504, "timeout", f"no answer within {timeout:g}s") from None
        except httpx.ConnectTimeout:
            raise self._failed(504, "timeout", f"no connection within {timeout:g}s") from None
        except httpx.PoolTimeout:
            raise self._failed(504, "timeout", "every upstream connection is busy") from None
        except httpx.ConnectError as exc:
            raise self._failed(502, "refused", f"cannot connect ({_reason(exc)})") from None
        except httpx.TransportError as exc:
            raise self._failed(502, "reset", f"connection lost ({_reason(exc)})") from None
        self._healthy()
        return response

    # -- the answer ----------------------------------------------------------------------

    async def _whole(
        self,
        response: httpx.Response,
        send: Send,
        request_id: jsonrpc.RequestId | None,
        watch: Watch | None,
    ) -> str:
        try:
            content = await self._read_body(response)
        except UpstreamError as exc:
            await self._fail(send, request_id, exc)
            return exc.fault
        try:
            if not _acceptable(response, content):
                invalid = self._invalid(response, content)
                await self._fail(send, request_id, invalid)
                return invalid.fault
            if watch is not None and b'"task"' in content:
                await watch(content)
            headers = forwarding.response_headers(response.headers.raw)
            headers.append((b"content-length", b"%d" % len(content)))
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": headers}
            )
            # In slices: each waits for the client to take the last, so the answer's bytes
            # are held (and counted) until they are on their way, not in a socket buffer.
            for start in range(0, len(content), SEND_SLICE):
                piece = content[start : start + SEND_SLICE]
                more = start + SEND_SLICE < len(content)
                await send({"type": "http.response.body", "body": piece, "more_body": more})
            if not content:
                await send({"type": "http.response.body", "body": b""})
        finally:
            self.pool.buffer.give(len(content))
        return "ok"

    async def _stream(
        self,
        response: httpx.Response,
        receive: Receive,
        send: Send,
        request_id: jsonrpc.RequestId | None,
        watch: Watch | None,
    ) -> str:
        """Relay an SSE reply chunk by chunk until it ends or either side leaves."""
        headers = forwarding.response_headers(response.headers.raw)
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        relay = asyncio.ensure_future(self._relay(response, send, watch))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not relay.done():  # the client left: closing the response ends the upstream call
            relay.cancel()
            await asyncio.wait((relay,))
            return "client_gone"
        fault = relay.result()
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
        self, response: httpx.Response, send: Send, watch: Watch | None
    ) -> UpstreamError | None:
        # Only a watched answer's events are read; one too large to carry a task ends that.
        events = None if watch is None else EventReader(WATCHED_EVENT)
        try:
            async for chunk in response.aiter_bytes():  # decoded: content-encoding is dropped
                if events is not None and watch is not None:
                    try:
                        for data in events.feed(chunk):
                            if b'"task"' in data:
                                await watch(data)
                    except EventTooLarge:
                        events = None
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BROKEN as exc:
            return self._broken(exc, "stream cut off")
        return self._overrun(response)

    async def _read_body(self, response: httpx.Response) -> bytes:
        """The whole answer, its bytes held in the pool's budget (the caller gives them
        back); an UpstreamError when it is too large, too slow, broken or overruns."""
        timeout = self.pool.timeout
        chunks: list[bytes] = []
        size = 0
        end = _plain_length(response)  # where to look for bytes past it, if it says
        if end is None:
            guard(response)  # pooled only if nothing follows the answer (`_overrun`)
        try:
            async with asyncio.timeout(timeout):
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_JSON_REPLY:
                        raise self._failed(
                            502, "invalid", f"answer larger than {MAX_JSON_REPLY} bytes"
                        )
                    if not self.pool.buffer.take(len(chunk)):
                        size -= len(chunk)
                        raise self._overloaded()
                    chunks.append(chunk)
                    if size == end and stray_after_end(response):
                        raise self._stray()
            overrun = self._overrun(response)
            if overrun is not None:
                raise overrun
        except BaseException as exc:
            self.pool.buffer.give(size)
            if isinstance(exc, TimeoutError):
                message = f"answer not complete within {timeout:g}s"
                raise self._failed(504, "timeout", message) from None
            if isinstance(exc, BROKEN):
                raise self._broken(exc, "connection lost") from None
            raise
        return b"".join(chunks)

    async def _read_json(self, response: httpx.Response) -> Any:
        content = await self._read_body(response)
        try:
            if not _acceptable(response, content) or not content:
                raise self._invalid(response, content)
            return msgspec.json.decode(content)
        finally:
            self.pool.buffer.give(len(content))

    async def _answer_on_stream(self, response: httpx.Response, request_id: Any) -> Any:
        """The answer to `request_id` among an SSE reply's messages."""
        events = EventReader(MAX_JSON_REPLY)
        held = 0
        try:
            async with asyncio.timeout(self.pool.timeout):
                async for chunk in response.aiter_bytes():
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
            raise self._failed(
                502, "invalid", f"an event larger than {MAX_JSON_REPLY} bytes"
            ) from None
        except TimeoutError:
            raise self._failed(504, "timeout", "no answer on the stream in time") from None
        except BROKEN as exc:
            raise self._broken(exc, "stream cut off") from None
        finally:
            self.pool.buffer.give(held)
        raise self._overrun(response) or self._failed(
            502, "invalid", "the stream ended without the answer"
        )

    def _overrun(self, response: httpx.Response) -> UpstreamError | None:
        """The fault of an answer, read to its end, that more bytes followed (they would
        have answered the connection's next request: its connection was closed)."""
        reuse_guard = guard_of(response)
        if reuse_guard is None or not reuse_guard.overran:
            return None
        return self._stray()

    def _stray(self) -> UpstreamError:
        return self._failed(502, "invalid", "answered past the end of its answer")

    # -- failures ------------------------------------------------------------------------

    def _invalid(self, response: httpx.Response, content: bytes) -> UpstreamError:
        if response.status_code >= 500:
            return self._failed(502, "status", f"answered HTTP {response.status_code}")
        kind = response.headers.get("content-type", "no content type")
        return self._failed(
            502,
            "invalid",
            f"answered HTTP {response.status_code} with {kind} that is no JSON-RPC message",
        )

    def _broken(self, exc: Exception, what: str) -> UpstreamError:
        """An answer broken while it was read: undecodable (`invalid`), or cut off."""
        if isinstance(exc, httpx.DecodingError):
            return self._failed(502, "invalid", f"undecodable answer ({_reason(exc)})")
        return self._failed(502, "reset", f"{what} ({_reason(exc)})")

    def _overloaded(self) -> UpstreamError:
        """The hub holds as many answer bytes as it may: not the upstream's fault, so its
        health is not judged by it."""
        self.metrics.upstream_faults.inc(1, self.spec.label, "overloaded")
        limit = self.pool.buffer.limit
        return UpstreamError(503, "overloaded", f"the hub holds {limit} bytes of answers already")

    def _failed(self, status: int, fault: str, message: str) -> UpstreamError:
        self.metrics.upstream_faults.inc(1, self.spec.label, fault)
        if self.up is not False:
            log.warning("upstream %s (%s) is failing: %s", self.spec.label, self.spec.url, message)
        self.up = False
        self.metrics.upstream_up.set(0, self.spec.label)
        return UpstreamError(status, fault, message)

    def _healthy(self) -> None:
        if self.up is False:
            log.info("upstream %s (%s) answers again", self.spec.label, self.spec.url)
        self.up = True
        self.metrics.upstream_up.set(1, self.spec.label)

    async def _fail(
        self, send: Send, request_id: jsonrpc.RequestId | None, exc: UpstreamError
    ) -> None:
        err = exc.rpc_error(self.spec.label)
        await _send_whole(send, exc.status, jsonrpc.encode_error(request_id, err), err)


async def _send_whole(send: Send, status: int, body: bytes, err: jsonrpc.RpcError) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers += encode_headers(err.headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _plain_length(response: httpx.Response) -> int | None:
    """The length of an answer framed by its `Content-Length` and sent as it is (no
    content coding), whose last byte `_read_body` sees come: None for any other."""
    length = b""
    for name, value in response.headers.raw:  # one pass: httpx's `get` is one per name
        name = name.lower()
        if name == b"content-length":
            length = value
        elif name == b"content-encoding":
            return None
    return int(length) or None if length.isdigit() else None


def _is_event_stream(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


def _acceptable(response: httpx.Response, content: bytes) -> bool:
    """Pass it on unchanged? A 5xx only as a JSON-RPC message; a 2xx only empty or as JSON;
    any other status (401 with its challenge, 404, 405) as the upstream sent it."""
    status = response.status_code
    if status < 500 and not 200 <= status < 300:
        return True
    if not content:
        return status < 500
    try:
        message = msgspec.json.decode(content)
    except msgspec.DecodeError:
        return False
    return isinstance(message, dict) and message.get("jsonrpc") == "2.0"


def _answers(message: dict[str, Any], request_id: Any) -> bool:
    return message.get("id") == request_id and ("result" in message or "error" in message)


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


async def _disconnected(receive: Receive) -> None:
    """Returns when the client hangs up (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
