"""hub/http/connection.py end to end: what the hub's HTTP connections do beyond uvicorn's.

Whole answers leave in one piece, in order, also when requests are pipelined; a
request that needs no I/O is answered by the connection itself, without the ASGI app;
everything else goes through the app exactly as on plain uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from bridge.wire import kv_subject
from hub.app import HubApp
from hub.front_door.forward_call import Forwarding
from hub.mcp.endpoint import McpEndpoint, Reply
from hub.push.listen_stream import ListenStream
from tests.helpers import (
    HubHarness,
    envelope,
    eventually,
    headers_for,
    new_task_id,
    rpc,
    start_served_hub,
)


class CountingEndpoint:
    """The hub's own endpoint, counting which way each request took."""

    def __init__(self, inner: McpEndpoint) -> None:
        self.inner = inner
        self.hub = inner.hub
        self.through_app = 0
        self.in_place = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.through_app += 1
        await self.inner(scope, receive, send)

    def answer_now(
        self, headers: Mapping[str, str], body: bytes, scope: Scope
    ) -> Reply | ListenStream | Forwarding | None:
        reply = self.inner.answer_now(headers, body, scope)
        self.in_place += reply is not None
        return reply


@pytest.fixture
async def served(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()


def counting(harness: HubHarness) -> CountingEndpoint:
    app = harness.server.config.loaded_app
    assert isinstance(app, HubApp)
    endpoint = app.endpoints["/mcp"]
    assert isinstance(endpoint, McpEndpoint)
    counter = CountingEndpoint(endpoint)
    app.endpoints["/mcp"] = counter  # type: ignore[assignment]
    return counter


async def test_a_cached_task_is_answered_in_place_and_the_rest_by_the_app(
    served: HubHarness, js: Any, bucket: str
) -> None:
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="cached"))
    counter = counting(served)
    unknown = await served.get_task(new_task_id(), id="miss")  # a store read: the app
    assert unknown.json()["error"]["code"] == -32602
    assert (counter.in_place, counter.through_app) == (0, 1)
    for n in range(3):
        response = await served.get_task(tid, id=n)
        assert response.json()["result"]["statusMessage"] == "cached"
        assert response.headers["content-length"] == str(len(response.content))
    discover = await served.call(rpc("server/discover", id="d"))
    assert discover.status_code == 200
    refused = await served.call(rpc("tasks/get", {"taskId": tid}, id="x"), **{"Mcp-Name": "other"})
    assert refused.status_code == 400  # header mismatch, refused in place
    assert (counter.in_place, counter.through_app) == (5, 1)
    cancel = await served.call(rpc("tasks/cancel", {"taskId": tid}, id="c"))
    assert cancel.status_code == 200  # forwarded on the control stream: the app
    assert (counter.in_place, counter.through_app) == (5, 2)
    metrics = (await served.client.get(served.url + "/metrics")).text
    assert 'taskhub_requests_total{method="tasks/get",outcome="ok"} 3' in metrics


async def test_the_test_harness_hub_answers_in_place_and_streams_directly(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    """`start_hub` (behind most tests) wires the in-place hook explicitly, whatever
    uvicorn wraps the app in (its proxy-headers middleware by default)."""
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="cached"))
    await eventually(lambda: hub.hub.cache.get(tid) is not None)
    assert (await hub.get_task(tid)).json()["result"]["statusMessage"] == "cached"
    metrics = hub.hub.metrics
    assert metrics.answered_in_place.value() == 1
    async with hub.listen([tid]) as stream:
        await stream.next()
        # In place when the request came in one read, else by its own task: direct writes.
        opened = metrics.streams_opened
        assert opened.value("in_place") + opened.value("direct") == 1
    assert metrics.streams_opened.value("asgi") == 0
    in_place = 1 + int(metrics.streams_opened.value("in_place"))  # the get, maybe the listen
    text = (await hub.client.get(hub.url + "/metrics")).text
    assert f"taskhub_answered_in_place_total {in_place}" in text


