"""The poll-only upstream `examples/own_store` behind the hub, for end-to-end tests.

`own_store(...)` serves an `OwnStoreServer` on a loopback port and yields it with its MCP
URL; `hub_before(...)` starts a hub whose front door (`/mcp`) fronts that URL with
`--upstream`. Two `hub_before` on the same NATS URL and bucket (different data dirs) are two
replicas in front of the same upstream. `call` and `get` are plain httpx requests at a
hub's `/mcp`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from examples.own_store.server import OwnStoreServer
from hub.upstream import UpstreamSpec
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


async def call(harness: HubHarness, body: dict[str, Any], **headers: str) -> httpx.Response:
    """POST `body` to the hub's `/mcp` with the routing headers a conforming client sends."""
    return await harness.client.post(
        harness.url + "/mcp", json=body, headers={**headers_for(body), **headers}
    )


async def get(harness: HubHarness, task_id: str, **headers: str) -> dict[str, Any]:
    """The hub's whole JSON-RPC answer to `tasks/get` for `task_id`."""
    response = await call(harness, rpc("tasks/get", {"taskId": task_id}), **headers)
    return response.json()  # type: ignore[no-any-return]
