"""Raw HTTP/1.1 for the tests that play a hostile client or a broken upstream.

Clients here are raw sockets that send what no well-behaved client would; upstreams are
raw TCP servers that answer wrongly on purpose and keep their connections alive (so a
hub that pools a spoiled one is caught). `hub_process` runs `taskhub serve` in a process
of its own, for the tests whose question is the hub's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hub.settings import UpstreamSpec
from tests.e2e.test_front_door import chunk, sse_head
from tests.e2e.test_serve import taskhub_command
from tests.helpers import HubHarness, eventually, free_port, headers_for, rpc, start_served_hub

# -- clients that speak raw HTTP/1.1 -----------------------------------------------------


async def exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data` on a new connection; everything the hub answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        async with asyncio.timeout(timeout):
            return await reader.read(1 << 20)
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def port_of(harness: HubHarness) -> int:
    return int(harness.url.rsplit(":", 1)[1])


def post_head(*fields: str, target: str = "/mcp") -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def discover_request(*fields: str, chunked: bool = False) -> bytes:
    """A whole `server/discover`; `chunked`, it never takes the whole-post path."""
    body = rpc("server/discover", id="d")
    encoded = httpx.Request("POST", "http://x", json=body).content
    headers = [f"{name}: {value}" for name, value in headers_for(body).items()]
    if chunked:
        framing = "Transfer-Encoding: chunked"
        encoded = b"%x\r\n%s\r\n0\r\n\r\n" % (len(encoded), encoded)
    else:
        framing = f"Content-Length: {len(encoded)}"
    return post_head(*headers, "Content-Type: application/json", framing, *fields) + encoded


@dataclass
class HubProcess:
    """`taskhub serve` in a process of its own, on the session's NATS."""

    port: int
    process: asyncio.subprocess.Process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss(self) -> int:
        """The process's resident memory, in bytes."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024


@contextlib.asynccontextmanager
async def hub_process(
    nats_url: str, bucket: str, tmp_path: Path, *args: str
) -> AsyncIterator[HubProcess]:
    port = free_port()
    argv = ["serve", "--port", str(port), "--nats-url", nats_url, "--bucket", bucket]
    argv += ["--data-dir", str(tmp_path), "--log-level", "warning", *args]
    process = await asyncio.create_subprocess_exec(*taskhub_command(), *argv)
    hub = HubProcess(port, process)
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def ready() -> bool:
                try:
                    return (await client.get(hub.url + "/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=15)
        yield hub
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


# -- upstreams that misbehave on purpose: HTTP/1.1 by hand, connections kept alive -------

# An upstream's reply to one request: its bytes, or pieces written as the hub takes them
# (an answer that need not end), or None to hang up.
Reply = bytes | AsyncIterator[bytes] | None
Answer = Callable[["Received"], Awaitable[Reply]]


@dataclass
class Received:
    """One request as an upstream read it."""

    line: str
    head: list[tuple[str, str]]  # every field as it came, in order, names lower case
    body: bytes

    @property
    def path(self) -> str:
        return self.line.split(" ")[1]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.head if key == name]


@dataclass
class KeptAlive:
    """A raw HTTP/1.1 upstream that serves request after request on each connection;
    `answer` writes each reply (None: hang up)."""

    answer: Answer
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None

    def url(self, path: str = "/mcp") -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                fields = [line.split(":", 1) for line in head[1:] if line]
                pairs = [(name.strip().lower(), value.strip()) for name, value in fields]
                length = int(next((v for k, v in pairs if k == "content-length"), "0"))
                request = Received(head[0], pairs, await reader.readexactly(length))
                self.received.append(request)
                reply = await self.answer(request)
                if reply is None:
                    break
                pieces = [reply] if isinstance(reply, bytes) else reply
                async for piece in _each(pieces):
                    writer.write(piece)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _each(pieces: list[bytes] | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if isinstance(pieces, list):
        for piece in pieces:
            yield piece
    else:
        async for piece in pieces:
            yield piece


@contextlib.asynccontextmanager
async def kept_alive(answer: Answer) -> AsyncIterator[KeptAlive]:
    upstream = KeptAlive(answer)
    upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
    try:
        yield upstream
    finally:
        upstream.server.close()


def json_reply(message: dict[str, Any], *extra: str) -> bytes:
    body = json.dumps(message).encode()
    head = ["HTTP/1.1 200 OK", "content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join([*head, *extra]) + "\r\n\r\n").encode() + body


def result(request: Received, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": json.loads(request.body)["id"], "result": fields}


def tool_call(id: Any = 7) -> dict[str, Any]:
    return rpc("tools/call", {"name": "echo", "arguments": {}}, id=id)


async def call(url: str, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    body = body or tool_call()
    async with httpx.AsyncClient(timeout=15) as client:
        return await client.post(url, json=body, headers={**headers_for(body), **headers})


@contextlib.asynccontextmanager
async def hub_in_front(
    nats_url: str, bucket: str, tmp_path: Path, *upstreams: UpstreamSpec, **overrides: Any
) -> AsyncIterator[HubHarness]:
    harness = await start_served_hub(nats_url, bucket, tmp_path, upstreams=upstreams, **overrides)
    try:
        yield harness
    finally:
        await harness.stop()


def endless(kind: str) -> Answer:
    """Answers that never end, at loopback speed: JSON announcing 1 GiB, or an SSE event
    whose one `data:` line goes on for a GiB."""

    async def answer(request: Received) -> Reply:
        del request
        return pieces()

    async def pieces() -> AsyncIterator[bytes]:
        if kind == "json":
            yield b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            yield b"content-length: %d\r\n\r\n" % (1 << 30)
        else:
            yield sse_head() + chunk(b"event: message\ndata: ")
        block = b"7" * (1 << 20)
        for _ in range(1024):
            yield block if kind == "json" else chunk(block)

    return answer


def echoing(request: Received) -> Awaitable[bytes]:
    async def reply() -> bytes:
        return json_reply(result(request))

    return reply()
