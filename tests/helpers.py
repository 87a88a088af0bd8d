"""Test helpers: an in-process hub on a real loopback port, MCP requests, an SSE reader."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from bench.ports import free_port as free_port  # the tests' one way to pick a port
from hub.config import Config
from hub.runtime import Hub
from hub.store.listener import Nobody
from hub.store.snapshot import Rejected, TaskSnapshot

PROTOCOL = "2026-07-28"
TASKS_EXT = "io.modelcontextprotocol/tasks"
TASKS_CAPS: dict[str, Any] = {"extensions": {TASKS_EXT: {}}}
SUB_KEY = "io.modelcontextprotocol/subscriptionId"


def rpc(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    id: Any = 1,
    caps: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A well-formed request body for `method` (params get the required `_meta`)."""
    params = dict(params or {})
    params.setdefault(
        "_meta",
        {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": TASKS_CAPS if caps is None else caps,
            "io.modelcontextprotocol/clientInfo": {"name": "taskhub-tests", "version": "0"},
        },
    )
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def memory_held_by(work: Callable[[], object]) -> int:
    """The bytes Python allocated while `work` ran and still holds after it (tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def headers_for(body: dict[str, Any]) -> dict[str, str]:
    """The routing headers a conforming client sends with `body`."""
    headers = {
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": body["method"],
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    task_id = body.get("params", {}).get("taskId")
    if body["method"].startswith("tasks/") and isinstance(task_id, str):
        headers["Mcp-Name"] = task_id
    return headers


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = 10.0,
    interval: float = 0.02,
) -> None:
    """Poll `check` until it holds; fail with a clear message at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


@dataclass
class SseStream:
    """Reads one SSE response: JSON-RPC messages in order, and comment lines counted."""

    response: httpx.Response
    comments: int = 0
    _lines: AsyncIterator[str] | None = field(default=None, repr=False)

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            return await self._next_event()

    async def _next_event(self) -> dict[str, Any]:
        if self._lines is None:
            self._lines = self.response.aiter_lines()
        data: list[str] = []
        async for line in self._lines:
            if line == "":
                if data:
                    return json.loads("\n".join(data))  # type: ignore[no-any-return]
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "id":
                raise AssertionError("hub sent an SSE id: line (H25)")
        raise EOFError("stream ended")

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                message = await self._next_event()
                if predicate(message):
                    return message


@dataclass
class SseEvents:
    """Reads a stream of named SSE events (the operator stream): (event name, JSON data)."""

    response: httpx.Response
    _lines: AsyncIterator[str] | None = field(default=None, repr=False)

    async def next(self, timeout: float = 10.0) -> tuple[str, Any]:
        async with asyncio.timeout(timeout):
            return await self._next_event()

    async def _next_event(self) -> tuple[str, Any]:
        if self._lines is None:
            self._lines = self.response.aiter_lines()
        name, data = "message", []
        async for line in self._lines:
            if line == "":
                if data:
                    return name, json.loads("\n".join(data))
                name = "message"
                continue
            if line.startswith(":"):
                continue
            field_name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field_name == "event":
                name = value
            elif field_name == "data":
                data.append(value)
        raise EOFError("stream ended")

    async def until(
        self, name: str, predicate: Callable[[Any], bool] = lambda _: True, timeout: float = 10.0
    ) -> Any:
        """The data of the next `name` event that satisfies `predicate`."""
        async with asyncio.timeout(timeout):
            while True:
                event, data = await self._next_event()
                if event == name and predicate(data):
                    return data

    async def opening(self, timeout: float = 10.0) -> tuple[Any, dict[str, Any]]:
        """`hello`, and the tasks up to `synced` by id."""
        tasks: dict[str, Any] = {}
        async with asyncio.timeout(timeout):
            name, hello = await self._next_event()
            assert name == "hello", (name, hello)
            while True:
                name, data = await self._next_event()
                if name == "synced":
                    assert data == {"tasks": len(tasks)}
                    return hello, tasks
                assert name == "task", (name, data)
                tasks[data["task"]["taskId"]] = data


