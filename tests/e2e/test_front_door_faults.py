"""Upstreams that answer wrongly on purpose, behind the front door (hub/front_door/upstream.py).

Bytes written past an answer's end must never answer another request (the connection is
closed, the answer an `invalid` fault); a client gone before the answer and an answer
whose content coding does not decode end as the fault table says, with no traceback.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hub.settings import UpstreamSpec
from tests.e2e.raw_http import (
    Received,
    call,
    hub_in_front,
    json_reply,
    kept_alive,
    port_of,
    post_head,
    result,
    tool_call,
)
from tests.e2e.test_front_door import chunk, sse_head
from tests.helpers import eventually, headers_for, start_served_hub

pytestmark = pytest.mark.timeout(90)

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


# -- forwards answered in place (hub/http/connection.py InPlaceCycle) ----------------------------


async def test_a_request_sent_while_a_forward_is_under_way_is_answered_after_it(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """The first request came whole in one read and is forwarded from the connection
    itself; the client sends the next before the first is answered. That one waits for
    the first answer (held, not read alongside), then is answered in its turn."""
    first_arrived, release = asyncio.Event(), asyncio.Event()

    async def answer(request: Received) -> bytes:
        if json.loads(request.body)["id"] == 1:
            first_arrived.set()
            await release.wait()
        return json_reply(result(request, n=json.loads(request.body)["id"]))

    def request(request_id: int) -> bytes:
        body = json.dumps(tool_call(request_id)).encode()
        fields = [f"{name}: {value}" for name, value in headers_for(tool_call(request_id)).items()]
        return post_head(*fields, f"Content-Length: {len(body)}") + body

    async with (
        kept_alive(answer) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url())) as front,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(front))
        try:
            writer.write(request(1))
            await asyncio.wait_for(first_arrived.wait(), 10)
            writer.write(request(2))  # while the first is at the upstream
            await writer.drain()
            assert len(upstream.received) == 1  # held: not forwarded beside the first
            release.set()
            answers = b""
            async with asyncio.timeout(10):
                while answers.count(b'"result"') < 2:
                    chunk = await reader.read(65536)
                    assert chunk, answers
                    answers += chunk
        finally:
            writer.close()
    assert answers.index(b'"n": 1') < answers.index(b'"n": 2')  # in order
    assert answers.count(b"HTTP/1.1 200 OK") == 2
    requests = front.hub.metrics.upstream_requests
    assert requests.value("default", "ok") == 2


async def test_a_forward_in_place_is_answered_before_the_hub_stops(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """uvicorn's graceful shutdown would close a connection with no request cycle under
    way at once; one forwarding in place is answered first, then closed."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def answer(request: Received) -> bytes:
        arrived.set()
        await release.wait()
        return json_reply(result(request, finished=True))

    body = json.dumps(tool_call()).encode()
    fields = [f"{name}: {value}" for name, value in headers_for(tool_call()).items()]
    async with kept_alive(answer) as upstream:
        front = await start_served_hub(
            nats_url, bucket, tmp_path, upstreams=(UpstreamSpec(None, upstream.url()),)
        )
        stopping = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(front))
            writer.write(post_head(*fields, f"Content-Length: {len(body)}") + body)
            await asyncio.wait_for(arrived.wait(), 10)
            stopping = asyncio.ensure_future(front.stop())

            async def refused() -> bool:  # listeners closed: uvicorn then shut connections
                try:
                    _, probe = await asyncio.open_connection("127.0.0.1", port_of(front))
                except OSError:
                    return True
                probe.close()
                return False

            await eventually(refused, timeout=10)
            release.set()
            reply = await asyncio.wait_for(reader.read(), 10)  # to the end: then it closes
            writer.close()
        finally:
            if stopping is None:
                await front.stop()
            else:
                await asyncio.wait_for(stopping, 20)
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert b'"finished": true' in reply
