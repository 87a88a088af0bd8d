"""A poll-only MCP Tasks server that keeps its tasks in its own memory and writes no NATS.

It stands in for the servers the hub fronts without a bridge (C#, Go, TypeScript …): the
task state lives here only, so clients follow it by polling `tasks/get` at this server
(through the hub's front door or directly). Stateless Streamable HTTP 2026-07-28, one
JSON-RPC request per POST, answered `application/json`; with `sse=True`, `tools/call`
is answered as a one-event `text/event-stream`, as the `mcp` SDK answers by default.

Tools `slow`, `ask` and `fail` answer a caller that declares `io.modelcontextprotocol/tasks`
in the request's own `_meta` (H30) with a flat CreateTaskResult; asyncio timers move each
task along, and `OwnStoreServer.set_status` lets a test move one from outside. With
`tokens`, a task belongs to the bearer token that created it and is "not found" for any
other (H46). `GET /stats` counts requests per method; `POST /reset-stats` zeroes it.

Only the wire types (`bridge.wire`) and names (`bridge.vocabulary`) are shared with the hub.

Run: python -m examples.own_store.server --port N [--token T ...] [--sse]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import secrets
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import uvicorn
from msgspec import UNSET, Meta
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUPPORTED_VERSIONS,
    TASK_NOT_FOUND,
    TASKS_EXTENSION,
    declares_tasks,
)
from bridge.wire import TERMINAL, DetailedTask, InvalidEnvelope, Status, TaskError, check_task

NAME = "own-store"
DEFAULT_TTL_MS = 60_000
DEFAULT_POLL_INTERVAL_MS = 500
# After SIGTERM, how long open requests (a long inline `slow`) may run before uvicorn
# cancels them; without a bound, a client holding a connection keeps the process alive.
SHUTDOWN_GRACE_S = 2
MAX_MS = 86_400_000  # a tool's delay: a day at most keeps every timer sane

# Keys of the stats that are not methods: requests refused before a method was read.
UNAUTHORIZED_KEY = "(unauthorized)"
INVALID_KEY = "(invalid)"

RequestId = str | int

# -- errors: one exception, one encoder (docs/protocol.md#error-codes) -------------------------

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022
UNAUTHORIZED = -31401  # the hub's own code for the same refusal, outside the reserved range


class RpcError(Exception):
    """A JSON-RPC error, the HTTP status it travels with, and the id it answers (None: the
    request could not be read far enough to know it)."""

    def __init__(
        self,
        code: int,
        message: str,
        data: Any = None,
        *,
        http_status: int = 200,
        headers: dict[str, str] | None = None,
        request_id: RequestId | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status
        self.headers = headers or {}
        self.request_id = request_id


def header_mismatch(message: str) -> RpcError:
    return RpcError(HEADER_MISMATCH, f"Header mismatch: {message}", http_status=400)


def invalid_params(message: str, *, http_status: int = 200) -> RpcError:
    return RpcError(INVALID_PARAMS, message, http_status=http_status)


def task_not_found() -> RpcError:
    """H42/H46: unknown, expired and foreign tasks get exactly this, on HTTP 200."""
    return RpcError(INVALID_PARAMS, TASK_NOT_FOUND)


def missing_capability(message: str = "Missing required client capability") -> RpcError:
    """H31: the request's own `_meta` did not declare the tasks extension."""
    required: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    return RpcError(MISSING_CAPABILITY, message, required, http_status=400)


def unauthorized(presented: bool) -> RpcError:
    challenge = f'Bearer realm="{NAME}"' + (', error="invalid_token"' if presented else "")
    return RpcError(
        UNAUTHORIZED,
        "Unauthorized: a valid bearer token is required",
        http_status=401,
        headers={"WWW-Authenticate": challenge},
    )


_META = {SERVER_INFO_KEY: {"name": NAME, "version": "0.1.0"}}
_META_JSON = msgspec.json.encode(_META)


