"""Forwards answered on callbacks (hub/front_door/forward_now.py), on a warm pool.

A request that comes whole in one read, while the hub holds an idle connection to the
upstream, is sent and answered with no task. Each test warms the pool with one forward
first, then checks that the callback path keeps `Upstream.forward`'s semantics: answers
whose body comes later, faults before and after the head, a client that leaves, an SSE
answer and a task to record handed to a task, CORS headers, the caller's slot given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from hub.settings import UpstreamSpec
from tests.e2e.raw_http import (
    Answer,
    KeptAlive,
    Received,
    Reply,
    hub_in_front,
    json_reply,
    kept_alive,
    port_of,
    post_head,
    result,
    tool_call,
)
from tests.e2e.test_front_door import chunk, sse_head
from tests.helpers import HubHarness, eventually, headers_for

pytestmark = pytest.mark.timeout(60)
DASHBOARD = "https://dash.example"
TASK_STATE = {
    "taskId": "now-task-0000000001",
    "status": "working",
    "createdAt": "2026-12-07T10:00:00+00:00",
    "lastUpdatedAt": "2026-12-07T10:00:00+00:00",
    "ttlMs": 60_000,
}


def request_bytes(request_id: int, *fields: str) -> bytes:
    """A tools/call as a conforming client sends it, head and body in one write."""
    body = json.dumps(tool_call(request_id)).encode()
    head = [f"{name}: {value}" for name, value in headers_for(tool_call(request_id)).items()]
    return post_head(*head, *fields, f"Content-Length: {len(body)}") + body


class Client:
    """One keep-alive connection to the hub; answers framed by length or chunked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, request_id: int, *fields: str) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(request_bytes(request_id, *fields))
        return await self.answer()

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        async with asyncio.timeout(15):
            head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(head[0].split(" ")[1])
            fields = dict(line.lower().split(": ", 1) for line in head[1:] if line)
            if "content-length" in fields:
                return status, fields, await self.reader.readexactly(int(fields["content-length"]))
            body = b""
            while True:  # chunked
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    return status, fields, body
                body += data[:-2]


@contextlib.asynccontextmanager
async def client_of(front: HubHarness) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(front))
    try:
        yield Client(reader, writer)
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def warm(
    nats_url: str, bucket: str, tmp_path: Path, answer: Answer, **overrides: Any
) -> AsyncIterator[tuple[HubHarness, Client, KeptAlive]]:
    """A hub in front of an upstream that answers with `answer`, its pool holding an idle
    connection to it, and a client connected to the hub."""
    async with kept_alive(answer) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with (
            hub_in_front(nats_url, bucket, tmp_path, spec, **overrides) as front,
            client_of(front) as client,
        ):
            status, _, body = await client.ask(0)
            assert status == 200, body
            yield front, client, upstream


class HeldFirst:
    """An upstream's answers, request 1's held until `release` is set."""

    def __init__(self) -> None:
        self.arrived, self.release = asyncio.Event(), asyncio.Event()
        self.connections: Callable[[], int] = lambda: 0  # the upstream's, so far

    async def __call__(self, request: Received) -> bytes:
        if id_of(request) == 1:
            self.arrived.set()
            await self.release.wait()
        return json_reply(result(request))


@contextlib.asynccontextmanager
async def holding_one(
    nats_url: str, bucket: str, tmp_path: Path
) -> AsyncIterator[tuple[HubHarness, Client, HeldFirst]]:
    """A warm hub whose caller may have one forward in flight, and request 1 sent on
    `client` and held at the upstream."""
    held = HeldFirst()
    async with warm(nats_url, bucket, tmp_path, held, max_forwards_per_caller=1) as (
        front,
        client,
        upstream,
    ):
        held.connections = lambda: upstream.connections
        client.writer.write(request_bytes(1))
        await asyncio.wait_for(held.arrived.wait(), 10)
        yield front, client, held


def id_of(request: Received) -> Any:
    """The JSON-RPC id of a request as the upstream read it."""
    return json.loads(request.body)["id"]


def fault_of(body: bytes) -> str:
    """The fault a hub's error answer names; its data is the default upstream's and the
    fault, nothing more."""
    data = json.loads(body)["error"]["data"]
    assert data == {"upstream": "default", "fault": data.get("fault")}, data
    return str(data["fault"])


def outcomes(front: HubHarness, outcome: str) -> float:
    return front.hub.metrics.upstream_requests.value("default", outcome)


