"""The client side of tasks on the real `mcp` SDK: call a fleet tool, follow it at the hub.

`TaskCalls` goes on a `Client` of a fleet server: it declares the tasks extension and lets
the SDK parse a CreateTaskResult (a `ResultClaim` on `resultType: "task"`). `HubTasks` is
a `Client` of the hub (or of any one server built with `TaskTools`, which serves
them too): `tasks/get`, `tasks/update`, `tasks/cancel`, and `follow()`, a
`subscriptions/listen` stream of one task's full states until it ends. The SDK has no
typed tasks API, so the requests are small `Request` subclasses sent through the session,
which stamps `_meta` and the routing headers (`name_param` gives `Mcp-Name: <taskId>`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import mcp_types as types
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]  # input request → response


class CreateTaskResult(types.Result):
    """What a fleet server answers a task tool call with: flat, `resultType: "task"` (D5)."""

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    status_message: str | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTaskRequest(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class TaskNotificationParams(types.NotificationParams):
    """`notifications/tasks` params: the whole DetailedTask, kept verbatim."""

    model_config = ConfigDict(extra="allow")


class RawResult(types.Result):
    """Any result, every field kept as sent."""

    model_config = ConfigDict(extra="allow")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_unset=True)


def task_state(raw: dict[str, Any]) -> dict[str, Any]:
    """A tasks/get result or notification's params minus the protocol keys: the task."""
    return {k: v for k, v in raw.items() if k not in ("resultType", "_meta")}


def tool_result(state: dict[str, Any]) -> types.CallToolResult:
    """A terminal task as the tool's outcome: its result, or its error raised (H39)."""
    if state["status"] == "completed":
        return types.CallToolResult.model_validate(state["result"])
    if state["status"] == "failed":
        raise MCPError.from_error_data(types.ErrorData.model_validate(state["error"]))
    raise MCPError(types.INTERNAL_ERROR, f"Task {state['taskId']} was {state['status']}")


class TaskCalls(ClientExtension):
    """Declares the tasks extension to a fleet server and parses its CreateTaskResult.

    With `finish` (e.g. `HubTasks.finish`), `Client.call_tool` follows the task to its end
    and returns the tool's result; without it, use `session.call_tool(..., allow_claimed=True)`.
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self, finish: Callable[[CreateTaskResult], Awaitable[types.CallToolResult]] | None = None
    ) -> None:
        self._finish = finish

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._resolve)]

    async def _resolve(self, created: CreateTaskResult, _: ClaimContext) -> types.CallToolResult:
        if self._finish is None:
            raise RuntimeError("the call returned a task: follow it at the hub")
        return await self._finish(created)


class HubTasks(ClientExtension):
    """The hub's task methods over one SDK `Client`; enter `connect(url)` to use them."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self._followers: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._client: Client | None = None

    def notifications(self) -> list[NotificationBinding[Any]]:
        binding = NotificationBinding(
            method="notifications/tasks", params_type=TaskNotificationParams, handler=self._on_task
        )
        return [binding]

    @contextlib.asynccontextmanager
    async def connect(self, url: str, *, timeout: float = 30.0) -> AsyncIterator[HubTasks]:
        client = Client(url, mode="auto", extensions=[self], read_timeout_seconds=timeout)
        async with client:
            self._client = client
            try:
                yield self
            finally:
                self._client = None

    async def get(self, task_id: str) -> dict[str, Any]:
        request = GetTaskRequest(params=TaskIdParams(task_id=task_id))
        return task_state((await self._session.send_request(request, RawResult)).wire())

    async def update(self, task_id: str, responses: dict[str, Any]) -> None:
        params = UpdateTaskParams(task_id=task_id, input_responses=responses)
        await self._session.send_request(UpdateTaskRequest(params=params), RawResult)

    async def cancel(self, task_id: str) -> None:
        request = CancelTaskRequest(params=TaskIdParams(task_id=task_id))
        await self._session.send_request(request, RawResult)

    async def follow(self, task_id: str) -> AsyncIterator[dict[str, Any]]:
        """Every state of the task from now on (the current one first), until it ends."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._followers[task_id] = queue
        listen = types.SubscriptionsListenRequest(
            params=types.SubscriptionsListenRequestParams(
                notifications=types.SubscriptionFilter.model_validate({"taskIds": [task_id]})
            )
        )
        # The listen request only returns when the stream ends; closing it is cancelling it.
        stream = asyncio.create_task(
            self._session.send_request(listen, types.SubscriptionsListenResult, 24 * 3600.0)
        )
        try:
            while True:
                state = await _next(queue, stream)
                yield state
                if state["status"] in TERMINAL:
                    return
        finally:
            self._followers.pop(task_id, None)
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)

    async def finish(
        self, created: CreateTaskResult, answer: Answer | None = None
    ) -> types.CallToolResult:
        """Follow a task to its end, answering its input requests with `answer`."""
        answered: set[str] = set()
        async for state in self.follow(created.task_id):
            if answer is not None and state["status"] == "input_required":
                fresh = {k: v for k, v in state["inputRequests"].items() if k not in answered}
                if fresh:
                    responses = {key: await answer(request) for key, request in fresh.items()}
                    answered.update(responses)
                    await self.update(created.task_id, responses)
            if state["status"] in TERMINAL:
                return tool_result(state)
        raise MCPError(types.INTERNAL_ERROR, "the task stream ended early")

    @property
    def _session(self) -> ClientSession:
        if self._client is None:
            raise RuntimeError("use HubTasks inside `async with hub.connect(url)`")
        return self._client.session

    async def _on_task(self, params: TaskNotificationParams) -> None:
        state = task_state(params.model_dump(by_alias=True, exclude_unset=True))
        queue = self._followers.get(str(state.get("taskId")))
        if queue is not None:
            queue.put_nowait(state)


async def _next(queue: asyncio.Queue[dict[str, Any]], stream: asyncio.Task[Any]) -> dict[str, Any]:
    """The next state, or the listen request's failure if the stream ends first."""
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter, stream}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    stream.result()  # raises the stream's error, if any
    raise MCPError(types.INTERNAL_ERROR, "the hub closed the listen stream")
