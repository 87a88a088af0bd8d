"""The hub against a hostile client and a broken upstream (issue 38's probe, finding by finding).

Clients here are raw sockets that send what no well-behaved client would; upstreams are
raw TCP servers that answer wrongly on purpose. Where memory is the question, the hub
runs as its own `taskhub serve` process, so that its RSS is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from hub.forwarding import parse_trusted_proxies
from hub.upstream import UpstreamSpec
from tests.e2e.test_front_door import chunk, sse_head
from tests.e2e.test_legacy_endpoint import LegacyClient
from tests.e2e.test_serve import taskhub_command
from tests.helpers import (
    HubHarness,
    eventually,
    free_port,
    headers_for,
    mint_token,
    rpc,
    start_served_hub,
)

pytestmark = pytest.mark.timeout(90)


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
    """A whole `server/discover`; `chunked`, it never takes the fast lane."""
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


# -- 1. the request head is bounded, before authentication ------------------------------

SMALL_LIMITS: dict[str, Any] = {
    "max_head_bytes": 4096,
    "max_field_bytes": 512,
    "max_fields": 20,
    "max_target_bytes": 256,
}


@pytest.fixture
async def limited(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_served_hub(
        nats_url, bucket, tmp_path, jwt_secret="s" * 32, **SMALL_LIMITS
    )
    yield harness
    await harness.stop()


def padded_head(size: int) -> bytes:
    """A head of exactly `size` bytes, blank line included, made of small fields."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"\r\n"
    room = size - len(start) - len(end)
    fields, left = [], room
    while left:
        line = b"X-P: " + b"p" * min(max(left - 7, 0), 300) + b"\r\n"
        if left - len(line) < 7 and left != len(line):  # leave no remainder too small
            line = b"X-P: " + b"p" * (left - 7) + b"\r\n"
        fields.append(line)
        left -= len(line)
    head = start + b"".join(fields) + end
    assert len(head) == size
    return head


async def test_a_head_at_its_limit_is_read_and_one_byte_more_refused(
    limited: HubHarness,
) -> None:
    port = port_of(limited)
    assert status_of(await exchange(port, padded_head(4096))) == 200
    answer = await exchange(port, padded_head(4097))
    assert status_of(answer) == 431
    assert b"connection: close" in answer.lower()


async def test_a_head_that_never_ends_is_refused_at_the_first_byte_over(
    limited: HubHarness,
) -> None:
    """No blank line, no waiting for the header deadline: the 4,097th byte is refused."""
    port = port_of(limited)
    unfinished = padded_head(4096 + 2)[:-2]  # 4,096 bytes, the blank line missing
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(unfinished[:4096])
        await writer.drain()
        with pytest.raises(TimeoutError):  # exactly at the limit: still being read
            await asyncio.wait_for(reader.read(1), 0.3)
        started = time.monotonic()
        writer.write(b"X")
        answer = await asyncio.wait_for(reader.read(1 << 16), 5)
        assert status_of(answer) == 431
        assert time.monotonic() - started < 1  # well before the 10 s header deadline
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (post_head("X-A: " + "a" * 600), 431),  # one field over 512 bytes
        (post_head(*(f"X-{n}: v" for n in range(21))), 431),  # 22 fields with Host
        (post_head(target="/mcp?" + "q" * 300), 414),  # a target over 256 bytes
    ],
    ids=["field", "fields", "target"],
)
async def test_a_field_too_large_too_many_fields_or_a_long_target_is_refused(
    limited: HubHarness, request_bytes: bytes, status: int
) -> None:
    answer = await exchange(port_of(limited), request_bytes)
    assert status_of(answer) == status
    assert b"www-authenticate" not in answer.lower()  # refused before authentication


async def test_the_fast_lane_refuses_what_the_parser_refuses(limited: HubHarness) -> None:
    """A whole request in one read, over a limit, is not answered in place."""
    port = port_of(limited)
    fine = await exchange(port, discover_request())
    assert status_of(fine) == 401  # read, then refused for want of a token
    for fields, status in (
        (["X-A: " + "a" * 600], 431),
        ([f"X-{n}: v" for n in range(21)], 431),
    ):
        assert status_of(await exchange(port, discover_request(*fields))) == status