def encode_error(request_id: RequestId | None, err: RpcError) -> bytes:
    """The error response; `id` is left out only when it could not be read."""
    error: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        error["data"] = err.data
    message: dict[str, Any] = {"jsonrpc": "2.0"}
    if request_id is not None:
        message["id"] = request_id
    message["error"] = error
    return msgspec.json.encode(message)


def encode_response(request_id: RequestId, result: bytes) -> bytes:
    """The response around an already encoded result object."""
    return (
        b'{"jsonrpc":"2.0","id":' + msgspec.json.encode(request_id) + b',"result":' + result + b"}"
    )


def encode_result(result: dict[str, Any]) -> bytes:
    """A result object with `resultType` (H35) and serverInfo (H29)."""
    return msgspec.json.encode({"resultType": "complete", **result, "_meta": _META})


def task_result(result_type: str, task_json: bytes) -> bytes:
    """A flat task result spliced from the task's own JSON (encoded once per revision):
    `"task"` for a CreateTaskResult (D5), `"complete"` for tasks/get (H37)."""
    head = b'{"resultType":' + msgspec.json.encode(result_type) + b',"_meta":' + _META_JSON
    return head + b"," + task_json[1:]


COMPLETE_ACK = encode_result({})  # the tasks/update and tasks/cancel answer (H47, H51)

# -- the request: envelope and routing headers (docs/protocol.md#validation-order) -------------

TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
METHODS = frozenset({"server/discover", "tools/list", "tools/call", *TASK_METHODS})
SENTINEL_PREFIX, SENTINEL_SUFFIX = "=?base64?", "?="


class Call(msgspec.Struct, frozen=True):
    """One JSON-RPC message as read; `id` None is a notification."""

    method: str
    id: RequestId | None
    params: Any


@dataclass(frozen=True)
class Checked:
    """A request that passed every check; handlers only decide the answer."""

    id: RequestId
    method: str
    params: dict[str, Any]
    declared: bool  # this request's `_meta` declares the tasks extension (H30)
    caller: str  # the bearer token, or "" when the server runs without tokens
    task_id: str = ""  # tasks/*
    input_responses: dict[str, Any] = field(default_factory=dict)  # tasks/update


def read_call(body: bytes) -> Call:
    """The JSON-RPC envelope of one POST (H1): one request or notification, nothing else."""
    try:
        message = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        raise RpcError(
            PARSE_ERROR, "Parse error: body is not valid JSON", http_status=400
        ) from None
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "Invalid request: one JSON object", http_status=400)
    request_id = message.get("id")
    # JSON true/false decode to bool, an int subclass: not an id; nor is a float or null.
    if "id" in message and (not isinstance(request_id, str | int) or isinstance(request_id, bool)):
        raise RpcError(
            INVALID_REQUEST, "Invalid request: id must be a string or an integer", http_status=400
        )
    method = message.get("method")
    if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
        raise RpcError(
            INVALID_REQUEST,
            'Invalid request: jsonrpc must be "2.0" and method a string',
            http_status=400,
            request_id=request_id,
        )
    return Call(method, request_id, message.get("params"))


def header_value(headers: Headers, name: str) -> str | None:
    """The value a client meant (H14: `=?base64?…?=` decoded), None when absent; a value
    with characters outside visible ASCII, space and tab is a mismatch (H15)."""
    raw = headers.get(name)
    if raw is None:
        return None
    raw = raw.strip(" \t")  # not part of a field value (RFC 9110 §5.5)
    if raw.startswith(SENTINEL_PREFIX) and raw.endswith(SENTINEL_SUFFIX):
        payload = raw[len(SENTINEL_PREFIX) : -len(SENTINEL_SUFFIX)]
        try:
            return base64.b64decode(payload, validate=True).decode()
        except (binascii.Error, UnicodeError, ValueError):
            raise header_mismatch(f"{name} header value is a malformed base64 value") from None
    if not all(" " <= char <= "~" or char == "\t" for char in raw):
        raise header_mismatch(f"{name} header value contains invalid characters")
    return raw