async def test_pipelined_requests_get_whole_responses_in_order(
    hub_on_both: HubHarness, js: Any, bucket: str
) -> None:
    tid, missing = new_task_id(), new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="here"))
    # In place, through the app (a store read), in place: still answered in order.
    asked = [tid, tid, missing, tid, missing, tid]
    requests = b""
    for n, task_id in enumerate(asked):
        body = json.dumps(rpc("tasks/get", {"taskId": task_id}, id=n)).encode()
        head = {**headers_for(rpc("tasks/get", {"taskId": task_id})), "Host": "127.0.0.1"}
        head["Content-Length"] = str(len(body))
        lines = "".join(f"{name}: {value}\r\n" for name, value in head.items())
        requests += f"POST /mcp HTTP/1.1\r\n{lines}\r\n".encode() + body
    host, port = hub_on_both.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(requests)  # all in one write: pipelined
        for n, task_id in enumerate(asked):
            head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            status, *header_lines = head_bytes.decode().split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in header_lines if line)
            assert status == "HTTP/1.1 200 OK" and "transfer-encoding" not in headers
            answer = json.loads(await reader.readexactly(int(headers["content-length"])))
            assert answer["id"] == n
            if task_id == tid:
                assert answer["result"]["statusMessage"] == "here"
            else:
                assert answer["error"]["code"] == -32602
    finally:
        writer.close()


async def test_a_request_split_over_reads_and_one_whole_read_get_the_same_answer(
    served: HubHarness, js: Any, bucket: str
) -> None:
    """The whole-post path takes a request that came in one read; one whose body comes in a
    later read goes through uvicorn's parser, on the same connection, to the same answer."""
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="split"))
    await eventually(lambda: served.hub.cache.get(tid) is not None)
    counter = counting(served)
    body = json.dumps(rpc("tasks/get", {"taskId": tid}, id=7)).encode()
    head = {**headers_for(rpc("tasks/get", {"taskId": tid})), "Host": "127.0.0.1"}
    head["Content-Length"] = str(len(body))
    lines = "".join(f"{name}: {value}\r\n" for name, value in head.items())
    request = f"POST /mcp HTTP/1.1\r\n{lines}\r\n".encode() + body
    host, port = served.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))

    async def answer() -> bytes:
        head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(
            int(line.split(b":")[1])
            for line in head_bytes.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return re.sub(rb"date: [^\r]*\r\n", b"", head_bytes) + await reader.readexactly(length)

    try:
        writer.write(request)
        whole = await answer()
        assert counter.in_place == 1
        writer.write(request[:40])
        await writer.drain()
        await asyncio.sleep(0.05)  # not a synchronisation: either way the answer must match
        writer.write(request[40:])
        split = await answer()
        writer.write(request)
        again = await answer()
    finally:
        writer.close()
    assert whole == split == again
    assert json.loads(whole.partition(b"\r\n\r\n")[2])["result"]["statusMessage"] == "split"


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
async def test_a_client_that_asks_to_close_gets_connection_close_and_a_hang_up(
    hub_on_both: HubHarness, js: Any, bucket: str, version: str
) -> None:
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="bye"))
    body = json.dumps(rpc("tasks/get", {"taskId": tid}, id=1)).encode()
    head = {**headers_for(rpc("tasks/get", {"taskId": tid})), "Host": "127.0.0.1"}
    head["Content-Length"] = str(len(body))
    if version == "HTTP/1.1":
        head["Connection"] = "close"
    lines = "".join(f"{name}: {value}\r\n" for name, value in head.items())
    host, port = hub_on_both.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"POST /mcp {version}\r\n{lines}\r\n".encode() + body)
        raw = await asyncio.wait_for(reader.read(), 10)  # returns only once the hub hangs up
    finally:
        writer.close()
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    headers = [line.lower() for line in head_bytes.decode().split("\r\n")[1:]]
    assert "connection: close" in headers
    assert json.loads(payload)["result"]["statusMessage"] == "bye"


