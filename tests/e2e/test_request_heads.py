"""Request heads are bounded before anything reads them (hub/http/head_limits.py).

Raw-socket clients send heads over each limit, heads that never end, trailers and, from
twenty connections at once, sixty MiB of headers with no token: the hub answers 414 or
431 at the first byte over, on both of its paths, keeps its memory and stays responsive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.raw_http import (
    discover_request,
    exchange,
    hub_process,
    port_of,
    post_head,
    status_of,
)
from tests.helpers import HubHarness, headers_for, rpc, start_served_hub

pytestmark = pytest.mark.timeout(90)

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


async def test_the_whole_post_refuses_what_the_parser_refuses(limited: HubHarness) -> None:
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
                    if peak - before > 512 << 20:  # unbounded heads: stop before the machine
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
