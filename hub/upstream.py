"""The hub as front door: every request it does not answer itself goes to an upstream MCP server.

An `Upstream` is one MCP endpoint (one server, or a load balancer over identical replicas)
reached through a pooled HTTP client (httpx2). `forward` sends the client's body and
end-to-end headers unchanged and streams the reply back as it arrives: an SSE reply frame by
frame (a tool call's progress and `input_required` requests reach the client as they are
sent), a JSON reply whole once it has been read and checked. A client that disconnects
closes the upstream request, which is how the upstream learns to cancel it.

What the client gets when the upstream fails (docs/front-door.md#upstream-errors): a JSON-RPC
error `-32603` naming the upstream and the fault, with HTTP 502 (refused, reset, an answer
that is no MCP response) or 504 (no answer within `--upstream-timeout`); never a hang. An SSE
reply cut off mid-stream ends with that error as its last event. Upstream health is passive:
each outcome moves `taskhub_upstream_up` and a change is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

# httpx2 (pydantic's fork, also what the mcp SDK uses): its pool's cost per request stays
# flat with concurrency, where httpcore 1.0.9's grows with every queued request.
import httpx2 as httpx
import msgspec
from starlette.types import Receive, Scope, Send

from bridge.events import DEFAULT_SERVICE
from hub import jsonrpc
from hub.metrics import Metrics

log = logging.getLogger("taskhub.upstream")

RawHeaders = list[tuple[bytes, bytes]]
MAX_JSON_REPLY = 64 << 20  # bytes; a JSON answer larger than this is refused, not buffered
POOL_CONNECTIONS = 1024  # per hub process, over all upstreams; an SSE reply holds one
POOL_KEEPALIVE = 64  # idle connections kept for reuse
# An idle connection is dropped before an upstream would close it (uvicorn and Node close
# after 5 s, gunicorn after 2 s; httpx's default is also 5 s). Reusing one that the upstream
# is closing at that moment fails the request with a reset (a 502 to the client).
POOL_KEEPALIVE_EXPIRY = 1.0  # seconds
# RFC 9110 §7.6.1 hop-by-hop headers, plus what the HTTP client sets itself.
_NOT_FORWARDED = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
_NOT_RETURNED = _NOT_FORWARDED | {b"content-encoding"}  # httpx decodes what it receives


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


class UpstreamError(Exception):
    """The upstream gave no usable answer: the JSON-RPC error and HTTP status to send."""

    def __init__(self, status: int, fault: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.fault = fault  # refused | timeout | reset | invalid | status

    def rpc_error(self, upstream: str) -> jsonrpc.RpcError:
        return jsonrpc.RpcError(
            jsonrpc.INTERNAL_ERROR,
            f"Upstream {upstream!r}: {self}",
            data={"upstream": upstream, "fault": self.fault},
            http_status=self.status,
        )


class Pool:
    """The one HTTP client every upstream shares; opened and closed with the app."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.client = httpx.AsyncClient(
            # Connect and pool waits are bounded here; the answer's head (and a JSON body)
            # by `Upstream`, since an SSE reply may rightly stay quiet for minutes.
            timeout=httpx.Timeout(None, connect=timeout, pool=timeout),
            limits=httpx.Limits(
                max_connections=POOL_CONNECTIONS,
                max_keepalive_connections=POOL_KEEPALIVE,
                keepalive_expiry=POOL_KEEPALIVE_EXPIRY,
            ),
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment between hub and upstream
        )

    async def close(self) -> None:
        await self.client.aclose()


