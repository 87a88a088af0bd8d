"""The poll-only upstream `examples/own_store` behind the hub, for end-to-end tests.

`own_store(...)` serves an `OwnStoreServer` on a loopback port and yields it with its MCP
URL; `hub_before(...)` starts a hub whose front door (`/mcp`) fronts that URL with
`--upstream`. Two `hub_before` on the same NATS URL and bucket (different data dirs) are two
replicas in front of the same upstream, and `alternating(...)` a load balancer that sends
each request to the next of them. `call` and `get` are plain httpx requests at a hub's
`/mcp`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from examples.own_store.server import OwnStoreServer
from hub.settings import UpstreamSpec
from tests.helpers import HubHarness, headers_for, rpc, serve_app, start_hub


@contextlib.asynccontextmanager
async def own_store(**options: Any) -> AsyncIterator[tuple[OwnStoreServer, str]]:
    """An `OwnStoreServer(**options)` on loopback, and its `http://127.0.0.1:<port>/mcp`."""
    server = OwnStoreServer(**options)
    served = await serve_app(server)
    try:
        yield server, served.url
    finally:
        await served.stop()


@contextlib.asynccontextmanager
async def hub_before(
    nats_url: str, bucket: str, tmp_path: Path, url: str, **overrides: Any
) -> AsyncIterator[HubHarness]:
    """A hub (config `overrides`) whose front door fronts the upstream at `url`."""
    harness = await start_hub(
        nats_url, bucket, tmp_path, upstreams=(UpstreamSpec(None, url),), **overrides
    )
    try:
        await harness.hub.source.wait_caught_up(10)
        yield harness
    finally:
        await harness.stop()


@contextlib.asynccontextmanager
async def fronted(
    nats_url: str, bucket: str, tmp_path: Path, url: str, replicas: int = 1, **overrides: Any
) -> AsyncIterator[tuple[HubHarness, str]]:
    """One hub in front of `url`, or two replicas behind `alternating`: the first hub, and
    the base URL a client is given (the hub's, or the load balancer's)."""
    async with hub_before(nats_url, bucket, tmp_path / "a", url, **overrides) as front:
        if replicas == 1:
            yield front, front.url
            return
        async with (
            hub_before(nats_url, bucket, tmp_path / "b", url, **overrides) as other,
            alternating(front.url, other.url) as base,
        ):
            yield front, base


async def call(harness: HubHarness, body: dict[str, Any], **headers: str) -> httpx.Response:
    """POST `body` to the hub's `/mcp` with the routing headers a conforming client sends."""
    return await harness.client.post(
        harness.url + "/mcp", json=body, headers={**headers_for(body), **headers}
    )


async def get(harness: HubHarness, task_id: str, **headers: str) -> dict[str, Any]:
    """The hub's whole JSON-RPC answer to `tasks/get` for `task_id`."""
    response = await call(harness, rpc("tasks/get", {"taskId": task_id}), **headers)
    return response.json()  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def alternating(*bases: str) -> AsyncIterator[str]:
    """A reverse proxy on loopback that sends each request to the next of `bases` in turn
    (a load balancer with no affinity), streaming answers back; yields its base URL. A
    client's requests, listen streams included, spread over every replica."""
    turn = itertools.cycle(bases)
    client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"host", b"content-length")]
        request = client.build_request(
            scope["method"], next(turn) + scope["path"], headers=headers, content=body
        )
        response = await client.send(request, stream=True)
        relay = asyncio.ensure_future(_relay(response, send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, gone):
                task.cancel()
            await response.aclose()

    served = await serve_app(app)
    try:
        yield served.url.removesuffix("/mcp")
    finally:
        await served.stop()
        await client.aclose()


async def _relay(response: httpx.Response, send: Send) -> None:
    kept = [
        (k.lower(), v)
        for k, v in response.headers.raw
        if k.lower() not in (b"connection", b"transfer-encoding", b"keep-alive")
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
    async for chunk in response.aiter_raw():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
