"""The task side of `examples/own_store`: task states as pure functions over
DetailedTask, the in-memory store, and the tools whose bodies move tasks on timers."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta

from bridge.vocabulary import (
    SUPPORTED_VERSIONS,
    TASKS_EXTENSION,
)
from bridge.wire import TERMINAL, DetailedTask, InvalidEnvelope, Status, TaskError, check_task
from examples.own_store.rpc import (
    INTERNAL_ERROR,
    RpcError,
    encode_result,
    missing_capability,
    task_not_found,
)

MAX_MS = 86_400_000  # a tool's delay: a day at most keeps every timer sane

# -- task state: pure functions over DetailedTask (docs/protocol.md#task-state) ----------------


def timestamp(now: float) -> str:
    """ISO 8601 with its zone, to the millisecond."""
    return (
        datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


class TerminalTask(ValueError):
    """Terminal states never change (H43)."""


def new_task(now: float, ttl_ms: int | None, poll_interval_ms: int | None) -> DetailedTask:
    """A fresh `working` task; 16 random bytes make an id of the task-id syntax."""
    created = timestamp(now)
    return DetailedTask(
        taskId=secrets.token_urlsafe(16),
        status="working",
        createdAt=created,
        lastUpdatedAt=created,
        ttlMs=ttl_ms,
        pollIntervalMs=UNSET if poll_interval_ms is None else poll_interval_ms,
    )


def revised(
    task: DetailedTask,
    status: Status,
    now: float,
    *,
    message: str | None = None,
    input_requests: dict[str, dict[str, Any]] | None = None,
    result: dict[str, Any] | None = None,
    error: TaskError | None = None,
) -> DetailedTask:
    """`task` moved to `status`, carrying exactly that status's variant field (H39)."""
    if task.status in TERMINAL:
        raise TerminalTask(f"task {task.taskId} is {task.status}")
    if status == "failed" and message is None and error is not None:
        message = error.message  # H40: a failed task has a statusMessage
    new = msgspec.structs.replace(
        task,
        status=status,
        lastUpdatedAt=timestamp(now),
        statusMessage=UNSET if message is None else message,
        inputRequests=UNSET if input_requests is None else input_requests,
        result=UNSET if result is None else result,
        error=UNSET if error is None else error,
    )
    try:
        check_task(new)
    except InvalidEnvelope as exc:
        raise ValueError(str(exc)) from None
    return new


def tool_result(text: str, **extra: Any) -> dict[str, Any]:
    """A CallToolResult with one text block; stored results carry their resultType (H35)."""
    return {"content": [{"type": "text", "text": text}], **extra, "resultType": "complete"}


# -- the store ---------------------------------------------------------------------------------

OnAnswer = Callable[[dict[str, Any]], None]


@dataclass
class Entry:
    """One stored task: its owner, its state, and what moves it along."""

    owner: str
    task: DetailedTask
    encoded: bytes  # the task's JSON, once per revision, for every answer that carries it
    expires_at: float | None  # epoch seconds; None = never
    timers: list[asyncio.TimerHandle] = field(default_factory=list)  # the body's next steps
    expiry: asyncio.TimerHandle | None = None  # frees the memory once the ttl is over
    on_answer: OnAnswer | None = None  # what the tool does with answers it asked for


