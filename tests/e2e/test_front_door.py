"""The hub as front door (`--upstream`): one URL serves a whole MCP server, tasks included.

The upstream is the example fleet's `alpha` (TaskTools on the real `mcp` 2.3.0 MCPServer) on
a loopback port, or, where a test needs a fault or a witness of what arrived, a raw TCP
server written here that speaks HTTP/1.1 by hand. The hub runs with its own connection
protocol; clients are the real `mcp` Python client and httpx. Waits poll, never sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from mcp import Client

from examples.fleet import alpha, beta
from examples.fleet.client import demo
from examples.fleet.tasks_client import CreateTaskResult, HubTasks, TaskCalls
from hub.settings import UpstreamSpec
from tests.helpers import (
    TASKS_EXT,
    HubHarness,
    SseStream,
    eventually,
    fleet_server,
    free_port,
    headers_for,
    rpc,
    start_hub,
)

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def hub_in_front(
    nats_url: str, bucket: str, tmp_path: Path, *upstreams: UpstreamSpec, **overrides: Any
) -> AsyncIterator[HubHarness]:
    harness = await start_hub(nats_url, bucket, tmp_path, upstreams=upstreams, **overrides)
    try:
        await harness.hub.source.wait_caught_up(10)
        yield harness
    finally:
        await harness.stop()


@pytest.fixture
async def alpha_url(nats_url: str, bucket: str, server_id: str) -> AsyncIterator[str]:
    async with fleet_server(alpha, nats_url, bucket, server_id) as url:
        yield url


@pytest.fixture
async def front(
    alpha_url: str, nats_url: str, bucket: str, tmp_path: Path
) -> AsyncIterator[HubHarness]:
    async with hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, alpha_url)) as harness:
        yield harness


# -- a raw upstream: HTTP/1.1 by hand, for faults and for seeing what arrived --------------


@dataclass
class Arrived:
    head: bytes
    body: bytes

    @property
    def headers(self) -> list[tuple[str, str]]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        pairs = [line.split(":", 1) for line in lines if line]
        return [(name.strip().lower(), value.strip()) for name, value in pairs]

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


Handler = Callable[[Arrived, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}


@dataclass
class RawUpstream:
    handler: Handler
    arrived: list[Arrived] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/mcp"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            arrived = Arrived(head, b"")
            length = int(arrived.header("content-length") or 0)
            arrived.body = await reader.readexactly(length)
            self.arrived.append(arrived)
            await self.handler(arrived, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_upstream(handler: Handler) -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream(handler)
    upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
    try:
        yield upstream
    finally:
        upstream.server.close()


def http_response(status: str, content_type: str, body: bytes, *extra: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"content-type: {content_type}", f"content-length: {len(body)}"]
    return ("\r\n".join([*head, *extra]) + "\r\n\r\n").encode() + body


def sse_head() -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_event(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + msgspec.json.encode(message) + b"\n\n"


def streaming_until_closed(closed: asyncio.Event) -> Handler:
    """An SSE answer that sends one progress event, then waits; `closed` is set when the
    hub lets go of the connection."""

    async def handler(
        _: Arrived, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(sse_head() + chunk(sse_event(PROGRESS)))
        await writer.drain()
        await reader.read()  # b"" once the hub closes its side
        closed.set()

    return handler


def answering(status: str, content_type: str, body: bytes, *extra: str) -> Handler:
    async def handler(_: Arrived, __: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(http_response(status, content_type, body, *extra))
        await writer.drain()

    return handler


async def post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, json=body, headers={**headers_for(body), **headers})


def tool_call(name: str = "echo", id: Any = 7) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": {}}, id=id)


# -- a real client with one URL ----------------------------------------------------------


async def test_the_python_sdk_client_does_everything_at_the_hubs_url(front: HubHarness) -> None:
    url = front.url + "/mcp"
    async with Client(url, extensions=[TaskCalls()]) as client:
        # server/discover went through the hub: alpha's own answer, tasks merged in.
        assert client.server_info is not None and client.server_info.name == "alpha"
        capabilities = client.server_capabilities.model_dump(exclude_none=True)
        assert TASKS_EXT in capabilities["extensions"]
        assert "tools" in capabilities
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert tools == {"slow_report", "deploy"}
        created = await client.session.call_tool(
            "slow_report", {"topic": "q4", "steps": 3, "step_seconds": 0.05}, allow_claimed=True
        )
    assert isinstance(created, CreateTaskResult), created
    async with HubTasks().connect(url, timeout=10) as tasks:
        states = [state async for state in tasks.follow(created.task_id)]
    assert states[-1]["status"] == "completed", states
    assert states[-1]["result"]["content"] == [
        {"type": "text", "text": "Report on q4: 3 sections compiled"}
    ]
    assert front.hub.metrics.upstream_requests.value("default", "ok") >= 3


async def test_discover_keeps_the_upstreams_answer_and_adds_the_extension(
    front: HubHarness, alpha_url: str
) -> None:
    direct = (await post(alpha_url, rpc("server/discover", {}))).json()["result"]
    through = (await post(front.url + "/mcp", rpc("server/discover", {}))).json()["result"]
    assert through["capabilities"]["extensions"][TASKS_EXT] == {}
    # alpha advertises it too (it serves tasks/* itself); the rest must be alpha's own.
    through["capabilities"]["extensions"].pop(TASKS_EXT)
    direct["capabilities"].setdefault("extensions", {}).pop(TASKS_EXT, None)
    assert through == direct  # caching hints, instructions, serverInfo: the upstream's


# -- forwarding as it is -------------------------------------------------------------------


async def test_a_request_reaches_the_upstream_unchanged(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    answer = msgspec.json.encode({"jsonrpc": "2.0", "id": 7, "result": {"content": []}})
    handler = answering("200 OK", "application/json", answer, "x-upstream: yes")
    async with (
        raw_upstream(handler) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        upstream_host = upstream.url.split("/")[2]
        body = rpc("tools/call", {"name": "echo", "arguments": {"q": "é"}}, id=7)
        headers = {
            **headers_for(body),
            "Mcp-Name": "echo",
            "Mcp-Param-Q": "=?base64?w6k=?=",
            "Authorization": "Bearer upstream-token",
            "Keep-Alive": "timeout=5",  # hop-by-hop: for the hub, not the upstream
        }
        # Odd spacing on purpose: the upstream must get these bytes, not a re-encoding.
        content = json.dumps(body, indent=3, ensure_ascii=False).encode()
        response = await front.client.post(front.url + "/mcp", content=content, headers=headers)
    assert response.status_code == 200
    assert response.content == answer and response.headers["x-upstream"] == "yes"
    (arrived,) = upstream.arrived
    assert arrived.body == content  # byte for byte, spacing included
    sent = {name.lower(): value for name, value in headers.items()}
    for name in ("mcp-protocol-version", "mcp-method", "mcp-name", "mcp-param-q", "authorization"):
        assert arrived.header(name) == sent[name], name
    assert arrived.header("keep-alive") is None
    assert arrived.header("x-forwarded-for") == "127.0.0.1"
    assert arrived.header("host") == upstream_host  # the upstream's own


async def test_an_sse_answer_is_relayed_as_it_comes_not_when_it_ends(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    first_seen = asyncio.Event()
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    result = {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}

    async def handler(_: Arrived, __: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head() + chunk(sse_event(progress)))
        await writer.drain()
        await first_seen.wait()  # the client has the first event while this one still waits
        writer.write(chunk(sse_event(result)) + chunk(b""))
        await writer.drain()

    async with (
        raw_upstream(handler) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        body = tool_call()
        request = front.client.build_request(
            "POST", front.url + "/mcp", json=body, headers=headers_for(body)
        )
        response = await front.client.send(request, stream=True)
        events = SseStream(response)
        assert response.headers["content-type"].startswith("text/event-stream")
        assert await events.next() == progress
        first_seen.set()
        assert await events.next() == result
        await response.aclose()


async def test_a_client_that_leaves_cancels_the_upstream_request(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    upstream_saw_close = asyncio.Event()
    handler = streaming_until_closed(upstream_saw_close)

    async with (
        raw_upstream(handler) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        body = tool_call()
        request = front.client.build_request(
            "POST", front.url + "/mcp", json=body, headers=headers_for(body)
        )
        response = await front.client.send(request, stream=True)
        await SseStream(response).next()
        await response.aclose()
        await asyncio.wait_for(upstream_saw_close.wait(), 10)
        await eventually(
            lambda: front.hub.metrics.upstream_requests.value("default", "client_gone") == 1
        )


# -- faults ------------------------------------------------------------------------------


async def never_answer(_: Arrived, reader: asyncio.StreamReader, __: asyncio.StreamWriter) -> None:
    await reader.read()


async def reset_mid_stream(
    _: Arrived, __: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    event = sse_event(PROGRESS)
    writer.write(sse_head() + chunk(event))
    await writer.drain()
    writer.transport.abort()  # RST, no terminating chunk


FAULTS: dict[str, tuple[Handler | None, int, str]] = {
    "refused": (None, 502, "refused"),
    "timeout": (never_answer, 504, "timeout"),
    "non-json": (answering("200 OK", "text/html", b"<html>hello</html>"), 502, "invalid"),
    "bad-json": (answering("200 OK", "application/json", b'{"jsonrpc": '), 502, "invalid"),
    "5xx": (
        answering("503 Service Unavailable", "text/plain", b"down for maintenance"),
        502,
        "status",
    ),
    "reset-before-answer": (lambda a, r, w: _abort(w), 502, "reset"),
}


async def _abort(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_an_upstream_fault_is_a_clear_error_and_the_hub_stays_healthy(
    fault: str, nats_url: str, bucket: str, tmp_path: Path
) -> None:
    handler, status, label = FAULTS[fault]
    async with contextlib.AsyncExitStack() as stack:
        if handler is None:  # a port nothing listens on any more
            closed = await stack.enter_async_context(raw_upstream(never_answer))
            url = closed.url
            assert closed.server is not None
            closed.server.close()
            await closed.server.wait_closed()
        else:
            url = (await stack.enter_async_context(raw_upstream(handler))).url
        front = await stack.enter_async_context(
            hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, url), upstream_timeout=0.5)
        )
        response = await asyncio.wait_for(post(front.url + "/mcp", tool_call(id="f")), 10)
        assert response.status_code == status, response.text
        error = response.json()
        assert error["id"] == "f"
        assert error["error"]["code"] == -32603
        assert error["error"]["data"] == {"upstream": "default", "fault": label}
        assert error["error"]["message"].startswith("Upstream 'default': ")
        # The hub's own work goes on: readiness. A task it does not hold is the
        # upstream's to answer (docs/front-door.md#tasks-the-upstream-keeps): the same fault.
        assert (await front.client.get(front.url + "/readyz")).status_code == 200
        missing = (await asyncio.wait_for(front.get_task("nope"), 10)).json()
        assert missing["error"]["data"] == {"upstream": "default", "fault": label}
        metrics = (await front.client.get(front.url + "/metrics")).text
        assert 'taskhub_upstream_up{upstream="default"} 0' in metrics
        assert f'taskhub_upstream_faults_total{{upstream="default",fault="{label}"}} 2' in metrics


async def test_a_stream_cut_off_mid_way_ends_with_the_error_event(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        raw_upstream(reset_mid_stream) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        body = tool_call(id="cut")
        request = front.client.build_request(
            "POST", front.url + "/mcp", json=body, headers=headers_for(body)
        )
        response = await front.client.send(request, stream=True)
        events = SseStream(response)
        assert (await events.next())["method"] == "notifications/progress"
        last = await events.next()
        assert last["id"] == "cut"
        assert last["error"]["code"] == -32603 and last["error"]["data"]["fault"] == "reset"
        await response.aclose()


async def test_discover_with_the_upstream_down_is_the_same_clear_error(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        raw_upstream(answering("502 Bad Gateway", "text/html", b"<h1>502</h1>")) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        response = await post(front.url + "/mcp", rpc("server/discover", {}, id="d"))
        assert response.status_code == 502
        assert response.json()["error"]["data"] == {"upstream": "default", "fault": "status"}


async def test_upstream_4xx_answers_pass_through_with_their_challenge(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    challenge = 'www-authenticate: Bearer resource_metadata="http://up/.well-known/oauth"'
    body = b'{"error":"invalid_token"}'
    async with (
        raw_upstream(
            answering("401 Unauthorized", "application/json", body, challenge)
        ) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        response = await post(front.url + "/mcp", tool_call())
    assert response.status_code == 401 and response.content == body
    assert response.headers["www-authenticate"].startswith("Bearer resource_metadata=")


# -- several upstreams, one snapshot -------------------------------------------------------


@contextlib.asynccontextmanager
async def alpha_and_beta_behind_a_hub(
    nats_url: str, bucket: str, tmp_path: Path
) -> AsyncIterator[HubHarness]:
    """The example fleet with the hub as front door: /servers/alpha/mcp, /servers/beta/mcp."""
    async with (
        fleet_server(alpha, nats_url, bucket, "alpha-1") as alpha_url,
        fleet_server(beta, nats_url, bucket, "beta-1") as beta_url,
        hub_in_front(
            nats_url,
            bucket,
            tmp_path,
            UpstreamSpec("alpha", alpha_url),
            UpstreamSpec("beta", beta_url),
        ) as front,
    ):
        yield front


async def test_named_upstreams_each_at_their_own_path_share_the_tasks(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with alpha_and_beta_behind_a_hub(nats_url, bucket, tmp_path) as front:
        names = {}
        for name in ("alpha", "beta"):
            listed = await post(f"{front.url}/servers/{name}/mcp", rpc("tools/list", {}))
            names[name] = {tool["name"] for tool in listed.json()["result"]["tools"]}
        assert names["alpha"] == {"slow_report", "deploy"}
        assert names["alpha"].isdisjoint(names["beta"]) and names["beta"]
        # /mcp without a bare upstream is the hub alone: tasks only.
        bare = await post(front.url + "/mcp", rpc("tools/list", {}))
        assert (bare.status_code, bare.json()["error"]["code"]) == (404, -32601)
        # A task made through alpha's path is one task: every path reads the same snapshot.
        alpha_mcp = f"{front.url}/servers/alpha/mcp"
        async with Client(alpha_mcp, extensions=[TaskCalls()]) as client:
            created = await client.session.call_tool(
                "slow_report", {"steps": 1, "step_seconds": 0}, allow_claimed=True
            )
        assert isinstance(created, CreateTaskResult)
        for path in ("/servers/beta/mcp", "/mcp"):
            got = await post(front.url + path, rpc("tasks/get", {"taskId": created.task_id}))
            assert got.json()["result"]["taskId"] == created.task_id


async def test_the_fleet_demo_runs_with_one_hub_url_per_server(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with alpha_and_beta_behind_a_hub(nats_url, bucket, tmp_path) as front:
        lines: list[str] = []
        finals = await demo(
            f"{front.url}/servers/alpha/mcp",
            f"{front.url}/servers/beta/mcp",
            say=lines.append,
            step_seconds=0,
        )
    assert {name: state["status"] for name, state in finals.items()} == {
        "slow_report": "completed",
        "deploy": "completed",
        "lookup": "failed",
    }
    assert any("question: Deploy billing to production?" in line for line in lines)
    # The listen streams were the hub's: the servers were never asked for one.
    assert front.hub.metrics.requests.value("subscriptions/listen", "ok") == 3


async def test_sigterm_stops_the_hub_while_a_client_holds_a_forwarded_stream(
    tmp_path: Path,
) -> None:
    from tests.e2e.test_serve import taskhub_command

    upstream_saw_close = asyncio.Event()
    endless = streaming_until_closed(upstream_saw_close)

    async with raw_upstream(endless) as upstream:
        port = free_port()
        args = [
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path),
            "--upstream",
            upstream.url,
        ]
        proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args)
        try:
            url = f"http://127.0.0.1:{port}/readyz"
            async with httpx.AsyncClient(timeout=5) as client:

                async def ready() -> bool:
                    try:
                        return (await client.get(url)).status_code == 200
                    except httpx.TransportError:
                        return False

                await eventually(ready, timeout=10)
                body = tool_call()
                async with client.stream(
                    "POST", f"http://127.0.0.1:{port}/mcp", json=body, headers=headers_for(body)
                ) as response:
                    await SseStream(response).next()  # the forwarded stream is open
                    stopping = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                    async with asyncio.timeout(20):
                        assert await proc.wait() == 0
                    assert time.monotonic() - stopping < 15  # the grace is bounded
            await asyncio.wait_for(upstream_saw_close.wait(), 5)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_a_compressed_answer_reaches_the_client_decoded(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    result = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "z"}]}}
    packed = gzip.compress(sse_event(result))

    async def handler(_: Arrived, __: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = sse_head().replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n")
        writer.write(head + chunk(packed) + chunk(b""))
        await writer.drain()

    async with (
        raw_upstream(handler) as upstream,
        hub_in_front(nats_url, bucket, tmp_path, UpstreamSpec(None, upstream.url)) as front,
    ):
        response = await post(front.url + "/mcp", tool_call(), **{"Accept-Encoding": "identity"})
    assert "content-encoding" not in response.headers  # the hub decoded it: none applies now
    assert response.content == sse_event(result)