async def test_trailers_never_join_the_request_head(limited: HubHarness) -> None:
    """A chunked body's trailer fields are not counted as fields of the head, nor read as
    one: a hundred of them pass the field limit of twenty."""
    body = rpc("server/discover", id="t")
    encoded = httpx.Request("POST", "http://x", json=body).content
    headers = [f"{name}: {value}" for name, value in headers_for(body).items()]
    head = post_head(*headers, "Content-Type: application/json", "Transfer-Encoding: chunked")
    trailers = "".join(f"X-T{n}: v\r\n" for n in range(100)).encode()
    chunked = b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(encoded), encoded, trailers)
    assert status_of(await exchange(port_of(limited), head + chunked)) == 401


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (padded_head(32 * 1024 + 1), 431),
        (post_head("Cookie: " + "c" * 8 * 1024), 431),
        (post_head(*(f"X-{n}: v" for n in range(100))), 431),
        (post_head(target="/" + "t" * 8 * 1024), 414),
    ],
    ids=["head", "field", "fields", "target"],
)
async def test_the_default_limits_are_like_nginxs(
    nats_url: str, bucket: str, tmp_path: Path, request_bytes: bytes, status: int
) -> None:
    """32 KiB a head, 8 KiB a field or target, 100 fields: one byte or field more is
    refused, with no token and before one is asked for."""
    harness = await start_served_hub(nats_url, bucket, tmp_path, jwt_secret="s" * 32)
    try:
        assert status_of(await exchange(port_of(harness), request_bytes)) == status
    finally:
        await harness.stop()


async def test_an_endless_trailer_field_is_cut_off(limited: HubHarness) -> None:
    """The parser gathers a trailer field whole before it reports it: past what a request
    may send after its head (twice --max-body-bytes and a little), the hub hangs up."""
    _, writer = await asyncio.open_connection("127.0.0.1", port_of(limited))
    sent = 0
    try:
        writer.write(post_head("Transfer-Encoding: chunked") + b"1\r\n{\r\n0\r\nX-T: ")
        for _ in range(64):
            writer.write(b"v" * (1 << 20))
            await writer.drain()
            sent += 1
    except ConnectionError:
        pass
    finally:
        writer.close()
    assert sent < 16, f"the hub read {sent} MiB of one trailer field"