class TaskStore:
    """Tasks by id, in memory; each expires `ttl_ms` after its creation."""

    def __init__(self, ttl_ms: int | None, poll_interval_ms: int | None) -> None:
        self.ttl_ms = ttl_ms
        self.poll_interval_ms = poll_interval_ms
        self.entries: dict[str, Entry] = {}

    def create(self, owner: str) -> Entry:
        now = time.time()
        task = new_task(now, self.ttl_ms, self.poll_interval_ms)
        expires_at = None if self.ttl_ms is None else now + self.ttl_ms / 1000
        entry = Entry(owner, task, msgspec.json.encode(task), expires_at)
        self.entries[task.taskId] = entry
        if self.ttl_ms is not None:
            # The timer only frees memory; `live` decides by the clock, which may be sooner.
            loop = asyncio.get_running_loop()
            entry.expiry = loop.call_later(self.ttl_ms / 1000, self._expire, task.taskId)
        return entry

    def live(self, task_id: str) -> Entry | None:
        entry = self.entries.get(task_id)
        if entry is not None and entry.expires_at is not None and time.time() >= entry.expires_at:
            self._expire(task_id)
            return None
        return entry

    def find(self, task_id: str, caller: str) -> Entry:
        """The caller's live task; unknown, expired and foreign ones look alike (H46)."""
        entry = self.live(task_id)
        if entry is None or entry.owner != caller:
            raise task_not_found()
        return entry

    def change(self, entry: Entry, status: Status, **fields: Any) -> None:
        """Write the next revision; a terminal one stops whatever would move it further."""
        entry.task = revised(entry.task, status, time.time(), **fields)
        entry.encoded = msgspec.json.encode(entry.task)
        if status in TERMINAL:
            self.stop(entry)

    def later(self, entry: Entry, delay_ms: float, step: Callable[[], None]) -> None:
        """Run `step` after `delay_ms`, unless the task ended or expired meanwhile."""

        def fire() -> None:
            if self.live(entry.task.taskId) is entry and entry.task.status not in TERMINAL:
                step()

        entry.timers.append(asyncio.get_running_loop().call_later(delay_ms / 1000, fire))

    def answer(self, entry: Entry, responses: dict[str, Any]) -> None:
        """tasks/update: take the answers to outstanding keys, ignore the rest (H49, H50)."""
        outstanding = entry.task.inputRequests
        if entry.task.status != "input_required" or not isinstance(outstanding, dict):
            return
        taken = {key: value for key, value in responses.items() if key in outstanding}
        if not taken:
            return
        remaining = {key: value for key, value in outstanding.items() if key not in taken}
        if remaining:
            message = entry.task.statusMessage or None
            self.change(entry, "input_required", message=message, input_requests=remaining)
        else:
            self.change(entry, "working", message="Input received")
        if entry.on_answer is not None:
            entry.on_answer(taken)

    def cancel(self, entry: Entry) -> None:
        """tasks/cancel: a live task ends cancelled; a terminal one stays as it is (D23)."""
        if entry.task.status not in TERMINAL:
            self.change(entry, "cancelled", message="Cancelled by the client")

    def stop(self, entry: Entry) -> None:
        for timer in entry.timers:
            timer.cancel()
        entry.timers.clear()
        entry.on_answer = None

    def close(self) -> None:
        for entry in self.entries.values():
            self.stop(entry)
            if entry.expiry is not None:
                entry.expiry.cancel()

    def _expire(self, task_id: str) -> None:
        entry = self.entries.get(task_id)
        if entry is None or entry.expires_at is None:
            return
        left = entry.expires_at - time.time()
        if left > 0:  # the loop's clock ran ahead of the wall clock: try again then
            entry.expiry = asyncio.get_running_loop().call_later(left, self._expire, task_id)
            return
        self.stop(entry)
        del self.entries[task_id]


# -- the tools: arguments decoded once at the edge, then a task body on timers ----------------

Ms = Annotated[int, Meta(ge=0, le=MAX_MS)]


class SlowArgs(msgspec.Struct, frozen=True):
    """Work for `ms`, reporting three steps, then complete with `value` as the text."""

    ms: Ms = 1000
    value: str = "done"


class AskArgs(msgspec.Struct, frozen=True):
    """Ask `question` (a form elicitation, key `confirm`), then complete `ms` after the
    answer, echoing it."""

    question: str = "Proceed?"
    ms: Ms = 100


class FailArgs(msgspec.Struct, frozen=True):
    """Fail after `ms` with the JSON-RPC error {code, message}."""

    ms: Ms = 100
    code: int = INTERNAL_ERROR
    message: str = "The fail tool always fails"


SLOW_STEPS = 3
CONFIRM_KEY = "confirm"
CONFIRM_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def confirm_request(question: str) -> dict[str, Any]:
    """The `ask` tool's one input request: a form elicitation."""
    params = {"mode": "form", "message": question, "requestedSchema": CONFIRM_SCHEMA}
    return {"method": "elicitation/create", "params": params}