def counting_tasks() -> list[asyncio.Task[Any]]:
    """Every task the loop creates from now on (a task factory that keeps a list)."""
    loop = asyncio.get_running_loop()
    made: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        made.append(task)
        return task

    loop.set_task_factory(factory)
    return made


async def test_whole_json_answers_on_a_warm_pool_start_no_task(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        return json_reply(result(request, n=id_of(request)))

    async with warm(nats_url, bucket, tmp_path, answer) as (front, client, upstream):
        made = counting_tasks()
        try:
            for n in range(1, 21):
                status, fields, body = await client.ask(n)
                assert status == 200
                assert json.loads(body)["result"] == {"n": n}
                assert fields["content-type"] == "application/json"
        finally:
            asyncio.get_running_loop().set_task_factory(None)
        hub_tasks = [t for t in made if "/hub/" in t.get_coro().cr_code.co_filename]
        assert hub_tasks == []  # one per forward before: the whole answer came on callbacks
        assert outcomes(front, "ok") == 21
        assert upstream.connections == 1


async def test_a_body_that_comes_after_its_head_is_passed_whole(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> Reply:
        reply = json_reply(result(request, text="x" * 5000))
        return pieces(reply)

    async def pieces(reply: bytes) -> AsyncIterator[bytes]:
        body = reply.index(b"\r\n\r\n") + 4
        for start, end in ((0, body), (body, body + 100), (body + 100, body + 3000)):
            yield reply[start:end]
            await asyncio.sleep(0.02)  # pacing, so each piece is a read of its own
        yield reply[body + 3000 :]

    async with warm(nats_url, bucket, tmp_path, answer) as (front, client, upstream):
        for n in (1, 2):
            status, _, body = await client.ask(n)
            assert status == 200
            assert json.loads(body)["result"] == {"text": "x" * 5000}
        assert outcomes(front, "ok") == 3
        assert upstream.connections == 1  # each answer read to its end: pooled again


async def test_a_body_that_stops_coming_is_a_timeout_and_the_slot_comes_back(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    stall = asyncio.Event()

    async def answer(request: Received) -> Reply:
        reply = json_reply(result(request, text="y" * 1000))
        if id_of(request) == 1:
            return stalled(reply[:-500])
        return reply

    async def stalled(part: bytes) -> AsyncIterator[bytes]:
        yield part
        await stall.wait()  # the rest never comes

    limits = {"upstream_timeout": 0.5, "max_forwards_per_caller": 1}
    async with warm(nats_url, bucket, tmp_path, answer, **limits) as (front, client, _):
        status, _, body = await client.ask(1)
        assert status == 504
        assert fault_of(body) == "timeout"
        status, _, body = await client.ask(2)  # the caller's one slot was given back
        assert status == 200, body
        assert outcomes(front, "timeout") == 1
        stall.set()


async def test_an_upstream_that_hangs_up_on_a_pooled_connection_is_a_reset(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes | None:
        if id_of(request) == 1:
            return None  # hang up without an answer
        return json_reply(result(request))

    async with warm(nats_url, bucket, tmp_path, answer) as (front, client, _upstream):
        status, _, body = await client.ask(1)
        assert status == 502
        assert fault_of(body) == "reset"
        assert json.loads(body)["id"] == 1
        status, _, _ = await client.ask(2)
        assert status == 200
        assert outcomes(front, "reset") == 1


async def test_stray_bytes_behind_a_whole_answer_close_its_connection(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        reply = json_reply(result(request, n=id_of(request)))
        if id_of(request) == 1:
            return reply + json_reply({"jsonrpc": "2.0", "id": 2, "result": {"POISONED": True}})
        return reply

    async with warm(nats_url, bucket, tmp_path, answer) as (front, client, upstream):
        status, _, body = await client.ask(1)
        assert status == 502
        assert fault_of(body) == "invalid"
        status, _, body = await client.ask(2)
        assert json.loads(body)["result"] == {"n": 2}  # never the stray answer
        assert upstream.connections == 2
        assert outcomes(front, "invalid") == 1


async def test_a_client_gone_before_the_answer_closes_the_upstream_request(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with holding_one(nats_url, bucket, tmp_path) as (front, client, held):
        client.writer.close()
        await eventually(lambda: outcomes(front, "client_gone") == 1, timeout=10)
        held.release.set()
        async with client_of(front) as again:  # the slot came back, the pool still works
            status, _, _ = await again.ask(2)
        assert status == 200
        assert held.connections() == 2  # the abandoned request's connection was closed


async def test_an_sse_answer_on_a_warm_pool_is_relayed_with_cors_headers(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        if id_of(request) == 0:
            return json_reply(result(request))
        event = b"event: message\ndata: " + json.dumps(result(request, done=True)).encode()
        return sse_head() + chunk(event + b"\n\n") + chunk(b"")

    async with warm(nats_url, bucket, tmp_path, answer, cors_origins=(DASHBOARD,)) as (
        front,
        client,
        _upstream,
    ):
        status, fields, body = await client.ask(1, f"Origin: {DASHBOARD}")
        assert status == 200
        assert fields["content-type"].startswith("text/event-stream")
        assert fields["access-control-allow-origin"] == DASHBOARD
        data = [line for line in body.decode().splitlines() if line.startswith("data:")]
        assert json.loads(data[0][5:])["result"] == {"done": True}
        assert outcomes(front, "ok") == 2


async def test_a_whole_answer_on_a_warm_pool_carries_cors_headers(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with warm(nats_url, bucket, tmp_path, _json, cors_origins=(DASHBOARD,)) as (_, client, _):
        status, fields, _ = await client.ask(1, f"Origin: {DASHBOARD}")
        assert status == 200
        assert fields["access-control-allow-origin"] == DASHBOARD
        status, fields, _ = await client.ask(2)
        assert "access-control-allow-origin" not in fields


async def _json(request: Received) -> bytes:
    return json_reply(result(request))


async def test_a_task_in_a_whole_answer_is_recorded_before_the_client_sees_it(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        if id_of(request) == 0:
            return json_reply(result(request))
        return json_reply(result(request, resultType="task", **TASK_STATE))

    async with warm(nats_url, bucket, tmp_path, answer) as (front, client, _upstream):
        status, _, body = await client.ask(1)
        assert status == 200
        assert json.loads(body)["result"]["taskId"] == TASK_STATE["taskId"]
        assert front.hub.upstream_tasks.holds(str(TASK_STATE["taskId"]))


async def test_an_answer_that_is_no_jsonrpc_message_is_an_invalid_fault(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        if id_of(request) == 0:
            return json_reply(result(request))
        page = b"<html>oops</html>"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n"
        return head % len(page) + page

    async with warm(nats_url, bucket, tmp_path, answer) as (front, client, _upstream):
        status, _, body = await client.ask(1)
        assert status == 502
        assert fault_of(body) == "invalid"
        assert b"oops" not in body
        assert outcomes(front, "invalid") == 1


async def test_a_caller_past_its_share_is_refused_on_callbacks_too(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with holding_one(nats_url, bucket, tmp_path) as (front, client, held):
        async with client_of(front) as second:  # the same caller: one slot, taken
            status, fields, body = await second.ask(2)
        assert status == 429
        assert fields["retry-after"] == "1"
        assert json.loads(body)["id"] == 2
        held.release.set()
        status, _, _ = await client.answer()
        assert status == 200
        assert outcomes(front, "limited") == 1


async def test_the_client_gets_the_hubs_date_and_server_only(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Forwarded as they came, the upstream's would join the hub's: two of each."""

    async def answer(request: Received) -> bytes:
        return json_reply(result(request), "date: Thu, 01 Jan 1970 00:00:00 GMT", "server: up/1")

    async with warm(nats_url, bucket, tmp_path, answer) as (_, client, _upstream):
        client.writer.write(request_bytes(1))
        head = (await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 10)).lower()
        assert head.count(b"\r\ndate: ") == 1 and b"1970" not in head
        assert head.count(b"\r\nserver: ") == 1 and b"up/1" not in head


async def test_no_answer_head_on_a_warm_pool_is_a_timeout(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    held = HeldFirst()  # request 1 never answered until the end
    limits = {"upstream_timeout": 0.5, "max_forwards_per_caller": 1}
    async with warm(nats_url, bucket, tmp_path, held, **limits) as (front, client, upstream):
        started = asyncio.get_running_loop().time()
        status, _, body = await client.ask(1)
        waited = asyncio.get_running_loop().time() - started
        assert status == 504
        assert fault_of(body) == "timeout"
        assert 0.5 <= waited < 0.5 + 0.125 + 1.0  # the deadline, seen within a tick
        status, _, _ = await client.ask(2)  # on a new connection: the late one was closed
        assert status == 200
        assert upstream.connections == 2
        assert outcomes(front, "timeout") == 1
        held.release.set()
