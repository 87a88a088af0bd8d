"""Fleet change events on listen streams: servers announce, the hub delivers (issue 11 item 2).

Events are published on the session's real nats-server the way a server does it
(`bridge.FleetEvents`, or a raw NATS publish for what any language may send); streams are
real SSE over loopback, and one is the real `mcp` 2.3.0 client's `Client.listen`. To show a
stream got *nothing* it should not have, each stream at an upstream's endpoint also follows
an end marker, a resource updated last: events of one publisher reach the hub in order and
each stream writes its events in the order they came, so what has not arrived before the
marker was never sent. The stream at `/mcp`, which can follow no event, gets a task's state
written after every marker has arrived elsewhere instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from mcp import Client

from bridge import FleetEvents, TaskBridge
from bridge.wire import event_subject
from examples.fleet import alpha
from hub.settings import UpstreamSpec
from tests.helpers import (
    SUB_KEY,
    HubHarness,
    SseStream,
    fleet_server,
    headers_for,
    rpc,
    start_hub,
)

pytestmark = pytest.mark.timeout(60)

NOWHERE = "http://127.0.0.1:9/mcp"  # never called: listen streams are the hub's own
TOOLS = "notifications/tools/list_changed"
PROMPTS = "notifications/prompts/list_changed"
RESOURCES = "notifications/resources/list_changed"
UPDATED = "notifications/resources/updated"


def only_public(principal: str, service: str, uri: str) -> bool:
    """A resource rule for the test: `secret://` URIs are nobody's to follow."""
    return not uri.startswith("secret://")


