"""List changes of an upstream that does not announce them on NATS
(hub/front_door/upstream_events.py).

The upstream is an `mcp` 2.3.0 `MCPServer` whose tools announce changes on the SDK's own
listen bus only (as any server in any language would, on its own `subscriptions/listen`);
the hub in front holds that listen for its own streams and relays what it sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer

from bridge.events import FleetEvents
from tests.e2e.own_store import hub_before
from tests.helpers import HubHarness, SseStream, eventually, headers_for, rpc, serve_app

pytestmark = pytest.mark.timeout(60)
TOOLS_CHANGED = "notifications/tools/list_changed"


@contextlib.asynccontextmanager
async def plain_upstream() -> AsyncIterator[str]:
    server: MCPServer[Any] = MCPServer("plain")

    @server.tool()
    async def change_tools(ctx: Context) -> str:
        """Announces a tool list change, on its own listen bus only."""
        await ctx.notify_tools_changed()
        return "changed"

    @server.tool()
    async def touch(ctx: Context, uri: str) -> str:
        """Announces that a resource changed."""
        await ctx.notify_resource_updated(uri)
        return "touched"

    served = await serve_app(server.streamable_http_app(stateless_http=True))
    try:
        yield served.url
    finally:
        await served.stop()


@contextlib.asynccontextmanager
async def listen(
    front: HubHarness, notifications: dict[str, Any], id: str, **headers: str
) -> AsyncIterator[SseStream]:
    body = rpc("subscriptions/listen", {"notifications": notifications}, id=id)
    request = front.client.build_request(
        "POST", front.url + "/mcp", json=body, headers={**headers_for(body), **headers}
    )
    response = await front.client.send(request, stream=True)
    try:
        events = SseStream(response)
        ack = await events.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged", ack
        yield events
    finally:
        await response.aclose()


async def call_tool(front: HubHarness, name: str, **arguments: Any) -> None:
    body = rpc("tools/call", {"name": name, "arguments": arguments}, id="t")
    headers = {**headers_for(body), "Mcp-Name": name}
    response = await front.client.post(front.url + "/mcp", json=body, headers=headers)
    assert response.status_code == 200, response.text


async def test_a_plain_upstreams_list_changes_reach_the_hubs_streams(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with plain_upstream() as url, hub_before(nats_url, bucket, tmp_path, url) as front:
        held = front.hub.upstream_events._held
        async with (
            listen(front, {"toolsListChanged": True}, "L1") as first,
            listen(front, {"toolsListChanged": True}, "L2") as second,
            listen(front, {"promptsListChanged": True}, "L3") as prompts,
        ):
            # One upstream listen per filter and credential, shared by the streams asking.
            await eventually(lambda: len(held) == 2)
            await _until_open(front, first, "change_tools")
            changed = await second.until(lambda m: m.get("method") == TOOLS_CHANGED)
            assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L2"
            with pytest.raises(TimeoutError):  # never a type it did not ask for
                await prompts.until(lambda m: m.get("method") == TOOLS_CHANGED, timeout=0.5)
        await eventually(lambda: not held)  # the last stream gone: the upstream's listen too


async def test_a_resource_update_reaches_only_the_streams_following_that_uri(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with plain_upstream() as url, hub_before(nats_url, bucket, tmp_path, url) as front:
        wanted = {"resourceSubscriptions": ["file:///a"]}
        async with (
            listen(front, wanted, "A") as on_a,
            listen(front, {"resourceSubscriptions": ["file:///b"]}, "B") as on_b,
        ):
            await eventually(lambda: len(front.hub.upstream_events._held) == 2)
            for _ in range(50):  # until the upstream's listen is open: it gets a touch
                await call_tool(front, "touch", uri="file:///a")
                with contextlib.suppress(TimeoutError):
                    got = await on_a.next(timeout=0.2)
                    break
            else:
                raise AssertionError("no resources/updated relayed")
            assert got["method"] == "notifications/resources/updated"
            assert got["params"]["uri"] == "file:///a"
            with pytest.raises(TimeoutError):
                await on_b.next(timeout=0.5)


async def test_a_service_announcing_on_nats_lets_its_upstream_listens_go(
    nats_url: str, bucket: str, tmp_path: Path, nc: Any
) -> None:
    async with plain_upstream() as url, hub_before(nats_url, bucket, tmp_path, url) as front:
        held = front.hub.upstream_events._held
        async with listen(front, {"toolsListChanged": True}, "L") as events:
            await eventually(lambda: len(held) == 1)
            await FleetEvents(nc, "default").tools_changed()
            await events.until(lambda m: m.get("method") == TOOLS_CHANGED)
            await eventually(lambda: not held)  # NATS speaks for it now: one source, no doubles


async def _until_open(front: HubHarness, events: SseStream, tool: str) -> None:
    """Call `tool` until its change comes through: the upstream's listen opens a moment
    after the hub's stream does."""
    for _ in range(50):
        await call_tool(front, tool)
        with contextlib.suppress(TimeoutError):
            await events.until(lambda m: m.get("method") == TOOLS_CHANGED, timeout=0.2)
            return
    raise AssertionError("no change relayed")