async def test_sixty_mib_of_headers_on_twenty_connections_cost_the_hub_little(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """The probe's attack, twenty times at once: no token, a head that never ends. The
    hub's memory grows by less than 50 MiB and /healthz answers within 100 ms throughout."""
    async with hub_process(nats_url, bucket, tmp_path, "--jwt-secret", "s" * 32) as hub:
        before = hub.rss()
        peak = before
        field = b"X-A: b\r\n" * (1 << 17)  # 1 MiB of header fields
        latencies: list[float] = []

        async def attack() -> int:
            """MiB sent before the hub hung up."""
            _, writer = await asyncio.open_connection("127.0.0.1", hub.port)
            sent = 0
            try:
                writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                for _ in range(60):
                    writer.write(field)
                    await writer.drain()
                    sent += 1
            except ConnectionError:
                pass  # refused and reset: the point
            finally:
                writer.close()
            return sent

        async def watch(done: asyncio.Event) -> None:
            nonlocal peak
            async with httpx.AsyncClient(timeout=5) as client:
                await client.get(hub.url + "/healthz")  # connected before the attack
                watching.set()
                while not done.is_set() or len(latencies) < 20:
                    started = time.perf_counter()
                    assert (await client.get(hub.url + "/healthz")).status_code == 200
                    latencies.append(time.perf_counter() - started)
                    peak = max(peak, hub.rss())
                    if peak - before > 512 << 20:  # the old hub: stop before the machine
                        hub.process.kill()
                        raise AssertionError(f"RSS grew by {(peak - before) >> 20} MiB")
                    await asyncio.sleep(0.01)

        done, watching = asyncio.Event(), asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        await watching.wait()
        try:
            sent = await asyncio.wait_for(asyncio.gather(*(attack() for _ in range(20))), 60)
        finally:
            done.set()
            await watcher
        peak = max(peak, hub.rss())
        assert peak - before < 50 << 20, f"RSS grew by {(peak - before) >> 20} MiB"
        assert latencies and max(latencies) < 0.1, f"/healthz took {max(latencies):.3f}s"
        # Hung up on, not read to the end: what got out sat in socket buffers.
        assert max(sent) < 30, f"the hub read {max(sent)} MiB of one head"


# -- 5. an open hub answers only the names it is known by (DNS rebinding) ----------------


@pytest.fixture
async def open_hub(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()


def get(target: str, host: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


@pytest.mark.parametrize("target", ["/operator/stream", "/tasks/t-1", "/", "/metrics"])
async def test_a_rebound_name_gets_421_on_every_get(open_hub: HubHarness, target: str) -> None:
    """A page at evil.example, rebound to 127.0.0.1, sends its own name and no Origin."""
    port = port_of(open_hub)
    answer = await exchange(port, get(target, f"evil.example:{port}"))
    assert status_of(answer) == 421
    assert b"taskId" not in answer


@pytest.mark.parametrize("chunked", [False, True], ids=["in-place", "asgi"])
async def test_a_rebound_name_gets_421_on_post(open_hub: HubHarness, chunked: bool) -> None:
    """Whole in one read (the fast lane), or chunked (uvicorn's parser and the app)."""
    port = port_of(open_hub)
    request = discover_request(chunked=chunked)
    request = request.replace(b"Host: 127.0.0.1", f"Host: evil.example:{port}".encode())
    answer = await exchange(port, request)
    assert status_of(answer) == 421
    assert b'"code":-32600' in answer


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "10.1.2.3"]
)
async def test_addresses_and_localhost_are_answered(open_hub: HubHarness, host: str) -> None:
    port = port_of(open_hub)
    answer = await exchange(port, get("/healthz", host.format(port=port)))
    assert status_of(answer) == 200


async def test_an_allowed_host_is_answered(nats_url: str, bucket: str, tmp_path: Path) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path, allowed_hosts=("hub.example",))
    try:
        for host, status in (("hub.example:80", 200), ("other.example", 421)):
            assert status_of(await exchange(port_of(harness), get("/healthz", host))) == status
    finally:
        await harness.stop()


async def test_a_hub_with_authentication_answers_any_name(limited: HubHarness) -> None:
    port = port_of(limited)
    assert status_of(await exchange(port, get("/healthz", "hub.internal.example"))) == 200


async def test_two_host_fields_are_refused(open_hub: HubHarness) -> None:
    port = port_of(open_hub)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n"
    assert status_of(await exchange(port, request)) == 421


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


# -- 2. an upstream's stray bytes never answer another request ----------------------------


async def test_bytes_past_an_answers_end_never_answer_the_next_request(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """alpha miscounts its Content-Length and writes a second answer behind the first;
    beta, on the same host and port, must not receive it as its own."""

    async def answer(request: Received) -> bytes:
        if request.path == "/alpha":
            poison = json_reply({"jsonrpc": "2.0", "id": 7, "result": {"POISONED": True}})
            return json_reply(result(request, alpha=True)) + poison
        return json_reply(result(request, beta=True))

    async with kept_alive(answer) as upstream:
        specs = (
            UpstreamSpec("alpha", upstream.url("/alpha")),
            UpstreamSpec("beta", upstream.url("/beta")),
        )
        async with hub_in_front(nats_url, bucket, tmp_path, *specs) as front:
            for _ in range(3):
                first = await call(front.url + "/servers/alpha/mcp")
                assert first.status_code == 502
                assert first.json()["error"]["data"] == {"upstream": "alpha", "fault": "invalid"}
                second = await call(front.url + "/servers/beta/mcp")
                assert second.json()["result"] == {"beta": True}
            # alpha's connections were closed, never pooled.
            assert upstream.connections >= 4


async def test_an_sse_answer_with_bytes_past_its_end_ends_with_the_error(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        event = b"event: message\ndata: " + json.dumps(result(request, done=True)).encode()
        stream = sse_head() + chunk(event + b"\n\n") + chunk(b"")
        return stream + json_reply({"jsonrpc": "2.0", "id": 7, "result": {"POISONED": True}})

    async with (
        kept_alive(answer) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url())) as front,
    ):
        for _ in range(2):
            response = await call(front.url + "/mcp")
            events = [
                json.loads(line[5:])
                for line in response.text.splitlines()
                if line.startswith("data:")
            ]
            assert events[0]["result"] == {"done": True}
            assert events[-1]["error"]["data"]["fault"] == "invalid"
            assert b"POISONED" not in response.content
        assert upstream.connections == 2