@pytest.fixture
async def front(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_hub(
        nats_url,
        bucket,
        tmp_path,
        upstreams=(UpstreamSpec("alpha", NOWHERE), UpstreamSpec("beta", NOWHERE)),
        resource_rule="tests.e2e.test_fleet_events:only_public",
    )
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()


@contextlib.asynccontextmanager
async def listen(
    harness: HubHarness, path: str, notifications: dict[str, Any], id: Any
) -> AsyncIterator[tuple[dict[str, Any], SseStream]]:
    """A listen stream at `path`; yields its ack and the stream."""
    body = rpc("subscriptions/listen", {"notifications": notifications}, id=id)
    request = harness.client.build_request(
        "POST", harness.url + path, json=body, headers=headers_for(body)
    )
    response = await harness.client.send(request, stream=True)
    try:
        assert response.status_code == 200, (await response.aread()).decode()
        stream = SseStream(response)
        ack = await stream.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        yield ack["params"]["notifications"], stream
    finally:
        await response.aclose()


END = "end://marker"


def is_end(message: dict[str, Any]) -> bool:
    return message["method"] == UPDATED and message["params"]["uri"] == END


def is_sentinel(message: dict[str, Any]) -> bool:
    return message["method"] == "notifications/tasks" and (
        message["params"].get("statusMessage") == "sentinel"
    )


async def until(stream: SseStream, last: Any) -> list[dict[str, Any]]:
    """Every message before the first one `last` accepts."""
    seen: list[dict[str, Any]] = []
    while not last(message := await stream.next()):
        seen.append(message)
    return seen


def kinds(messages: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(m["method"], m["params"].get("uri")) for m in messages]


async def test_each_event_reaches_exactly_the_streams_that_asked_for_it(
    front: HubHarness, nc: nats.NATS, nats_url: str, bucket: str
) -> None:
    async with await TaskBridge.connect(nats_url, "events-1", bucket=bucket) as bridge:
        sentinel = await bridge.create(owner="anonymous", ttl_ms=600_000)
        async with contextlib.AsyncExitStack() as stack:
            streams = {}
            for name, path, asked in (
                ("tools", "/servers/alpha/mcp", {"toolsListChanged": True}),
                (
                    "rest",
                    "/servers/alpha/mcp",
                    {
                        "promptsListChanged": True,
                        "resourcesListChanged": True,
                        "resourceSubscriptions": ["file:///a", "secret://k", END],
                    },
                ),
                ("nothing", "/servers/alpha/mcp", {"toolsListChanged": False}),
                ("beta", "/servers/beta/mcp", {"toolsListChanged": True}),
                ("hub-only", "/mcp", {"toolsListChanged": True, "taskIds": [sentinel.task_id]}),
            ):
                if path != "/mcp":
                    asked.setdefault("resourceSubscriptions", [END])
                ack, stream = await stack.enter_async_context(listen(front, path, asked, id=name))
                streams[name] = (ack, stream)
            # The acks grant what each asked for, where it can be honoured.
            assert streams["tools"][0] == {"toolsListChanged": True, "resourceSubscriptions": [END]}
            assert streams["rest"][0] == {
                "promptsListChanged": True,
                "resourcesListChanged": True,
                "resourceSubscriptions": ["file:///a", END],  # the rule keeps secret:// out
            }
            assert streams["nothing"][0] == {"resourceSubscriptions": [END]}
            assert streams["hub-only"][0] == {"taskIds": [sentinel.task_id]}  # no upstream
            await streams["hub-only"][1].next()  # the sentinel's current state

            events = FleetEvents(nc, "alpha")
            await events.tools_changed()
            await events.prompts_changed()
            await events.resources_changed()
            await events.resource_updated("file:///a")
            await events.resource_updated("file:///b")  # nobody follows it
            await events.resource_updated("secret://k")  # nobody may follow it
            await FleetEvents(nc, "gamma").tools_changed()  # no such endpoint
            await FleetEvents(nc, "beta").resource_updated(END)
            await events.resource_updated(END)

            got = {
                name: kinds(await until(stream, is_end))
                for name, (_, stream) in streams.items()
                if name != "hub-only"
            }
            # Every event has been handled; the task written now comes after any of them.
            await bridge.working(sentinel.task_id, status_message="sentinel")
            got["hub-only"] = kinds(await until(streams["hub-only"][1], is_sentinel))
    assert got == {
        "tools": [(TOOLS, None)],
        "rest": [(PROMPTS, None), (RESOURCES, None), (UPDATED, "file:///a")],
        "nothing": [],
        "beta": [],  # alpha's events stay on alpha's endpoint
        "hub-only": [],
    }
    assert front.hub.metrics.events_received.value("tools") == 2


async def test_every_event_frame_carries_the_subscription_id(
    front: HubHarness, nc: nats.NATS
) -> None:
    async with listen(
        front, "/servers/beta/mcp", {"resourceSubscriptions": ["note://1"]}, id=41
    ) as (ack, stream):
        assert ack == {"resourceSubscriptions": ["note://1"]}
        await FleetEvents(nc, "beta").resource_updated("note://1")
        message = await stream.next()
    assert message == {
        "jsonrpc": "2.0",
        "method": UPDATED,
        "params": {"_meta": {SUB_KEY: 41}, "uri": "note://1"},
    }


async def test_an_update_for_named_principals_reaches_only_their_streams(
    nats_url: str, bucket: str, tmp_path: Path, nc: nats.NATS
) -> None:
    from tests.helpers import mint_token

    secret = "s" * 40
    harness = await start_hub(
        nats_url, bucket, tmp_path, upstreams=(UpstreamSpec("alpha", NOWHERE),), jwt_secret=secret
    )
    try:
        streams = {}
        async with contextlib.AsyncExitStack() as stack:
            for who in ("alice", "bob"):
                harness.client.headers["authorization"] = f"Bearer {mint_token(secret, who)}"
                _, stream = await stack.enter_async_context(
                    listen(
                        harness,
                        "/servers/alpha/mcp",
                        {"resourceSubscriptions": ["doc://x", "doc://y"]},
                        id=who,
                    )
                )
                streams[who] = stream
            events = FleetEvents(nc, "alpha")
            await events.resource_updated("doc://x", principals=["bob"])
            await events.tools_changed()  # nobody asked for it
            await events.resource_updated("doc://y")  # everyone following it
            bob = [(await streams["bob"].next())["params"]["uri"] for _ in range(2)]
            alice = (await streams["alice"].next())["params"]["uri"]
    finally:
        await harness.stop()
    assert bob == ["doc://x", "doc://y"]
    assert alice == "doc://y"  # the update before it was not hers to hear of


@pytest.mark.parametrize(
    ("subject", "data", "reason"),
    [
        ("mcp.events.alpha.tools.renamed", b"{}", "subject"),
        ("mcp.events.al$ha.tools.list_changed", b"{}", "subject"),
        ("mcp.events.alpha.resources.updated", b"not json", "payload"),
        ("mcp.events.alpha.resources.updated", b'{"uri": ""}', "payload"),
        ("mcp.events.alpha.resources.updated", b'{"uri": 5}', "payload"),
        ("mcp.events.alpha.resources.updated", b'{"uri": "a://b", "principals": "bob"}', "payload"),
    ],
)
async def test_a_malformed_event_is_dropped_counted_and_harms_nothing(
    front: HubHarness, nc: nats.NATS, subject: str, data: bytes, reason: str
) -> None:
    async with listen(
        front,
        "/servers/alpha/mcp",
        {"resourceSubscriptions": ["a://b"], "toolsListChanged": True},
        id=1,
    ) as (_, stream):
        await nc.publish(subject, data)
        await nc.publish(event_subject("alpha", "tools.list_changed"), b"")  # well-formed
        assert (await stream.next())["method"] == TOOLS
    assert front.hub.metrics.events_rejected.value(reason) == 1


async def test_a_bad_filter_is_invalid_params_and_opens_nothing(front: HubHarness) -> None:
    for notifications, field in (
        ({"toolsListChanged": "yes"}, "toolsListChanged"),
        ({"resourceSubscriptions": "file:///a"}, "resourceSubscriptions"),
        ({"resourceSubscriptions": [1]}, "resourceSubscriptions"),
    ):
        body = rpc("subscriptions/listen", {"notifications": notifications}, id="bad")
        response = await front.call(body)
        assert response.json()["error"]["code"] == -32602
        assert field in response.json()["error"]["message"]
    assert len(front.hub.fanout) == 0


async def test_the_python_sdk_client_listens_for_tool_changes_at_the_front_door(
    nats_url: str, bucket: str, tmp_path: Path, nc: nats.NATS
) -> None:
    async with fleet_server(alpha, nats_url, bucket, "alpha-ev") as alpha_url:
        harness = await start_hub(
            nats_url, bucket, tmp_path, upstreams=(UpstreamSpec(None, alpha_url),)
        )
        try:
            async with Client(harness.url + "/mcp") as client:
                # Discover went through the hub: it offers what it delivers.
                assert client.server_capabilities.tools is not None
                assert client.server_capabilities.tools.list_changed is True
                async with client.listen(
                    tools_list_changed=True, resource_subscriptions=["r://1"]
                ) as sub:
                    await FleetEvents(nc).tools_changed()  # the bare upstream's service
                    await FleetEvents(nc).resource_updated("r://1")
                    seen = []
                    async with asyncio.timeout(10):
                        async for event in sub:
                            seen.append(type(event).__name__)
                            if len(seen) == 2:
                                break
        finally:
            await harness.stop()
    assert len(seen) == 2, seen
