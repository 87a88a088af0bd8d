"""Every admission limit end to end: what a greedy or slow client gets, and that it costs
nobody else anything (invariants 4 and 5).

The bookkeeping is unit-tested in tests/test_limits.py; here each limit is hit over real
HTTP against a hub on a real nats-server, with limits and deadlines made small so that
the tests are fast. Where time itself is the subject (slow clients), the tests wait on the
connection with a deadline, never on a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.wire import kv_subject
from tests.helpers import (
    HubHarness,
    envelope,
    eventually,
    headers_for,
    listening,
    mint_token,
    new_task_id,
    rpc,
    start_hub,
    start_served_hub,
)

SECRET = "e2e-limits-secret-0123456789-abcdefghij"


def assert_rpc_error(response: httpx.Response, status: int, code: int, id: Any = None) -> str:
    """A JSON-RPC error with `code` on HTTP `status`, echoing `id` (absent when None)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code
    assert ("id" in body) == (id is not None) and body.get("id") == id
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    return message


async def discover_ok(harness: HubHarness, **headers: str) -> None:
    response = await harness.call(rpc("server/discover", id="alive"), **headers)
    assert response.status_code == 200 and response.json()["id"] == "alive"


# --- request bodies ------------------------------------------------------------------------


async def test_a_body_over_max_body_bytes_is_413_and_the_hub_serves_on(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_hub(nats_url, bucket, tmp_path, max_body_bytes=4096)
    try:
        body = rpc("server/discover", id=1)

        def post(size: int) -> Any:
            data = json.dumps(body).encode()
            data = data[:-1] + b',"pad":"' + b"x" * (size - len(data) - 9) + b'"}'
            assert len(data) == size
            return harness.client.post(
                harness.url + "/mcp", content=data, headers=headers_for(body)
            )

        assert (await post(4096)).status_code == 200  # exactly the limit: fine
        message = assert_rpc_error(await post(4097), 413, -32600)
        assert "4096" in message

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(64):
                yield b" " * 1024

        response = await harness.client.post(
            harness.url + "/mcp", content=chunks(), headers=headers_for(body)
        )
        assert_rpc_error(response, 413, -32600)

        await discover_ok(harness)
    finally:
        await harness.stop()


# --- subscriptions ---------------------------------------------------------------------------


async def test_too_many_task_ids_in_one_listen_is_invalid_params(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_hub(nats_url, bucket, tmp_path, max_task_ids=3)
    try:
        ids = [new_task_id() for _ in range(4)]
        async with listening(harness, ids, id="many") as (response, _):
            await response.aread()
            message = assert_rpc_error(response, 200, -32602, "many")
            assert "3" in message
        async with listening(harness, ids[:3], id="enough") as (response, stream):
            assert response.headers["content-type"] == "text/event-stream"
            assert (await stream.next())["params"]["notifications"] == {"taskIds": []}
        assert harness.hub.metrics.limited.value("task_ids") == 1
    finally:
        await harness.stop()


def bearer(sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(SECRET, sub)}"}


async def assert_stream_refused(harness: HubHarness, who: str, id: Any) -> str:
    async with listening(harness, [], id=id, **bearer(who)) as (response, _):
        await response.aread()
        assert response.headers["retry-after"].isdigit()
        assert int(response.headers["retry-after"]) >= 1
        return assert_rpc_error(response, 429, -31429, id)


async def test_open_streams_are_limited_per_principal_and_in_total(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_hub(
        nats_url,
        bucket,
        tmp_path,
        jwt_secret=SECRET,
        max_streams_per_principal=2,
        max_streams=3,
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            # Keep every stream referenced: a collected reader closes its connection.
            alice = [
                await stack.enter_async_context(
                    listening(harness, [], id=f"a{n}", **bearer("alice"))
                )
                for n in range(2)
            ]
            for _, stream in alice:
                await stream.next()
            message = await assert_stream_refused(harness, "alice", "a2")
            assert "per caller" in message
            # Bob has his own allowance, until the hub as a whole is full.
            _, bob = await stack.enter_async_context(
                listening(harness, [], id="b0", **bearer("bob"))
            )
            await bob.next()
            message = await assert_stream_refused(harness, "bob", "b1")
            assert "the hub has reached its limit" in message
            assert harness.hub.metrics.limited.value("streams") == 2

            # A closed stream frees its slot.
            await alice[0][0].aclose()
            await eventually(lambda: harness.hub.streams.open_for("alice") == 1)
            async with listening(harness, [], id="a3", **bearer("alice")) as (response, s):
                assert response.status_code == 200
                await s.next()
            await discover_ok(harness, **bearer("alice"))  # plain requests are not limited
    finally:
        await harness.stop()


async def test_without_auth_only_the_total_stream_limit_applies(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_hub(nats_url, bucket, tmp_path, max_streams=2)
    try:
        async with listening(harness, [], id=1) as (_, s1), listening(harness, [], id=2) as (_, s2):
            await s1.next()
            await s2.next()
            async with listening(harness, [], id=3) as (response, _):
                await response.aread()
                assert response.headers["retry-after"] == "5"
                assert_rpc_error(response, 429, -31429, 3)
    finally:
        await harness.stop()


# --- polling ---------------------------------------------------------------------------------


async def test_polling_faster_than_poll_interval_is_paced_and_unknown_tasks_alike(
    nats_url: str, bucket: str, tmp_path: Path, js: Any
) -> None:
    harness = await start_hub(nats_url, bucket, tmp_path, poll_burst=3, default_poll_interval=30.0)
    try:
        mine, foreign = new_task_id(), new_task_id()
        await js.publish(kv_subject(bucket, mine), envelope(mine, pollIntervalMs=60_000))
        await js.publish(kv_subject(bucket, foreign), envelope(foreign, owner="someone-else"))

        async def poll(task_id: str) -> list[httpx.Response]:
            return [await harness.get_task(task_id, id=n) for n in range(4)]

        own = await poll(mine)
        assert [r.status_code for r in own] == [200, 200, 200, 429]
        assert all("result" in r.json() for r in own[:3])
        assert_rpc_error(own[3], 429, -31429, 3)
        assert 30 < int(own[3].headers["retry-after"]) <= 60  # the task's own interval

        # A task the caller may not see is paced exactly like one that does not exist.
        answers = {}
        for task_id in (foreign, new_task_id()):
            responses = await poll(task_id)
            answers[task_id] = [
                (r.status_code, r.headers.get("retry-after"), r.json()["error"]["code"])
                for r in responses
            ]
            for r in responses[:3]:
                assert r.json()["error"]["message"] == "Failed to retrieve task: Task not found"
        first, second = answers.values()
        assert first == second
        assert [status for status, _, _ in first] == [200, 200, 200, 429]
        assert first[3][1] == "30" and first[3][2] == -31429
        assert harness.hub.metrics.limited.value("poll_rate") == 3
        await discover_ok(harness)  # other methods are not paced
    finally:
        await harness.stop()


# --- slow clients ------------------------------------------------------------------------------


class RawClient:
    """One HTTP/1.1 connection written byte by byte, as a slow or hostile client would."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed_at: float | None = None

    @classmethod
    async def connect(cls, url: str) -> RawClient:
        host, port = url.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def trickle(self, chunks: list[bytes], every: float) -> None:
        """Send `chunks` one per `every` seconds; stop quietly once the hub hangs up."""
        with contextlib.suppress(ConnectionError):
            for chunk in chunks:
                await asyncio.sleep(every)  # time is the subject: this is the slow client
                await self.send(chunk)

    async def read_all(self, timeout: float) -> bytes:
        """Everything the hub sends until it closes (or resets) the connection."""
        chunks: list[bytes] = []
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionError):
                while chunk := await self.reader.read(65536):
                    chunks.append(chunk)
        self.closed_at = time.monotonic()
        return b"".join(chunks)

    def close(self) -> None:
        self.writer.close()


def request_head(body: dict[str, Any], length: int) -> bytes:
    headers = {**headers_for(body), "Host": "127.0.0.1", "Content-Length": str(length)}
    lines = [f"{name}: {value}" for name, value in headers.items()]
    return ("POST /mcp HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_body_trickled_slower_than_body_timeout_gets_408(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_hub(nats_url, bucket, tmp_path, body_timeout=0.5)
    try:
        body = rpc("server/discover", id=1)
        data = json.dumps(body).encode()
        slow = await RawClient.connect(harness.url)
        try:
            await slow.send(request_head(body, len(data)))
            started = time.monotonic()
            trickler = asyncio.create_task(
                slow.trickle([data[i : i + 1] for i in range(len(data))], every=0.1)
            )
            answer = asyncio.create_task(slow.read_all(timeout=5))
            await discover_ok(harness)  # meanwhile, others are served
            assert not answer.done()
            raw = await answer
            trickler.cancel()
        finally:
            slow.close()
        assert slow.closed_at is not None and slow.closed_at - started < 0.5 + 1.0
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"\r\nconnection: close" in head.lower()
        assert b'"code":-32600' in rest and b"not received within 0.5s" in rest
        await discover_ok(harness)
    finally:
        await harness.stop()


@pytest.fixture
async def served_hub(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    """A hub as `taskhub serve` runs it, with a header deadline of one second."""
    harness = await start_served_hub(
        nats_url, bucket, tmp_path, header_timeout=1.0, body_timeout=1.0
    )
    yield harness
    await harness.stop()


async def test_a_silent_connection_is_closed_at_the_header_deadline(
    served_hub: HubHarness,
) -> None:
    idle = await RawClient.connect(served_hub.url)
    opened = time.monotonic()
    try:
        assert await idle.read_all(timeout=5) == b""
    finally:
        idle.close()
    assert idle.closed_at is not None and 0.9 <= idle.closed_at - opened < 1.0 + 1.0


HEAD_START = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
ENDLESS_HEADERS = [b"X-Slow-%d: y\r\n" % n for n in range(100)]


async def test_a_client_trickling_headers_holds_nothing_else_up(served_hub: HubHarness) -> None:
    slow = await RawClient.connect(served_hub.url)
    try:
        await slow.send(HEAD_START)
        trickler = asyncio.create_task(slow.trickle(ENDLESS_HEADERS, every=0.1))
        for _ in range(5):
            async with httpx.AsyncClient(timeout=2.0) as fresh:  # a new connection each time
                response = await fresh.post(
                    served_hub.url + "/mcp",
                    json=rpc("server/discover"),
                    headers=headers_for(rpc("server/discover")),
                )
                assert response.status_code == 200
        assert not trickler.done()  # the slow client was still at it all along
        trickler.cancel()
    finally:
        slow.close()


async def test_a_client_trickling_headers_is_cut_off_at_the_header_deadline(
    served_hub: HubHarness,
) -> None:
    slow = await RawClient.connect(served_hub.url)
    try:
        await slow.send(HEAD_START)
        started = time.monotonic()
        trickler = asyncio.create_task(slow.trickle(ENDLESS_HEADERS, every=0.1))
        try:
            raw = await slow.read_all(timeout=1.0 + 2.0)
        finally:
            trickler.cancel()
    finally:
        slow.close()
    assert slow.closed_at is not None and slow.closed_at - started < 1.0 + 1.0
    assert raw == b"" or raw.startswith(b"HTTP/1.1 408 ")


async def test_a_kept_alive_connection_trickling_its_next_request_is_cut_off(
    served_hub: HubHarness,
) -> None:
    body = rpc("server/discover", id=1)
    data = json.dumps(body).encode()
    slow = await RawClient.connect(served_hub.url)
    try:
        await slow.send(request_head(body, len(data)) + data)
        first = await asyncio.wait_for(slow.reader.readuntil(b"\r\n\r\n"), 2)
        assert first.startswith(b"HTTP/1.1 200 ")
        await slow.send(HEAD_START)  # the next request starts, then trickles
        started = time.monotonic()
        trickler = asyncio.create_task(slow.trickle(ENDLESS_HEADERS, every=0.1))
        try:
            await slow.read_all(timeout=1.0 + 2.0)
        finally:
            trickler.cancel()
    finally:
        slow.close()
    assert slow.closed_at is not None and slow.closed_at - started < 1.0 + 1.0