def check_call(headers: Headers, call: Call, caller: str) -> Checked:
    """Validation steps 6–14 for a request (not a notification); raises RpcError."""
    assert call.id is not None
    version = header_value(headers, "mcp-protocol-version")
    if version is None:  # H8
        raise header_mismatch("required header MCP-Protocol-Version is missing")
    params = call.params
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict):  # H11
        raise invalid_params("params._meta is required", http_status=400)
    meta_version = meta.get(PROTOCOL_VERSION_KEY)
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    if not isinstance(meta_version, str) or not isinstance(capabilities, dict):  # H11
        message = "params._meta must carry the protocol version and client capabilities"
        raise invalid_params(message, http_status=400)
    if version != meta_version:  # H9
        raise header_mismatch("MCP-Protocol-Version differs from the _meta protocol version")
    if version not in SUPPORTED_VERSIONS:  # H10
        data = {"supported": list(SUPPORTED_VERSIONS), "requested": version}
        raise RpcError(UNSUPPORTED_VERSION, "Unsupported protocol version", data, http_status=400)
    if header_value(headers, "mcp-method") != call.method:  # H12
        raise header_mismatch("Mcp-Method is missing or differs from the method")
    if call.method not in METHODS:  # H17, H18
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {call.method[:120]}", http_status=404)
    checked = Checked(call.id, call.method, params, declares_tasks(capabilities), caller)
    if call.method == "tools/call":
        _check_name(headers, params.get("name"), "name")
    if call.method in TASK_METHODS:
        return _task_call(headers, checked)
    return checked


def _check_name(headers: Headers, value: Any, param: str) -> None:
    """Mcp-Name must carry `params.<param>` (H13); a non-string param is bad params, later."""
    if isinstance(value, str) and header_value(headers, "mcp-name") != value:
        raise header_mismatch(f"Mcp-Name is missing or differs from params.{param}")


def _task_call(headers: Headers, checked: Checked) -> Checked:
    """tasks/get|update|cancel: Mcp-Name (H13), the extension (H31), then the params."""
    task_id = checked.params.get("taskId")
    _check_name(headers, task_id, "taskId")
    if not checked.declared:
        raise missing_capability()
    if not isinstance(task_id, str):
        raise invalid_params("params.taskId must be a string")
    responses: Any = {}
    if checked.method == "tasks/update":
        responses = checked.params.get("inputResponses")
        if not isinstance(responses, dict):
            raise invalid_params("params.inputResponses must be an object")
    return dataclasses.replace(checked, task_id=task_id, input_responses=responses)


def accepts_event_stream(headers: Headers) -> bool:
    """Whether Accept names a range that admits `text/event-stream` (absent: JSON only)."""
    accept = headers.get("accept", "")
    ranges = {item.split(";", 1)[0].strip().lower() for item in accept.split(",")}
    return not ranges.isdisjoint({"text/event-stream", "text/*", "*/*"})


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

# -- HTTP ------------------------------------------------------------------------------------

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# JSON may carry these raw, but line splitters such as `str.splitlines` cut a `data:` line there.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def sse_event(data: bytes) -> bytes:
    text = data.decode()
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return b"event: message\ndata: " + text.encode() + b"\n\n"