# -- 3. one caller cannot take every upstream connection, nor the hub's memory ------------


def held_open(release: asyncio.Event) -> Answer:
    """An SSE answer that starts, then holds its connection until `release`."""

    async def answer(request: Received) -> bytes | None:
        if request.body and json.loads(request.body).get("method") == "tools/call":
            await release.wait()
            return None
        return json_reply(result(request))

    return answer


async def test_one_caller_holds_at_most_its_share_of_forwarded_requests(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """alice's 101st held call is refused with 429 (the default limit is 100); bob's goes
    through at once."""
    secret = "s" * 32
    release = asyncio.Event()
    async with kept_alive(held_open(release)) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec, jwt_secret=secret) as front:
            alice = {"Authorization": f"Bearer {mint_token(secret, 'alice')}"}
            held = [asyncio.create_task(call(front.url + "/mcp", **alice)) for _ in range(100)]
            await eventually(lambda: len(upstream.received) == 100, timeout=20)
            refused = await call(front.url + "/mcp", **alice)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == -31429
            assert len(upstream.received) == 100  # it never reached the upstream
            bob = {"Authorization": f"Bearer {mint_token(secret, 'bob')}"}
            assert (await call(front.url + "/mcp", rpc("tools/list", {}, id=1), **bob)).json()[
                "result"
            ] == {}
            release.set()
            await asyncio.gather(*held)
            again = await call(front.url + "/mcp", rpc("tools/list", {}, id=2), **alice)
            assert again.status_code == 200  # the slots came back


