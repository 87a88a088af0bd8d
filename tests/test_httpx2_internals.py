"""The contract between hub/httpx2_internals.py and the installed httpx2 and httpcore2.

The adapter reaches from an httpx2 answer through private attributes to its connection's
h11 state, and relies on httpcore2 sending a `trace` event just before it pools or closes
a connection. On a live loopback exchange: the chain resolves, the event comes, and an
answer followed by stray bytes closes its connection while a clean one is pooled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import h11
import httpx2 as httpx
import pytest

from hub.httpx2_internals import CLOSING, ReuseGuard, guard, guard_of, h11_state, stray_after_end

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


class Server:
    """Answers each request on a connection with `ANSWER`, plus `extra` on the first."""

    def __init__(self, extra: bytes) -> None:
        self.extra = extra
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        extra = self.extra
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(ANSWER + extra)
                extra = b""
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/"


@pytest.fixture(
    params=[b"", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]"], ids=["clean", "stray"]
)
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    served = Server(request.param)
    served.server = await asyncio.start_server(served.serve, "127.0.0.1", 0)
    yield served
    served.server.close()


class Recording(ReuseGuard):
    """The adapter's guard, noting every trace event it is given."""

    def __init__(self, response: httpx.Response, events: list[str]) -> None:
        super().__init__(response)
        self.events = events

    async def __call__(self, event: str, info: dict[str, object]) -> None:
        self.events.append(event)
        await super().__call__(event, info)


async def get(client: httpx.AsyncClient, url: str, events: list[str]) -> tuple[bytes, bool]:
    response = await client.send(client.build_request("GET", url), stream=True)
    assert isinstance(h11_state(response), h11.Connection), "the chain to h11 is broken"
    assert isinstance(guard(response), ReuseGuard)  # what the front door puts on an answer
    response.request.extensions["trace"] = recording = Recording(response, events)
    body = await response.aread()
    assert guard_of(response) is recording
    return body, recording.overran


async def test_stray_bytes_close_the_connection_and_a_clean_answer_is_pooled(
    server: Server,
) -> None:
    events: list[str] = []
    async with httpx.AsyncClient() as client:
        first, overran = await get(client, server.url, events)
        second, _ = await get(client, server.url, events)
    assert (first, second) == (b"{}", b"{}")  # never the stray `[]`
    # httpcore2 still reads the extension afresh, and says when it pools or closes.
    assert CLOSING in events
    assert overran == bool(server.extra)
    assert server.connections == (2 if server.extra else 1)


async def test_at_the_last_byte_of_a_plain_answer_stray_bytes_are_seen(server: Server) -> None:
    """The front door's JSON path: looked at as the last body byte comes, before the
    answer is closed and its connection pooled."""
    async with httpx.AsyncClient() as client:
        for _ in range(2):  # each the first answer on its connection: stray bytes follow
            response = await client.send(client.build_request("GET", server.url), stream=True)
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) == int(response.headers["content-length"]):
                    assert stray_after_end(response) == bool(server.extra)
            assert body == b"{}"
    assert server.connections == (2 if server.extra else 1)