def start_slow(store: TaskStore, entry: Entry, args: SlowArgs) -> None:
    """Several `statusMessage` changes, so a follower sees more than start and end."""
    store.change(entry, "working", message=f"step 1/{SLOW_STEPS}")
    for step in range(2, SLOW_STEPS + 1):
        message = f"step {step}/{SLOW_STEPS}"
        store.later(entry, args.ms * (step - 1) / SLOW_STEPS, _changer(store, entry, message))
    done = {"result": tool_result(args.value), "message": "done"}
    store.later(entry, args.ms, lambda: store.change(entry, "completed", **done))


def _changer(store: TaskStore, entry: Entry, message: str) -> Callable[[], None]:
    """A step of its own, so each timer keeps its message (a lambda in the loop would not)."""
    return lambda: store.change(entry, "working", message=message)


def start_ask(store: TaskStore, entry: Entry, args: AskArgs) -> None:
    """input_required at once; the answer, once taken, completes the task `ms` later."""
    requests = {CONFIRM_KEY: confirm_request(args.question)}
    store.change(entry, "input_required", message=args.question, input_requests=requests)

    def answered(taken: dict[str, Any]) -> None:
        answer = taken[CONFIRM_KEY]
        text = f"{CONFIRM_KEY}: {json.dumps(answer, sort_keys=True)}"
        result = tool_result(text, structuredContent={CONFIRM_KEY: answer})
        store.later(entry, args.ms, lambda: store.change(entry, "completed", result=result))

    entry.on_answer = answered


def start_fail(store: TaskStore, entry: Entry, args: FailArgs) -> None:
    error = TaskError(code=args.code, message=args.message)
    store.later(entry, args.ms, lambda: store.change(entry, "failed", error=error))


async def run_slow(args: SlowArgs) -> dict[str, Any]:
    """`slow` for a caller that did not declare tasks (H33): the answer waits for the work."""
    await asyncio.sleep(args.ms / 1000)
    return tool_result(args.value)


async def run_fail(args: FailArgs) -> dict[str, Any]:
    await asyncio.sleep(args.ms / 1000)
    raise RpcError(args.code, args.message)


async def run_ask(args: AskArgs) -> dict[str, Any]:
    # Without the extension there is no way to ask (no InputRequiredResult here, H36).
    raise missing_capability(
        f"Tool 'ask' runs only as a task: declare the {TASKS_EXTENSION} extension"
    )


@dataclass(frozen=True)
class Tool:
    """A tool: its arguments type, how it starts as a task, how it runs inline."""

    name: str
    args: type[msgspec.Struct]
    start: Callable[[TaskStore, Entry, Any], None]
    run: Callable[[Any], Awaitable[dict[str, Any]]]

    def listing(self) -> dict[str, Any]:
        """The tools/list entry; the schema comes from the arguments type itself."""
        schema = msgspec.json.schema_components([self.args])[1][self.args.__name__]
        schema.pop("title", None)
        description = (self.args.__doc__ or "").split("\n\n")[0]
        return {
            "name": self.name,
            "description": " ".join(description.split()),
            "inputSchema": schema,
        }


TOOLS = {
    tool.name: tool
    for tool in (
        Tool("slow", SlowArgs, start_slow, run_slow),
        Tool("ask", AskArgs, start_ask, run_ask),
        Tool("fail", FailArgs, start_fail, run_fail),
    )
}
Work = Callable[[], Awaitable[bytes]]

# The same for every caller, so encoded once; `ttlMs` here is how long a client may cache it.
DISCOVER_RESULT = encode_result(
    {
        "supportedVersions": list(SUPPORTED_VERSIONS),
        "capabilities": {"tools": {}, "extensions": {TASKS_EXTENSION: {}}},  # H27
        "instructions": "Test tools slow, ask and fail, run as tasks followed by polling.",
        "ttlMs": 0,
        "cacheScope": "public",
    }
)
TOOLS_LIST_RESULT = encode_result(
    {"tools": [tool.listing() for tool in TOOLS.values()], "ttlMs": 0, "cacheScope": "public"}
)