class Upstream:
    def __init__(self, spec: UpstreamSpec, pool: Pool, metrics: Metrics) -> None:
        self.spec = spec
        self.pool = pool
        self.metrics = metrics
        self.up: bool | None = None  # unknown until the first answer
        metrics.upstream_up.set(-1, spec.label)

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: bytes,
        request_id: jsonrpc.RequestId | None,
    ) -> str:
        """Send the request upstream and its answer to the client; returns the outcome label.

        `request_id` (read by the hub while routing) is what a failed forward answers."""
        try:
            response = await self._open(scope, body, receive)
        except UpstreamError as exc:
            await self._fail(send, request_id, exc)
            return exc.fault
        if response is None:
            return "client_gone"
        try:
            if _is_event_stream(response):
                return await self._stream(response, receive, send, request_id)
            return await self._whole(response, send, request_id)
        finally:
            await response.aclose()

    async def call(self, scope: Scope, body: bytes) -> tuple[int, RawHeaders, Any]:
        """One request whose JSON answer the hub needs itself (`server/discover`)."""
        response = await self._open(scope, body, None)
        assert response is not None
        try:
            payload = await self._read_json(response)
        finally:
            await response.aclose()
        return response.status_code, _returned_headers(response), payload

    async def exchange(
        self, body: bytes, headers: list[tuple[bytes, bytes]], request_id: Any
    ) -> Any:
        """One request the hub makes itself (the legacy door's translations): the final
        JSON-RPC answer to `request_id`, from a JSON reply or from an SSE stream's
        messages (notifications and requests on that stream are not relayed)."""
        request = self.pool.client.build_request(
            "POST", self.spec.url, content=body, headers=headers
        )
        response = await self._send(request)
        try:
            if not _is_event_stream(response):
                return await self._read_json(response)
            async with asyncio.timeout(self.pool.timeout):
                async for message in _sse_messages(response):
                    if message.get("id") == request_id and (
                        "result" in message or "error" in message
                    ):
                        return message
        except TimeoutError:
            raise self._failed(504, "timeout", "no answer on the stream in time") from None
        except httpx.TransportError as exc:
            raise self._failed(502, "reset", f"stream cut off ({_reason(exc)})") from None
        finally:
            await response.aclose()
        raise self._failed(502, "invalid", "the stream ended without the answer")

    # -- the request ---------------------------------------------------------------------

    async def _open(
        self, scope: Scope, body: bytes, receive: Receive | None
    ) -> httpx.Response | None:
        """The upstream's answer head, or None if the client left first."""
        request = self.pool.client.build_request(
            "POST", self.spec.url, content=body, headers=_forwarded_headers(scope)
        )
        if receive is None:
            return await self._send(request)
        sending = asyncio.ensure_future(self._send(request))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((sending, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not sending.done():  # the client left: drop the upstream request with it
                sending.cancel()
        if sending.cancelled():
            return None
        return sending.result()

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
        self, response: httpx.Response, send: Send, request_id: jsonrpc.RequestId | None
    ) -> str:
        try:
            content = await self._read_body(response)
            if not _acceptable(response, content):
                raise self._invalid(response, content)
        except UpstreamError as exc:
            await self._fail(send, request_id, exc)
            return exc.fault
        headers = _returned_headers(response)
        headers.append((b"content-length", b"%d" % len(content)))
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": content})
        return "ok"

    async def _stream(
        self,
        response: httpx.Response,
        receive: Receive,
        send: Send,
        request_id: jsonrpc.RequestId | None,
    ) -> str:
        """Relay an SSE reply chunk by chunk until it ends or either side leaves."""
        headers = _returned_headers(response)
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        relay = asyncio.ensure_future(self._relay(response, send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not relay.done():  # the client left: closing the response ends the upstream call
            relay.cancel()
            with contextlib.suppress(BaseException):
                await relay
            return "client_gone"
        fault = relay.result()
        if fault is not None:  # cut off mid-stream: the request's answer is this error
            error = jsonrpc.encode_error(request_id, fault.rpc_error(self.spec.label))
            with contextlib.suppress(OSError):
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"event: message\ndata: " + error + b"\n\n",
                        "more_body": True,
                    }
                )
        await send({"type": "http.response.body", "body": b""})
        return "ok" if fault is None else fault.fault

    async def _relay(self, response: httpx.Response, send: Send) -> UpstreamError | None:
        try:
            async for chunk in response.aiter_bytes():  # decoded: content-encoding is dropped
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError as exc:
            return self._failed(502, "reset", f"stream cut off ({_reason(exc)})")
        return None

    async def _read_body(self, response: httpx.Response) -> bytes:
        timeout = self.pool.timeout
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(timeout):
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_JSON_REPLY:
                        raise self._failed(
                            502, "invalid", f"answer larger than {MAX_JSON_REPLY} bytes"
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise self._failed(504, "timeout", f"answer not complete within {timeout:g}s") from None
        except httpx.TransportError as exc:
            raise self._failed(502, "reset", f"connection lost ({_reason(exc)})") from None
        return b"".join(chunks)

    async def _read_json(self, response: httpx.Response) -> Any:
        content = await self._read_body(response)
        if not _acceptable(response, content) or not content:
            raise self._invalid(response, content)
        return msgspec.json.decode(content)

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
        error = jsonrpc.encode_error(request_id, exc.rpc_error(self.spec.label))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(error))]
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": error})


def _forwarded_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    # Surrounding spaces and tabs are not part of a field value (RFC 9110 §5.5); httptools
    # keeps trailing ones, which the upstream's HTTP client (h11) refuses to send at all.
    headers = [(k, v.strip(b" \t")) for k, v in scope["headers"] if k not in _NOT_FORWARDED]
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", client[0].encode()))
    for name, value in scope["headers"]:
        if name == b"host":
            headers.append((b"x-forwarded-host", value))
            break
    headers.append((b"x-forwarded-proto", scope.get("scheme", "http").encode()))
    return headers


def _returned_headers(response: httpx.Response) -> RawHeaders:
    """The answer's end-to-end headers, less CORS: the hub answers for its own origins."""
    return [
        (name, value)
        for name, value in ((k.lower(), v) for k, v in response.headers.raw)
        if name not in _NOT_RETURNED and not name.startswith(b"access-control-")
    ]


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


async def _sse_messages(response: httpx.Response) -> Any:
    """The JSON `data` of each SSE event of `response` (multi-line data joined)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            with contextlib.suppress(msgspec.DecodeError):
                message = msgspec.json.decode("\n".join(data))
                if isinstance(message, dict):
                    yield message
            data = []


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


async def _disconnected(receive: Receive) -> None:
    """Returns when the client hangs up (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