async def test_an_open_hub_counts_callers_by_address_behind_a_trusted_proxy(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    release = asyncio.Event()
    async with kept_alive(held_open(release)) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(
            nats_url,
            bucket,
            tmp_path,
            spec,
            max_forwards_per_caller=2,
            trusted_proxies=parse_trusted_proxies("127.0.0.1"),
        ) as front:
            first = {"X-Forwarded-For": "203.0.113.1"}
            held = [asyncio.create_task(call(front.url + "/mcp", **first)) for _ in range(2)]
            await eventually(lambda: len(upstream.received) == 2)
            assert (await call(front.url + "/mcp", **first)).status_code == 429
            # A client that lies about its address to a trusted proxy is still the
            # proxy's last hop: the address the proxy saw, appended last, counts.
            spoof = {"X-Forwarded-For": "198.51.100.9, 203.0.113.1"}
            assert (await call(front.url + "/mcp", **spoof)).status_code == 429
            other = {"X-Forwarded-For": "203.0.113.2"}
            assert (
                await call(front.url + "/mcp", rpc("tools/list", {}, id=1), **other)
            ).status_code == 200
            release.set()
            await asyncio.gather(*held)


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


async def test_answers_read_whole_hold_at_most_the_budget(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Sixteen endless JSON answers at once, with a budget of 16 MiB: none can reach the
    64 MiB a single answer may have, so each ends as `overloaded` (503). The hub's RSS
    grows by the budget and what the HTTP client's read buffers hold per connection (up to
    a few MiB each: libuv reads up to 8 MiB at one wake-up), less than 160 MiB; each
    answer read to its 64 MiB took a GiB."""
    async with kept_alive(endless("json")) as upstream:
        args = ("--upstream", upstream.url(), "--max-upstream-buffer-bytes", str(16 << 20))
        async with hub_process(nats_url, bucket, tmp_path, *args) as hub:
            before = hub.rss()
            answers = await asyncio.gather(*(call(hub.url + "/mcp") for _ in range(16)))
            grown = hub.rss() - before
            assert len(upstream.received) == 16
            for answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["data"]["fault"] == "overloaded"
                assert answer.headers["retry-after"] == "1"
            assert grown < 160 << 20, f"RSS grew by {grown >> 20} MiB"


# -- 4. the legacy door reads an upstream's SSE answer with the same caps ------------------


async def test_the_legacy_door_stops_an_endless_event_at_the_json_limit(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """One `data:` line that never ends: the legacy door's `tools/call` gets the same
    `invalid` fault a JSON answer over 64 MiB gets, well inside its timeout, and the hub
    holds at most that line (it grew by 1.3 GiB)."""
    async with (
        kept_alive(endless("sse")) as upstream,
        hub_process(nats_url, bucket, tmp_path, "--upstream", upstream.url()) as hub,
        httpx.AsyncClient(timeout=30) as client,
    ):
        before = hub.rss()
        legacy = LegacyClient(client, hub.url + "/legacy/mcp")
        await legacy.initialize()
        answer = await legacy.post("tools/call", {"name": "echo", "arguments": {}})
        grown = hub.rss() - before
    error = answer.json()["error"]
    assert error["data"] == {"upstream": "default", "fault": "invalid"}
    assert str(64 << 20) in error["message"]
    assert grown < 200 << 20, f"RSS grew by {grown >> 20} MiB"


# -- 6, 7, 8. the head the upstream gets is the head the hub checked, cleaned ------------


def echoing(request: Received) -> Awaitable[bytes]:
    async def reply() -> bytes:
        return json_reply(result(request))

    return reply()


async def test_trailers_never_reach_the_upstream_as_headers(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """alice's request, chunked, with trailers forging a second Authorization and
    Mcp-Method: the upstream sees the one head the hub authenticated."""
    secret = "s" * 32
    token = mint_token(secret, "alice")
    async with kept_alive(echoing) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec, jwt_secret=secret) as front:
            body = tool_call()
            encoded = json.dumps(body).encode()
            head = post_head(
                *(f"{name}: {value}" for name, value in headers_for(body).items()),
                "Content-Type: application/json",
                f"Authorization: Bearer {token}",
                "Transfer-Encoding: chunked",
            )
            trailers = b"Authorization: Bearer forged\r\nMcp-Method: tasks/cancel\r\n"
            chunked = b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(encoded), encoded, trailers)
            answer = await exchange(port_of(front), head + chunked)
            assert status_of(answer) == 200
    (seen,) = upstream.received
    assert seen.values("authorization") == [f"Bearer {token}"]
    assert seen.values("mcp-method") == ["tools/call"]


SPOOFS = {
    "X-Forwarded-For": "10.9.9.9",
    "X-Forwarded-Host": "bank.example",
    "X-Forwarded-Proto": "https",
    "Forwarded": "for=10.9.9.9",
    "X-Real-IP": "10.9.9.9",
}


async def test_forwarding_headers_are_the_hubs_own(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """What a client says of itself is replaced, not appended to: code upstream that reads
    the first value (Starlette's `headers.get`) sees the hub's, not the spoof."""
    async with kept_alive(echoing) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec) as front:
            await call(front.url + "/mcp", **SPOOFS)
    (seen,) = upstream.received
    assert seen.values("x-forwarded-for") == ["127.0.0.1"]
    assert seen.values("x-forwarded-host") == [f"127.0.0.1:{port_of(front)}"]
    assert seen.values("x-forwarded-proto") == ["http"]
    assert seen.values("forwarded") == [] and seen.values("x-real-ip") == []


async def test_a_trusted_proxys_forwarding_headers_are_kept_and_extended(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with kept_alive(echoing) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        trusted = parse_trusted_proxies("127.0.0.0/8")
        async with hub_in_front(nats_url, bucket, tmp_path, spec, trusted_proxies=trusted) as front:
            await call(front.url + "/mcp", **SPOOFS)
    (seen,) = upstream.received
    assert seen.values("x-forwarded-for") == ["10.9.9.9, 127.0.0.1"]
    assert seen.values("x-forwarded-host") == ["bank.example"]
    assert seen.values("x-forwarded-proto") == ["https"]
    assert seen.values("forwarded") == ["for=10.9.9.9"]
    assert seen.values("x-real-ip") == ["10.9.9.9"]


async def test_connection_named_fields_and_the_hubs_cookie_stay_on_their_side(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Fields the `Connection` header names are hop-by-hop both ways (RFC 9110 §7.6.1);
    the token cookie goes neither up nor, planted by an upstream, down."""

    async def answer(request: Received) -> bytes:
        return json_reply(
            result(request),
            "Connection: X-Upstream-Secret",
            "X-Upstream-Secret: hop",
            "Set-Cookie: taskhub_token=planted; Path=/; HttpOnly",
            "Set-Cookie: session=fine; Path=/",
        )

    async with kept_alive(answer) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec) as front:
            response = await call(
                front.url + "/mcp",
                Connection="keep-alive, X-Client-Secret",
                **{"X-Client-Secret": "hop", "Cookie": "taskhub_token=t0k; theme=dark"},
            )
    assert response.status_code == 200
    assert "x-upstream-secret" not in response.headers
    assert response.headers.get_list("set-cookie") == ["session=fine; Path=/"]
    (seen,) = upstream.received
    assert seen.values("x-client-secret") == []
    assert seen.values("cookie") == ["theme=dark"]


# -- 9. every forwarder error ends as the fault table says, with no traceback -------------


async def test_a_client_gone_before_the_answer_is_counted_with_no_traceback(
    nats_url: str, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    arrived, release = asyncio.Event(), asyncio.Event()

    async def answer(request: Received) -> bytes:
        arrived.set()
        await release.wait()
        return json_reply(result(request))

    async with kept_alive(answer) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec) as front:
            body = tool_call()
            request = (
                post_head(
                    *(f"{name}: {value}" for name, value in headers_for(body).items()),
                    "Content-Type: application/json",
                    f"Content-Length: {len(json.dumps(body))}",
                )
                + json.dumps(body).encode()
            )
            _, writer = await asyncio.open_connection("127.0.0.1", port_of(front))
            writer.write(request)
            await asyncio.wait_for(arrived.wait(), 10)
            writer.close()  # gone before the upstream's head
            metrics = front.hub.metrics
            await eventually(
                lambda: 'outcome="client_gone"' in metrics.render().decode(), timeout=10
            )
            release.set()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


@pytest.mark.parametrize("kind", ["json", "sse"])
async def test_a_corrupt_compressed_answer_is_an_invalid_fault(
    nats_url: str, bucket: str, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def answer(request: Received) -> bytes:
        garbage = b"\x1f\x8b\x08\x00 garbage, not deflate" * 4
        if kind == "json":
            head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip"
            return f"{head}\r\ncontent-length: {len(garbage)}\r\n\r\n".encode() + garbage
        head = sse_head().replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n")
        return head + chunk(garbage) + chunk(b"")

    async with kept_alive(answer) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec) as front:
            response = await call(front.url + "/mcp", **{"Accept-Encoding": "gzip"})
    if kind == "json":
        assert response.status_code == 502
        assert response.json()["error"]["data"] == {"upstream": "default", "fault": "invalid"}
    else:
        last = [line for line in response.text.splitlines() if line.startswith("data:")][-1]
        assert json.loads(last[5:])["error"]["data"]["fault"] == "invalid"
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


# -- 8. the rest of the header hygiene: who sets the cookie, who reads /metrics ------------


async def test_metrics_need_an_operators_token_on_a_hub_with_authentication(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    secret = "s" * 32
    harness = await start_served_hub(nats_url, bucket, tmp_path, jwt_secret=secret)
    try:
        url, client = harness.url + "/metrics", harness.client
        assert (await client.get(url)).status_code == 401
        plain = {"Authorization": f"Bearer {mint_token(secret, 'alice')}"}
        assert (await client.get(url, headers=plain)).status_code == 403
        olga = mint_token(secret, "olga", scope="taskhub:operator")
        answer = await client.get(url, headers={"Authorization": f"Bearer {olga}"})
        assert answer.status_code == 200 and "taskhub_requests_total" in answer.text
    finally:
        await harness.stop()


async def test_public_metrics_serves_them_to_a_scraper_without_a_token(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(
        nats_url, bucket, tmp_path, jwt_secret="s" * 32, public_metrics=True
    )
    try:
        assert (await harness.client.get(harness.url + "/metrics")).status_code == 200
    finally:
        await harness.stop()


async def test_the_page_never_sets_the_token_cookie_itself() -> None:
    """The cookie is the hub's to set, HttpOnly (hub/sign_in.py): the page's script has
    no way to write it, nor a token to write it with."""
    script = (Path(__file__).parents[2] / "hub" / "static" / "dashboard.js").read_text()
    assert "document.cookie" not in script