def json_response(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(body, status, headers, media_type="application/json")


def error_response(request_id: RequestId | None, err: RpcError) -> Response:
    return json_response(encode_error(request_id, err), err.http_status, err.headers)


class OwnStoreServer:
    """The server as an ASGI app (the object itself, or `.app`), with its store and counters.

    `tokens`: when given, every request needs `Authorization: Bearer <one of them>` and each
    task belongs to the token that created it; None runs open, every task shared.
    `ttl_ms` (None: unlimited) and `poll_interval_ms` (None: not advertised) go on every task;
    `sse=True` answers `tools/call` as an event stream when the client's Accept allows it.
    """

    def __init__(
        self,
        *,
        tokens: Collection[str] | None = None,
        ttl_ms: int | None = DEFAULT_TTL_MS,
        poll_interval_ms: int | None = DEFAULT_POLL_INTERVAL_MS,
        sse: bool = False,
    ) -> None:
        self.tokens = None if tokens is None else frozenset(tokens)
        self.sse = sse
        self.store = TaskStore(ttl_ms, poll_interval_ms)
        self.stats: Counter[str] = Counter()
        self._handlers: dict[str, Callable[[Checked], bytes]] = {
            "server/discover": self._discover,
            "tools/list": self._tools_list,
            "tasks/get": self._tasks_get,
            "tasks/update": self._tasks_update,
            "tasks/cancel": self._tasks_cancel,
        }
        self.app = Starlette(
            routes=[
                Route("/mcp", self._mcp, methods=["POST"]),
                Route("/stats", self._stats, methods=["GET"]),
                Route("/reset-stats", self._reset_stats, methods=["POST"]),
                Route("/readyz", self._ready, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # -- the test hooks ------------------------------------------------------------------------

    def set_status(
        self,
        task_id: str,
        status: Status,
        *,
        message: str | None = None,
        input_requests: dict[str, dict[str, Any]] | None = None,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Move a task from outside; its own timers stop, so the caller drives it from here.

        Raises KeyError for a task that is not stored (or expired), TerminalTask for a
        terminal one, ValueError when the variant field does not fit `status` (H39).
        """
        entry = self.store.live(task_id)
        if entry is None:
            raise KeyError(task_id)
        task_error = None if error is None else msgspec.convert(error, TaskError)
        self.store.change(
            entry,
            status,
            message=message,
            input_requests=input_requests,
            result=result,
            error=task_error,
        )
        self.store.stop(entry)  # only once the change stands: a refused one leaves all as it was

    def task(self, task_id: str) -> dict[str, Any] | None:
        """A live task's DetailedTask as JSON values, whoever owns it; None if there is none."""
        entry = self.store.live(task_id)
        return None if entry is None else json.loads(entry.encoded)

    def reset_stats(self) -> None:
        self.stats.clear()

    # -- HTTP --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self.store.close()

    async def _stats(self, _: Request) -> Response:
        return json_response(msgspec.json.encode(dict(self.stats)))

    async def _reset_stats(self, _: Request) -> Response:
        self.reset_stats()
        return Response(status_code=204)

    async def _ready(self, _: Request) -> Response:
        return Response(status_code=204)

    async def _mcp(self, request: Request) -> Response:
        """Steps in the order of docs/protocol.md#validation-order: auth, envelope, headers."""
        headers = request.headers
        try:
            caller = self._caller(headers)
        except RpcError as err:
            self.stats[UNAUTHORIZED_KEY] += 1
            return error_response(None, err)
        try:
            call = read_call(await request.body())
        except RpcError as err:
            self.stats[INVALID_KEY] += 1
            return error_response(err.request_id, err)
        self.stats[call.method] += 1
        if call.id is None:
            return Response(status_code=202)  # H6: notifications are accepted and ignored
        try:
            checked = check_call(headers, call, caller)
            if checked.method != "tools/call":
                return json_response(
                    encode_response(checked.id, self._handlers[checked.method](checked))
                )
            work = self._tools_call(checked)  # bad params are answered before any stream starts
            if self.sse and accepts_event_stream(headers):
                return self._event_stream(checked.id, work)
            return json_response(encode_response(checked.id, await work()))
        except RpcError as err:
            return error_response(call.id, err)

    def _caller(self, headers: Headers) -> str:
        """Whose request this is: its bearer token, or "" on an open server."""
        if self.tokens is None:
            return ""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        # A test server: a set lookup, not a constant-time comparison.
        if scheme.lower() != "bearer" or token not in self.tokens:
            raise unauthorized(presented=bool(token))
        return token

    def _event_stream(self, request_id: RequestId, work: Work) -> Response:
        """The head at once, then one `message` event with the answer, then the end."""

        async def events() -> AsyncIterator[bytes]:
            try:
                body = encode_response(request_id, await work())
            except RpcError as err:  # the 200 head is out: the error travels as the event
                body = encode_error(request_id, err)
            yield sse_event(body)

        return StreamingResponse(events(), headers=SSE_HEADERS, media_type="text/event-stream")

    # -- methods -----------------------------------------------------------------------------

    def _discover(self, _: Checked) -> bytes:
        return DISCOVER_RESULT

    def _tools_list(self, _: Checked) -> bytes:
        return TOOLS_LIST_RESULT

    def _tools_call(self, checked: Checked) -> Work:
        """Validate the call now; return the work that answers it."""
        name = checked.params.get("name")
        arguments = checked.params.get("arguments", {})
        if not isinstance(name, str):
            raise invalid_params("params.name must be a string")
        if not isinstance(arguments, dict):
            raise invalid_params("params.arguments must be an object")
        tool = TOOLS.get(name)
        if tool is None:
            raise invalid_params(f"Unknown tool: {name[:120]}")
        try:
            args = msgspec.convert(arguments, tool.args)
        except msgspec.ValidationError as exc:
            # A tool execution error, as the SDK answers bad arguments; it costs no task.
            text = f"Invalid arguments for tool {name}: {exc}"
            invalid = encode_result(tool_result(text, isError=True))
            return lambda: _at_once(invalid)
        if checked.declared:  # H33: a task only for a caller that declared the extension
            entry = self.store.create(checked.caller)
            created = task_result("task", entry.encoded)  # the seed, before the body moves it
            tool.start(self.store, entry, args)
            return lambda: _at_once(created)
        return lambda: _inline(tool, args)

    def _tasks_get(self, checked: Checked) -> bytes:
        entry = self.store.find(checked.task_id, checked.caller)
        return task_result("complete", entry.encoded)

    def _tasks_update(self, checked: Checked) -> bytes:
        entry = self.store.find(checked.task_id, checked.caller)
        self.store.answer(entry, checked.input_responses)
        return COMPLETE_ACK

    def _tasks_cancel(self, checked: Checked) -> bytes:
        entry = self.store.find(checked.task_id, checked.caller)
        self.store.cancel(entry)
        return COMPLETE_ACK


async def _at_once(body: bytes) -> bytes:
    return body


async def _inline(tool: Tool, args: Any) -> bytes:
    return encode_result(await tool.run(args))


# -- as a process --------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn that exits 0 after SIGTERM/SIGINT instead of re-raising the signal."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.own_store.server",
        description="A poll-only MCP Tasks server with its own in-memory store.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--token", action="append", help="accept this bearer token (repeatable); none: open"
    )
    parser.add_argument("--poll-interval-ms", type=int, default=DEFAULT_POLL_INTERVAL_MS)
    parser.add_argument("--ttl-ms", type=int, default=DEFAULT_TTL_MS)
    parser.add_argument("--sse", action="store_true", help="answer tools/call as an event stream")
    parser.add_argument(
        "--shutdown-grace",
        type=int,
        default=SHUTDOWN_GRACE_S,
        help="seconds open requests get after SIGTERM before they are cut",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    server = OwnStoreServer(
        tokens=args.token,
        ttl_ms=args.ttl_ms,
        poll_interval_ms=args.poll_interval_ms,
        sse=args.sse,
    )
    config = uvicorn.Config(
        server,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=args.shutdown_grace,
    )
    asyncio.run(_Server(config).serve())


if __name__ == "__main__":
    main()