async def raw_listen(
    harness: HubHarness, task_ids: list[str], **extra: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A listen request in one write (so in one read: the whole-post path's); the response head."""
    body = rpc("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, id="raw")
    payload = json.dumps(body).encode()
    head = {**headers_for(body), "Host": "127.0.0.1", "Content-Length": str(len(payload)), **extra}
    lines = "".join(f"{name}: {value}\r\n" for name, value in head.items())
    host, port = harness.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /mcp HTTP/1.1\r\n{lines}\r\n".encode() + payload)
    response_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    return reader, writer, response_head


class Messages:
    """The SSE `data:` messages of a chunked body, in order (a chunk holds whole events)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.unread: list[dict[str, Any]] = []

    async def next(self) -> dict[str, Any]:
        while not self.unread:
            size = int(await asyncio.wait_for(self.reader.readuntil(b"\r\n"), 10), 16)
            data = await self.reader.readexactly(size + 2)
            lines = data.split(b"\n")
            self.unread += [json.loads(line[6:]) for line in lines if line.startswith(b"data: ")]
        return self.unread.pop(0)


async def test_a_listen_stream_runs_in_place_from_ack_to_goodbye(
    served: HubHarness, js: Any, bucket: str
) -> None:
    """All its tasks cached and the caller's: the connection leaves uvicorn and the stream
    runs on it with no task; the hub's shutdown still gets its completion result (H63)."""
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="first"))
    await eventually(lambda: served.hub.cache.get(tid) is not None)
    metrics = served.hub.metrics
    reader, writer, head = await raw_listen(served, [tid])
    messages = Messages(reader)
    try:
        lines = head.decode().lower().split("\r\n")
        assert lines[0] == "http/1.1 200 ok"
        assert {"content-type: text/event-stream", "connection: close"} <= set(lines)
        assert "transfer-encoding: chunked" in lines
        ack = await messages.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["notifications"]["taskIds"] == [tid]
        assert (await messages.next())["params"]["statusMessage"] == "first"
        assert metrics.streams_opened.value("in_place") == 1
        await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="second"))
        assert (await messages.next())["params"]["statusMessage"] == "second"
        served.hub.begin_shutdown()
        goodbye = await messages.next()
        assert goodbye["id"] == "raw" and "result" in goodbye
        assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10) == b"0\r\n\r\n"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the hub hung up
    finally:
        writer.close()
    await eventually(lambda: len(served.hub.fanout) == 0)
    assert metrics.streams_closed.value("shutdown") == 1


@pytest.mark.parametrize("leaves", ["close", "half-close"])
async def test_a_listen_stream_in_place_ends_when_its_client_leaves(
    served: HubHarness, js: Any, bucket: str, leaves: str
) -> None:
    """Closed, or only its sending half (EOF): the stream ends and its slot is free."""
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid))
    await eventually(lambda: served.hub.cache.get(tid) is not None)
    reader, writer, _ = await raw_listen(served, [tid])
    await Messages(reader).next()
    assert len(served.hub.fanout) == 1
    if leaves == "close":
        writer.close()
    else:
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the hub hung up
        writer.close()
    await eventually(lambda: len(served.hub.fanout) == 0)
    assert served.hub.metrics.streams_closed.value("client") == 1
    assert served.hub.streams.acquire("anonymous") is None  # its slot is free again
    served.hub.streams.release("anonymous")


async def test_a_listen_naming_an_uncached_task_takes_the_app(
    served: HubHarness, js: Any, bucket: str
) -> None:
    """Only a store read can tell an unknown task from a foreign one (H46): the app's."""
    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid))
    await eventually(lambda: served.hub.cache.get(tid) is not None)
    reader, writer, head = await raw_listen(served, [tid, new_task_id()])
    try:
        assert b"connection: close" not in head.lower()
        assert (await Messages(reader).next())["params"]["notifications"]["taskIds"] == [tid]
        assert served.hub.metrics.streams_opened.value("direct") == 1
    finally:
        writer.close()


async def test_a_listen_that_fails_in_place_leaves_nothing_behind_for_the_app(
    served: HubHarness, js: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If answering in place raises half-way, the app answers the same request; the
    in-place attempt must not leave its subscription (and stream slot) behind."""
    from hub.mcp import handlers

    tid = new_task_id()
    await js.publish(kv_subject(bucket, tid), envelope(tid))
    await eventually(lambda: served.hub.cache.get(tid) is not None)
    real_ack = handlers.ack_frame
    calls = 0

    def ack_failing_once(*args: Any) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected: the in-place attempt fails")
        return real_ack(*args)

    monkeypatch.setattr(handlers, "ack_frame", ack_failing_once)
    reader, writer, _ = await raw_listen(served, [tid])
    try:
        assert (await Messages(reader).next())["params"]["notifications"]["taskIds"] == [tid]
        assert calls == 2 and served.hub.metrics.streams_opened.value("direct") == 1
        assert len(served.hub.fanout) == 1  # the app's stream only
    finally:
        writer.close()
    await eventually(lambda: len(served.hub.fanout) == 0)
