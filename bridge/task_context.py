"""What a task tool's body sees of its task: report progress, ask the client for input.

A body written against `TaskContext` runs two ways. As a task (`TaskRun`), `report()` is
the task's `statusMessage` and `ask()` writes fresh `inputRequests` keys (uuid4: unique for
the task's whole life, H45) and waits until the hub forwards the answer. Inline, for a
synchronous call (`InlineRun`), `report()` becomes `notifications/progress` on the request's
own stream and `ask()` fails with -32021, because on 2026-07-28 a server can only ask for
input mid-call through a task. Questions are gated on the capabilities the *originating*
tools/call declared (D15), since pollers may declare others.
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    ElicitResult,
)
from pydantic import ValidationError

from bridge.vocabulary import TASKS_EXTENSION
from bridge.wire import encode

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

    from bridge.bridge import TaskBridge

InputRequest = Mapping[str, Any]  # {"method": "elicitation/create", "params": {...}}


def missing_capability(required: Mapping[str, Any], message: str) -> MCPError:
    """-32021 with the capabilities the caller must declare (H31)."""
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=message,
        data={"requiredCapabilities": dict(required)},
    )


def required_capability(
    request: InputRequest, capabilities: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The client capability `request` needs that `capabilities` lacks, or None if covered.

    `elicitation: {}` means form support (the pre-modes spelling); url mode must be named.
    """
    method = request.get("method")
    params = request.get("params")
    if method == "elicitation/create":
        mode = params.get("mode", "form") if isinstance(params, Mapping) else "form"
        declared = capabilities.get("elicitation")
        if isinstance(declared, Mapping):
            if mode == "url" and "url" in declared:
                return None
            if mode != "url" and ("form" in declared or "url" not in declared):
                return None
        return {"elicitation": {"url" if mode == "url" else "form": {}}}
    if method == "sampling/createMessage":
        return None if isinstance(capabilities.get("sampling"), Mapping) else {"sampling": {}}
    if method == "roots/list":
        return None if isinstance(capabilities.get("roots"), Mapping) else {"roots": {}}
    return None  # an unknown method is the state machine's to refuse (bridge.states)


def elicitation_form(message: str, requested_schema: Mapping[str, Any]) -> dict[str, Any]:
    """A form-mode `elicitation/create` input request (docs/protocol.md#task-input)."""
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": dict(requested_schema)},
    }


def _as_json(request: InputRequest) -> dict[str, Any]:
    value = msgspec.json.decode(encode(request))
    if not isinstance(value, dict):
        raise TypeError("an input request is a JSON object")
    return value


class TaskContext(ABC):
    """Handed to a task tool's body in the parameter annotated `TaskContext`."""

    @property
    @abstractmethod
    def task_id(self) -> str | None:
        """The task's id; None when the call runs inline (no task)."""

    @abstractmethod
    async def report(self, message: str) -> None:
        """Tell the client how far the work is (the task's statusMessage)."""

    @abstractmethod
    async def ask_all(
        self, requests: Sequence[InputRequest], *, status_message: str | None = None
    ) -> list[Any]:
        """Ask several questions at once; the answers come back in order.

        Each answer is the client's result object for its request (`ElicitResult`,
        `CreateMessageResult` or `ListRootsResult` as JSON), taken verbatim.
        """

    async def ask(self, request: InputRequest, *, status_message: str | None = None) -> Any:
        """Ask one question and wait for its answer (see `ask_all`)."""
        (answer,) = await self.ask_all([request], status_message=status_message)
        return answer

    async def elicit(
        self,
        message: str,
        requested_schema: Mapping[str, Any],
        *,
        status_message: str | None = None,
    ) -> ElicitResult:
        """Ask the user to fill in a form; raises -32602 if the answer is no ElicitResult."""
        answer = await self.ask(
            elicitation_form(message, requested_schema), status_message=status_message
        )
        try:
            return ElicitResult.model_validate(answer)
        except ValidationError:
            raise MCPError(
                INVALID_PARAMS, "The elicitation answer is not an ElicitResult"
            ) from None


class TaskRun(TaskContext):
    """The context of a tool running as a task: writes go through the bridge.

    Answers arrive through `deliver()` (the bridge's input handler). A question counts as
    pending until its answer is delivered; `report()` never withdraws one, it re-issues the
    pending requests unchanged with the new message (an allowed, idempotent write).
    """

    def __init__(
        self, bridge: TaskBridge, task_id: str, client_capabilities: Mapping[str, Any]
    ) -> None:
        self._bridge = bridge
        self._task_id = task_id
        self._capabilities = client_capabilities
        self._pending: dict[str, tuple[InputRequest, asyncio.Future[Any]]] = {}

    @property
    def task_id(self) -> str:
        return self._task_id

    async def report(self, message: str) -> None:
        waiting = {
            key: request for key, (request, answer) in self._pending.items() if not answer.done()
        }
        if waiting:
            await self._bridge.require_input(self._task_id, waiting, status_message=message)
        else:
            await self._bridge.working(self._task_id, status_message=message)

    async def ask_all(
        self, requests: Sequence[InputRequest], *, status_message: str | None = None
    ) -> list[Any]:
        if not requests:
            return []
        for request in requests:
            required = required_capability(request, self._capabilities)
            if required is not None:
                raise missing_capability(
                    required, f"The tools/call did not declare what {request.get('method')} needs"
                )
        loop = asyncio.get_running_loop()
        # As stored (plain JSON), so report() can re-issue a request that compares equal.
        asked = {uuid.uuid4().hex: _as_json(request) for request in requests}
        # Registered before the write: an answer may be delivered as soon as it is stored.
        for key, request in asked.items():
            self._pending[key] = (request, loop.create_future())
        keys = list(asked)
        try:
            await self._bridge.require_input(self._task_id, asked, status_message=status_message)
            return list(await asyncio.gather(*(self._pending[key][1] for key in keys)))
        finally:
            for key in keys:
                _, answer = self._pending.pop(key)
                answer.cancel()  # no-op when answered

    def deliver(self, responses: Mapping[str, Any]) -> None:
        """Hand answers to the questions waiting for them; other keys are ignored."""
        for key, response in responses.items():
            entry = self._pending.get(key)
            if entry is not None and not entry[1].done():
                entry[1].set_result(response)


class InlineRun(TaskContext):
    """The context of a task tool called synchronously (the client did not declare tasks).

    Reports become `notifications/progress` (sent only if the request carried a
    progressToken); questions fail with -32021 asking the client to declare tasks.
    """

    def __init__(self, context: Context[Any, Any]) -> None:
        self._context = context
        self._reports = 0

    @property
    def task_id(self) -> None:
        return None

    async def report(self, message: str) -> None:
        self._reports += 1  # progress must increase; the count of reports does
        await self._context.report_progress(self._reports, None, message)

    async def ask_all(
        self, requests: Sequence[InputRequest], *, status_message: str | None = None
    ) -> list[Any]:
        raise missing_capability(
            {"extensions": {TASKS_EXTENSION: {}}},
            "This tool asks for input while it runs, which needs a task: "
            f"declare the {TASKS_EXTENSION} extension",
        )
