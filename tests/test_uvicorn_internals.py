"""The contract between hub/http/uvicorn_internals.py and the installed uvicorn.

The adapter reaches into uvicorn's httptools protocol and its request cycle. These
tests pin what it relies on, so an upgrade that changes any of it fails here, naming
the part, instead of as a corrupted stream somewhere else: the attributes and methods
exist on live objects, the methods whose behaviour the adapter repeats are the ones
it was verified against, and a response written by the adapter is byte for byte what
uvicorn's own `send` writes for the same response, on a real loopback connection.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from hub.http import framing
from hub.http import uvicorn_internals as uv
from tests.helpers import Served, fingerprint, serve_app

BODY = b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete"}}'
HEADERS = [(b"content-type", b"application/json"), (b"x-test", b"1")]
CHUNKS = [b"data: one\n\n", b"data: two\n\n"]

# What the adapter repeats of uvicorn, as verified (uvicorn 0.54.0): a change to one of
# these needs a reading of the new code against hub/http/uvicorn_internals.py, then a new
# fingerprint here.
VERIFIED = {
    "HttpToolsProtocol.__init__": "6d66a1c9",
    "HttpToolsProtocol.connection_made": "5a387912",
    "HttpToolsProtocol.on_response_complete": "175d1fae",
    "HttpToolsProtocol.on_headers_complete": "620f348d",
    "HttpToolsProtocol.data_received": "e4de670c",
    "RequestResponseCycle.send": "f8c383f6",
    "FlowControl.__init__": "c83cfc71",
    "FlowControl.drain": "7343c57b",
    "FlowControl.pause_writing": "22f67ea8",
    "FlowControl.resume_writing": "e5000020",
    # hub/commands/server.py's HubServer replaces main_loop and capture_signals, makes
    # `should_exit` (a plain attribute __init__ sets) a property, and calls on_tick and
    # handle_exit as uvicorn's own loop and signal handler do.
    "Server.__init__": "32cc7e29",
    "Server.main_loop": "58213925",
    "Server.on_tick": "68def7c1",
    "Server.capture_signals": "bd5e768b",
    "Server.handle_exit": "76f177d4",
}


def as_defined(cls: type, name: str) -> Any:
    """The method as its class defines it. sse-starlette (which the mcp SDK imports)
    replaces `uvicorn.Server.handle_exit` with its own, which calls uvicorn's."""
    function = cls.__dict__[name]
    if getattr(function, "__qualname__", "") == "AppStatus.handle_exit":
        from sse_starlette.sse import AppStatus

        return AppStatus.original_handler
    return function


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_the_methods_the_adapter_repeats_are_the_verified_ones(name: str) -> None:
    owner, method = name.split(".")
    cls = {
        "HttpToolsProtocol": HttpToolsProtocol,
        "RequestResponseCycle": RequestResponseCycle,
        "FlowControl": FlowControl,
        "Server": uvicorn.Server,
    }
    found = fingerprint(as_defined(cls[owner], method))
    assert found == VERIFIED[name], (
        f"uvicorn {uvicorn.__version__} changed {name} (fingerprint {found}); read it against "
        "hub/http/uvicorn_internals.py (Server: hub/commands/server.py) before widening the "
        "pinned range"
    )


def test_the_seams_rely_on_uvicorns_call_sites() -> None:
    """`answer_whole` stands in for `data_received`, which must only feed the parser (and
    `_feed` repeats it); `over_concurrency_limit` repeats the 503 check of
    `on_headers_complete`."""
    received = inspect.getsource(HttpToolsProtocol.data_received)
    assert "self.parser.feed_data(data)" in received
    # The head limits read the target as uvicorn gathers it, and see each field first.
    assert "self.url += url" in inspect.getsource(HttpToolsProtocol.on_url)
    assert "self.headers.append((name, value))" in inspect.getsource(HttpToolsProtocol.on_header)
    headers_complete = inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert "len(self.connections) >= self.limit_concurrency" in headers_complete
    assert "len(self.tasks) >= self.limit_concurrency" in headers_complete
    for method in uv.PROTOCOL_METHODS:
        assert callable(getattr(HttpToolsProtocol, method, None)), method


# Header lists given again and again (as the endpoint's JSON_ONLY): encoded once each time
# they follow another.
SAME = list(HEADERS)
OTHER = [*HEADERS, (b"vary", b"origin")]


