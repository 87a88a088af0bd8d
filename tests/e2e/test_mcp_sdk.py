"""The hub driven by the real `mcp` 2.3.0 Python SDK client, in 2026-07-28 (stateless) mode.

This proves interoperability with a client we did not write: the SDK's own Streamable HTTP
transport, `_meta` stamping and routing headers talk to the hub over a real loopback socket.

- `server/discover`: `mcp.Client` connects in `mode="auto"` (probe discover, fall back to
  `initialize` otherwise) and adopts the hub's discover result, which advertises
  `io.modelcontextprotocol/tasks` and supports only `2026-07-28`.
- `tasks/get`: a raw request through `ClientSession.send_request` (the SDK stamps `_meta`,
  `MCP-Protocol-Version`, `Mcp-Method` and, via `name_param`, `Mcp-Name`) returns the task exactly
  as it was written into NATS.
- `subscriptions/listen` with `notifications.taskIds`: the SDK's `listen()` helper has no
  `taskIds` filter, so the request is sent raw through the same session. The acknowledgement
  arrives through the SDK's `message_handler`, and `notifications/tasks` (unknown to the core
  protocol) reaches a `NotificationBinding` of a `ClientExtension` for the tasks extension: first
  the current state, then the terminal state the test writes into NATS. Abandoning the request
  makes the SDK close its POST, and the hub releases the subscription.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import mcp_types as types
from mcp import Client
from mcp.client import ClientExtension, IncomingMessage, NotificationBinding
from mcp_types.methods import validate_server_result
from pydantic import ConfigDict, TypeAdapter

from bridge.wire import kv_subject
from tests.helpers import (
    PROTOCOL,
    SUB_KEY,
    TASKS_EXT,
    HubHarness,
    envelope,
    eventually,
    new_task_id,
)

TIMEOUT = 10.0


class GetTaskParams(types.RequestParams):
    task_id: str


class GetTaskRequest(types.Request[GetTaskParams, Literal["tasks/get"]]):
    """`tasks/get` of the tasks extension; `name_param` makes the SDK send `Mcp-Name: <taskId>`."""

    method: Literal["tasks/get"] = "tasks/get"
    params: GetTaskParams
    name_param = "taskId"


class TaskNotificationParams(types.NotificationParams):
    """`notifications/tasks` params: `_meta` plus the whole `DetailedTask`, kept verbatim."""

    model_config = ConfigDict(extra="allow")


class TasksExtension(ClientExtension):
    """Declares the tasks extension on every request and collects `notifications/tasks`."""

    identifier = TASKS_EXT

    def __init__(self) -> None:
        self.received: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [
            NotificationBinding(
                method="notifications/tasks",
                params_type=TaskNotificationParams,
                handler=self._on_task,
            )
        ]

    async def _on_task(self, params: TaskNotificationParams) -> None:
        await self.received.put(params.model_dump(by_alias=True, exclude_unset=True))

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(TIMEOUT):
            return await self.received.get()


RAW = TypeAdapter(dict[str, Any])


async def put(js: Any, bucket: str, task_id: str, data: bytes) -> None:
    await js.publish(kv_subject(bucket, task_id), data)


def task_of(data: bytes) -> dict[str, Any]:
    return dict(json.loads(data)["task"])


async def test_sdk_client_discovers_gets_and_listens(hub: HubHarness, js: Any, bucket: str) -> None:
    tid = new_task_id()
    working = envelope(tid, statusMessage="working on it", pollIntervalMs=500)
    await put(js, bucket, tid, working)

    acks: asyncio.Queue[types.SubscriptionsAcknowledgedNotificationParams] = asyncio.Queue()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.SubscriptionsAcknowledgedNotification):
            await acks.put(message.params)

    tasks = TasksExtension()
    client = Client(
        hub.url + "/mcp",
        mode="auto",
        extensions=[tasks],
        message_handler=on_message,
        client_info=types.Implementation(name="taskhub-sdk-test", version="0"),
        read_timeout_seconds=TIMEOUT,
    )
    async with asyncio.timeout(30), client:
        session = client.session

        # (1) server/discover was the negotiation: no initialize fallback happened.
        assert session.initialize_result is None
        discovered = session.discover_result
        assert discovered is not None
        assert discovered.supported_versions == [PROTOCOL]
        assert discovered.capabilities.extensions == {TASKS_EXT: {}}
        assert client.protocol_version == PROTOCOL
        assert client.server_info is not None and client.server_info.name == "taskhub"
        # The adopted model fills in defaults, so also check the raw result against the strict
        # 2026-07-28 schema (ttlMs, cacheScope and resultType are required there).
        raw_discover = await session.send_discover(PROTOCOL)
        validate_server_result("server/discover", PROTOCOL, raw_discover)

        # (2) a raw tasks/get returns the task as written.
        got = await session.send_request(GetTaskRequest(params=GetTaskParams(task_id=tid)), RAW)
        assert got.pop("resultType") == "complete"
        assert got.pop("_meta")["io.modelcontextprotocol/serverInfo"]["name"] == "taskhub"
        assert got == task_of(working)

        # (3) a listen with taskIds: ack, current state, then the terminal state.
        listen = types.SubscriptionsListenRequest(
            params=types.SubscriptionsListenRequestParams(
                notifications=types.SubscriptionFilter(taskIds=[tid])
            )
        )
        # The response only comes when the stream ends, so no read timeout applies to it.
        stream = asyncio.create_task(
            session.send_request(listen, types.SubscriptionsListenResult, 3600.0)
        )
        try:
            async with asyncio.timeout(TIMEOUT):
                ack = await acks.get()
            subscription_id = ack.meta[SUB_KEY] if ack.meta else None
            assert subscription_id is not None
            assert ack.notifications.model_dump(by_alias=True, exclude_none=True) == {
                "taskIds": [tid]
            }

            initial = await tasks.next()
            assert initial.pop("_meta") == {SUB_KEY: subscription_id}
            assert initial == task_of(working)

            done = envelope(
                tid,
                "completed",
                statusMessage="done",
                lastUpdatedAt="2026-01-01T00:00:05Z",
                result={"content": [{"type": "text", "text": "42"}], "isError": False},
            )
            await put(js, bucket, tid, done)
            final = await tasks.next()
            assert final.pop("_meta") == {SUB_KEY: subscription_id}
            assert final == task_of(done)
            assert not stream.done()  # the subscription stays open until we close it
        finally:
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)

        # Abandoning the request makes the SDK abort its POST, which ends the subscription.
        await eventually(lambda: len(hub.hub.fanout) == 0)