@dataclass
class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 in this event loop."""

    server: uvicorn.Server
    task: asyncio.Task[None]
    url: str  # http://127.0.0.1:<port>/mcp

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def serve_app(app: ASGIApp, http: Any = "auto") -> Served:
    """`app` on a free loopback port; `http` is uvicorn's protocol (class or name)."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", http=http)
    )
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started or task.done(), timeout=15)
    if task.done():
        await task
        raise RuntimeError("server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    return Served(server, task, f"http://127.0.0.1:{port}/mcp")


@contextlib.asynccontextmanager
async def fleet_server(
    module: Any, nats_url: str, bucket: str, server_id: str
) -> AsyncIterator[str]:
    """A fleet server of examples/fleet (`module.build_server`) on a loopback port: its URL."""
    from bridge import TaskBridge  # late, like the hub's imports below

    def connect() -> Any:
        return TaskBridge.connect(nats_url, server_id=server_id, bucket=bucket)

    server = module.build_server(connect, poll_interval_ms=100)
    served = await serve_app(server.streamable_http_app(stateless_http=True, host="127.0.0.1"))
    try:
        yield served.url
    finally:
        await served.stop()


@dataclass
class HubHarness:
    """A hub served by uvicorn on 127.0.0.1 in this event loop, with a client."""

    hub: Hub
    server: uvicorn.Server
    task: asyncio.Task[None]
    url: str
    client: httpx.AsyncClient

    async def call(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        merged = {**headers_for(body), **headers}
        return await self.client.post(self.url + "/mcp", json=body, headers=merged)

    async def get_task(self, task_id: str, id: Any = 1) -> httpx.Response:
        return await self.call(rpc("tasks/get", {"taskId": task_id}, id=id))

    @contextlib.asynccontextmanager
    async def listen(
        self, task_ids: list[str] | None, id: Any = "listen-1", **extra: Any
    ) -> AsyncIterator[SseStream]:
        notifications: dict[str, Any] = {} if task_ids is None else {"taskIds": task_ids}
        body = rpc("subscriptions/listen", {"notifications": notifications, **extra}, id=id)
        request = self.client.build_request(
            "POST", self.url + "/mcp", json=body, headers=headers_for(body)
        )
        response = await self.client.send(request, stream=True)
        try:
            yield SseStream(response)
        finally:
            await response.aclose()

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task
        await self.client.aclose()

    @contextlib.asynccontextmanager
    async def operator_stream(self, query: str = "", **headers: str) -> AsyncIterator[SseEvents]:
        """`GET /operator/stream?query`; fails unless it answers 200."""
        request = self.client.build_request(
            "GET", f"{self.url}/operator/stream?{query}", headers=headers
        )
        response = await self.client.send(request, stream=True)
        try:
            if response.status_code != 200:
                await response.aread()
                raise AssertionError(f"{response.status_code}: {response.text}")
            assert response.headers["content-type"] == "text/event-stream"
            yield SseEvents(response)
        finally:
            await response.aclose()


@contextlib.asynccontextmanager
async def listening(
    harness: HubHarness, task_ids: list[str], id: Any = "L", **headers: str
) -> AsyncIterator[tuple[httpx.Response, SseStream]]:
    """A listen request with the caller's own headers; yields the response and its events."""
    body = rpc("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, id=id)
    request = harness.client.build_request(
        "POST", harness.url + "/mcp", json=body, headers={**headers_for(body), **headers}
    )
    response = await harness.client.send(request, stream=True)
    try:
        yield response, SseStream(response)
    finally:
        await response.aclose()


async def start_hub(
    nats_url: str, bucket: str, data_dir: Path, *, asgi_only: bool = False, **overrides: Any
) -> HubHarness:
    """A hub app on uvicorn with the hub's connection protocol (hub/http/connection.py), or
    with `asgi_only` on uvicorn's own, as under any other ASGI server (no direct writes,
    no header deadline). `start_served_hub` runs the whole `taskhub serve` server."""
    from hub.app import create_app  # late: unit tests import these helpers too
    from hub.http.connection import hub_protocol

    config = Config(port=0, bucket=bucket, nats_url=nats_url, data_dir=data_dir, **overrides)
    hub = Hub(config, nats_url)
    app = create_app(config, nats_url, hub)
    http = (
        "httptools"
        if asgi_only
        else hub_protocol(config.header_timeout, app.answer_now, config.head_limits)
    )
    served = await serve_app(app, http)
    server, task, url = served.server, served.task, served.url.removesuffix("/mcp")
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(10.0), limits=httpx.Limits(max_connections=None)
    )
    return HubHarness(hub, server, task, url, client)


def fingerprint(function: Any) -> str:
    """A short hash of a function's source, comments and blank lines left out: the contract
    tests (tests/test_*_internals.py) pin the library code an adapter was verified against."""
    source = inspect.getsource(function)
    # Comments and blank lines are not behaviour.
    code = [line.split("#", 1)[0].rstrip() for line in source.splitlines()]
    return hashlib.sha256("\n".join(line for line in code if line).encode()).hexdigest()[:8]


def new_task_id() -> str:
    import uuid

    return str(uuid.uuid4())


def envelope(
    task_id: str,
    status: str = "working",
    *,
    owner: str = "anonymous",
    server: str = "srv-1",
    created_at: str = "2026-01-01T00:00:00Z",
    ttl_ms: int | None = None,
    **task_fields: Any,
) -> bytes:
    """A raw KV value as any writer could store it (contract 3)."""
    task: dict[str, Any] = {
        "taskId": task_id,
        "status": status,
        "createdAt": created_at,
        "lastUpdatedAt": created_at,
        "ttlMs": ttl_ms,
    }
    if status == "input_required":
        task.setdefault("inputRequests", {"q1": {"method": "roots/list", "params": {}}})
    if status == "completed":
        task.setdefault("result", {"resultType": "complete", "content": []})
    if status == "failed":
        task.setdefault("error", {"code": -32603, "message": "boom"})
    task.update(task_fields)
    return json.dumps({"owner": owner, "server": server, "task": task}).encode()


async def start_served_hub(
    nats_url: str, bucket: str, data_dir: Path, **overrides: Any
) -> HubHarness:
    """A hub run exactly as `taskhub serve` runs one (`hub.commands.server.build_server`: the header
    connection protocol, keep-alive and concurrency limits), on a free loopback port in
    this event loop."""
    from hub.commands.server import build_server  # late: unit tests import these helpers too

    overrides.setdefault("log_level", "warning")
    config = Config(port=0, bucket=bucket, nats_url=nats_url, data_dir=data_dir, **overrides)
    server = build_server(config, nats_url)
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started or task.done(), timeout=15)
    if task.done():
        await task
        raise RuntimeError("server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(10.0), limits=httpx.Limits(max_connections=None)
    )
    return HubHarness(server.hub, server, task, f"http://127.0.0.1:{port}", client)


def mint_token(secret: str, sub: str | None = "alice", *, ttl: float = 300.0, **claims: Any) -> str:
    """An HS256 JWT for `sub` (None leaves it out), valid for `ttl` seconds; `claims` add to
    or override the registered ones (a claim given as None is left out)."""
    from tests.tokens import jwt  # late: only the auth tests need it

    now = time.time()
    body: dict[str, Any] = {"sub": sub, "iat": int(now), "exp": now + ttl, **claims}
    body = {name: value for name, value in body.items() if value is not None}
    # Built by hand, not by the verifier's library: the hub is what is under test.
    return jwt(body, secret.encode(), "HS256")


class Recorder(Nobody):
    """A store listener (hub/store/listener.py) that keeps what it hears."""

    def __init__(self) -> None:
        self.changes: list[TaskSnapshot] = []
        self.removals: list[TaskSnapshot] = []
        self.rejections: list[Rejected] = []

    def changed(self, snapshot: TaskSnapshot) -> None:
        self.changes.append(snapshot)

    def removed(self, snapshot: TaskSnapshot) -> None:
        self.removals.append(snapshot)

    def rejected(self, reason: Rejected) -> None:
        self.rejections.append(reason)