class Probe(uv.Protocol):
    """The adapter's protocol, answering `/whole` itself from the read and recording
    every request's cycle."""

    seen: ClassVar[list[tuple[Any, Any]]] = []

    def answer_whole(self, data: bytes) -> bool:
        path = data.split(b" ", 2)[1]
        headers = {b"/whole": list(HEADERS), b"/same": SAME, b"/other": OTHER}.get(path)
        if headers is None:
            return False
        self.respond_at_rest(200, headers, BODY)
        return True

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        type(self).seen.append((self, self.cycle))


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The same answers through uvicorn's own `send`, and `/in-place` with `respond`."""
    if scope["type"] != "http":
        return
    cycle = next(c for p, c in Probe.seen if uv.scope_of(c) is scope)
    if scope["path"] == "/in-place":
        assert uv.can_respond(cycle)
        uv.respond(cycle, 200, list(HEADERS), BODY)
        return
    if scope["path"] == "/stream-direct":
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        for chunk in CHUNKS:
            assert uv.chunk_writable(cycle)
            uv.write_chunk(cycle, chunk)
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        for chunk in CHUNKS:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    length = (b"content-length", b"%d" % len(BODY))
    await send({"type": "http.response.start", "status": 200, "headers": [*HEADERS, length]})
    await send({"type": "http.response.body", "body": BODY})


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    Probe.seen = []
    server = await serve_app(app, Probe)
    yield server
    await server.stop()


async def exchange(served: Served, *paths: str, close: bool = False) -> list[bytes]:
    """Each path asked in turn on one connection; the raw responses, Date removed."""
    host, port = served.url.removeprefix("http://").removesuffix("/mcp").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answers = []
    try:
        for n, path in enumerate(paths):
            last = close and n == len(paths) - 1
            connection = "Connection: close\r\n" if last else ""
            request = f"POST {path} HTTP/1.1\r\nHost: x\r\n{connection}Content-Length: 2\r\n\r\n"
            writer.write(request.encode() + b"{}")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            if b"transfer-encoding: chunked" in head:
                body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
            else:
                length = int(re.search(rb"content-length: (\d+)", head)[1])  # type: ignore[index]
                body = await reader.readexactly(length)
            answers.append(re.sub(rb"date: [^\r]*\r\n", b"", head + body))
        if close:
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
    finally:
        writer.close()
    return answers


async def test_a_whole_response_is_what_uvicorns_send_writes(served: Served) -> None:
    whole, in_place, through_send, again = await exchange(
        served, "/whole", "/in-place", "/asgi", "/whole"
    )
    assert whole == in_place == through_send == again
    # All came over one connection: the adapter left it ready for the next request,
    # and uvicorn's parser saw only the two it was given.
    assert len({id(protocol) for protocol, _ in Probe.seen}) == 1
    assert len(Probe.seen) == 2


async def test_a_header_list_given_again_is_written_as_it_is(served: Served) -> None:
    same, other, same_again, fresh = await exchange(served, "/same", "/other", "/same", "/whole")
    assert same == same_again == fresh
    assert other == same.replace(b"x-test: 1\r\n", b"x-test: 1\r\nvary: origin\r\n")
    assert b"vary" not in same


async def test_a_close_request_gets_connection_close_as_from_send(served: Served) -> None:
    (in_place,) = await exchange(served, "/in-place", close=True)
    (through_send,) = await exchange(served, "/asgi", close=True)
    assert in_place == through_send
    assert b"connection: close\r\n" in in_place


async def test_direct_chunks_are_framed_as_uvicorns_send_frames_them(served: Served) -> None:
    direct, through_send = await exchange(served, "/stream-direct", "/stream")
    assert direct == through_send


async def test_a_connection_knows_both_ends_as_uvicorn_would(served: Served) -> None:
    """`connection_made` reads the addresses from the transport's names, not its socket:
    the same values uvicorn's own helpers give for the same transport."""
    from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

    await exchange(served, "/in-place")
    protocol, _ = Probe.seen[0]
    transport = protocol.transport
    assert protocol.server == get_local_addr(transport) and protocol.server is not None
    assert protocol.client == get_remote_addr(transport) and protocol.client is not None
    assert protocol.scheme == ("https" if is_ssl(transport) else "http")
    assert protocol.flow._transport is transport and protocol in protocol.connections
    assert uv._remote(("::1", 8000, 0, 0)) == uv._local(("::1", 8000, 0, 0)) == ("::1", 8000)
    assert uv._local("/run/hub.sock") == ("/run/hub.sock", None) and uv._remote("") is None
    assert uv._local(None) is None


async def test_the_attributes_the_adapter_uses_exist_on_live_objects(served: Served) -> None:
    await exchange(served, "/in-place")
    protocol, cycle = Probe.seen[0]
    for name in uv.CYCLE_ATTRIBUTES:
        assert hasattr(cycle, name), f"RequestResponseCycle.{name}"
    for name in uv.PROTOCOL_ATTRIBUTES:
        assert hasattr(protocol, name), f"HttpToolsProtocol.{name}"
    assert hasattr(cycle.flow, "write_paused")
    assert uv.finished(cycle) and uv.body_complete(cycle)


def test_the_status_lines_are_uvicorns() -> None:
    """hub/http/framing.py writes status lines of its own; byte for byte uvicorn's."""
    assert framing.STATUS_LINE == STATUS_LINE
