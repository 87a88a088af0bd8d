"""Task tools for the `mcp` SDK's MCPServer: the `io.modelcontextprotocol/tasks` extension.

A `tools/call` of a task tool whose *own* `_meta` declares the extension (H30) is answered
with a flat CreateTaskResult only after `TaskBridge.create` returned, i.e. after JetStream
stored the task, so a `tasks/get` at any hub replica finds it (H44); the body then
runs in the background and ends the task completed / failed / cancelled. Other callers get
the SDK's ordinary synchronous call (`optional`) or -32021 (`required`). `params.task`, the
2025-11-25 augmentation, never decides anything (H74).

How it hooks into the SDK: `TaskTools` is an `mcp.server.extension.Extension`. `tools()`
registers each task tool with MCPServer (listing, Mcp-Param validation, the inline path)
under a signature without its `TaskContext` parameter, and `intercept_tool_call` decides
task vs inline per request. The background run cannot go through `call_next`: the request
(and the SDK `Context` built from it) ends when the CreateTaskResult is sent, and the SDK
turns crashes into `isError` results, where a task must fail with -32603 instead.

The server is complete by itself (issue 11): `methods()` installs `tasks/get`,
`tasks/update` and `tasks/cancel`, answered from the KV leader with the hub's semantics
(bridge.task_methods), so the extension is advertised only with every handler it names.
`subscriptions/listen` at a server is declined for tasks: the SDK's own listen handler
answers it (this process's list-changed events), and its ack omits `taskIds`, which the
spec reads as "not honoured" ("unsupported types are omitted"). A stateless fleet cannot
hold task streams coherently; clients poll `tasks/get` here or listen at the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, ToolBinding
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ToolError,
    UnexpectedResourceError,
    UnexpectedToolError,
)
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata, func_metadata
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    CallToolRequestParams,
    CallToolResult,
    TextContent,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import HTTPConnection

from bridge import task_methods, vocabulary
from bridge.bridge import TaskBridge
from bridge.states import TerminalStateError
from bridge.task_context import InlineRun, TaskContext, TaskRun, missing_capability
from bridge.vocabulary import TASKS_EXTENSION
from bridge.wire import TaskRecord

log = logging.getLogger(__name__)

TaskSupport = Literal["optional", "required"]
OwnerOf = Callable[[ServerRequestContext[Any, Any]], str]
ToolFn = TypeVar("ToolFn", bound=Callable[..., Awaitable[Any]])

ANONYMOUS = "anonymous"
# The SDK injects its own Context here on the inline path; no tool may use the name.
_SDK_CONTEXT_PARAM = "mcp_request_context"
_INTERNAL = {"code": INTERNAL_ERROR, "message": "Internal error"}  # never the exception's text
_SHUT_DOWN = {"code": INTERNAL_ERROR, "message": "The server shut down before the task finished"}
_LOST = {"code": INTERNAL_ERROR, "message": "The server restarted before the task finished"}


def default_owner(ctx: ServerRequestContext[Any, Any]) -> str:
    """The request's authenticated principal (token `sub`, else client id), else anonymous.

    Reads what the SDK's bearer auth leaves on the request (`scope["user"]`, also exposed
    as `get_access_token()`); the hub compares it with the JWT `sub` of whoever polls.
    """
    user = ctx.request.scope.get("user") if isinstance(ctx.request, HTTPConnection) else None
    token = user.access_token if isinstance(user, AuthenticatedUser) else get_access_token()
    if token is not None:
        return token.subject or token.client_id or ANONYMOUS
    return ANONYMOUS


def client_capabilities(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, Any]:
    """This request's declared capabilities, from its own `_meta` (H30)."""
    meta: Mapping[str, Any] = typing.cast(Mapping[str, Any], ctx.meta or {})
    declared = meta.get(CLIENT_CAPABILITIES_META_KEY)
    return declared if isinstance(declared, Mapping) else {}


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this very request may get a CreateTaskResult (H33; H73: modern only)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    return vocabulary.declares_tasks(client_capabilities(ctx))


def check_routing_name(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """H13: over HTTP, `Mcp-Name` must carry `params.taskId` (H14: sentinel decoded; the
    SDK checks it only for tools/call, prompts/get and resources/read). Surrounding
    spaces and tabs are not part of a field value (RFC 9110 §5.5)."""
    request = ctx.request
    if not isinstance(request, HTTPConnection):
        return  # stdio: no headers to disagree with the body
    raw = request.headers.get("mcp-name")
    name = decode_header_value(raw.strip(" \t")) if raw is not None else None
    if name != task_id:
        raise MCPError(HEADER_MISMATCH, "Mcp-Name header does not match params.taskId")


def create_task_result(record: TaskRecord) -> dict[str, Any]:
    """The flat CreateTaskResult (D5): the seed Task plus `resultType: "task"`, nothing more."""
    task: dict[str, Any] = msgspec.to_builtins(record.task)
    return {"resultType": "task", **task}


@dataclass(frozen=True)
class _TaskTool:
    """One registered task tool: the author's function and how to call it."""

    name: str
    fn: Callable[..., Awaitable[Any]]
    support: TaskSupport
    context_param: str  # the parameter annotated TaskContext
    metadata: FuncMetadata  # arguments model and result conversion, minus context_param
    binding: ToolBinding  # what MCPServer registers (inline path and listing)


# What a finished body amounts to: `complete` with a result or `fail` with an error.
_Outcome = tuple[Literal["complete", "fail"], dict[str, Any]]


@dataclass
class _Run:
    """One task running in this process: the body, and the job that records its end."""

    tool: _TaskTool
    context: TaskRun
    bridge: TaskBridge
    body: asyncio.Task[_Outcome]
    job: asyncio.Task[None] | None = None
    stopped_by: Literal["client", "shutdown"] | None = None  # who cancelled the body
    finishing: bool = False  # the body is over; its end is being written


class TaskTools(Extension):
    """Make tools answer with tasks; pass to `MCPServer(extensions=[...])`.

    Register every task tool (`tool` / `add_tool`) before building the MCPServer, which
    reads them once. Run the server inside `serving(bridge)` (typically in its lifespan):
    it routes the bridge's forwarded answers and cancellations to the running bodies, and
    on exit fails whatever is still running, so no follower waits for an end that never
    comes. This object owns the bridge's input and cancel handlers.
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        *,
        owner_of: OwnerOf = default_owner,
        ttl_ms: int | None = 3_600_000,
        poll_interval_ms: int | None = 2_000,
        max_tasks: int = 256,
        shutdown_timeout: float = 5.0,
    ) -> None:
        if max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self._owner_of = owner_of
        self._ttl_ms = ttl_ms
        self._poll_interval_ms = poll_interval_ms
        self._max_tasks = max_tasks
        self._shutdown_timeout = shutdown_timeout
        self._tools: dict[str, _TaskTool] = {}
        self._listed = False
        self._bridge: TaskBridge | None = None
        self._runs: dict[str, _Run] = {}
        self._starting = 0  # creations in flight, counted against max_tasks

    # -- registration -----------------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        task_support: TaskSupport = "optional",
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        structured_output: bool | None = None,
    ) -> Callable[[ToolFn], ToolFn]:
        """Decorator form of `add_tool`."""

        def register(fn: ToolFn) -> ToolFn:
            self.add_tool(
                fn,
                name,
                task_support=task_support,
                title=title,
                description=description,
                annotations=annotations,
                structured_output=structured_output,
            )
            return fn

        return register

    def add_tool(
        self,
        fn: Callable[..., Awaitable[Any]],
        name: str | None = None,
        *,
        task_support: TaskSupport = "optional",
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        structured_output: bool | None = None,
    ) -> None:
        """Register `fn`, an `async def` with one parameter annotated `TaskContext`.

        `task_support="optional"`: declaring callers get a task, others run it inline;
        `"required"`: others get -32021.
        """
        if self._listed:
            raise RuntimeError("register task tools before constructing the MCPServer")
        if task_support not in ("optional", "required"):
            raise ValueError(f"task_support must be 'optional' or 'required', not {task_support!r}")
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"task tool {fn.__name__!r} must be an async def")
        tool_name = name or fn.__name__
        if tool_name in self._tools:
            raise ValueError(f"task tool {tool_name!r} is already registered")
        signature = inspect.signature(fn, eval_str=True)
        context_param = _context_parameter(tool_name, signature)
        entry = _inline_entry(fn, tool_name, signature, context_param)
        kwargs: dict[str, Any] = {"name": tool_name, "title": title, "description": description}
        kwargs |= {"annotations": annotations, "structured_output": structured_output}
        self._tools[tool_name] = _TaskTool(
            name=tool_name,
            fn=fn,
            support=task_support,
            context_param=context_param,
            metadata=func_metadata(fn, [context_param], structured_output),
            binding=ToolBinding(fn=entry, kwargs=kwargs),
        )

    def tools(self) -> Sequence[ToolBinding]:
        self._listed = True
        return [tool.binding for tool in self._tools.values()]

    def methods(self) -> Sequence[MethodBinding]:
        # The extension is advertised only with every method it names served (issue 11).
        # Modern only, as the hub (H73): older versions get the SDK's -32601.
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", task_methods.TaskIdParams, self._get, versions),
            MethodBinding("tasks/update", task_methods.UpdateTaskParams, self._update, versions),
            MethodBinding("tasks/cancel", task_methods.TaskIdParams, self._cancel, versions),
        ]

    # -- tasks/get, tasks/update, tasks/cancel (bridge.task_methods) ----------------------

    def _method_bridge(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> TaskBridge:
        check_routing_name(ctx, task_id)
        if not declares_tasks(ctx):
            raise task_methods.undeclared()
        if self._bridge is None:
            log.error("tasks/* request outside TaskTools.serving()")
            raise MCPError(INTERNAL_ERROR, "The server is not running task tools")
        return self._bridge

    async def _get(
        self, ctx: ServerRequestContext[Any, Any], params: task_methods.TaskIdParams
    ) -> dict[str, Any]:
        bridge = self._method_bridge(ctx, params.task_id)
        return await task_methods.tasks_get(bridge, params.task_id, self._owner_of(ctx))

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: task_methods.UpdateTaskParams
    ) -> dict[str, Any]:
        bridge = self._method_bridge(ctx, params.task_id)
        owner = self._owner_of(ctx)
        return await task_methods.tasks_update(
            bridge, params.task_id, params.input_responses, owner, ctx.request_id
        )

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: task_methods.TaskIdParams
    ) -> dict[str, Any]:
        bridge = self._method_bridge(ctx, params.task_id)
        owner = self._owner_of(ctx)
        return await task_methods.tasks_cancel(bridge, params.task_id, owner, ctx.request_id)

    # -- serving ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serving(self, bridge: TaskBridge) -> AsyncIterator[None]:
        """Run task tools on `bridge` for the duration of the block."""
        if self._bridge is not None:
            raise RuntimeError("TaskTools is already serving")
        self._bridge = bridge
        # One synchronous step: the first handler starts the consumer (TaskBridge.on_input).
        bridge.on_input(self._on_input)
        bridge.on_cancel(self._on_cancel)
        try:
            yield
        finally:
            self._bridge = None
            await self._stop_runs()

    @property
    def running(self) -> int:
        """How many tasks this process is running."""
        return len(self._runs)

    async def _stop_runs(self) -> None:
        """Cancel every body; each ends `failed` (shutdown), within `shutdown_timeout`."""
        runs = list(self._runs.values())
        for run in runs:
            if not run.finishing:
                run.stopped_by = run.stopped_by or "shutdown"
                run.body.cancel()
        jobs = {run.job for run in runs if run.job is not None}
        if not jobs:
            return
        _, late = await asyncio.wait(jobs, timeout=self._shutdown_timeout)
        for job in late:
            log.warning("%s did not stop in time; abandoned", job.get_name())
            job.cancel()

    # -- tools/call ---------------------------------------------------------------------

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        tool = self._tools.get(params.name)
        if tool is None:
            return await call_next(ctx)
        if not declares_tasks(ctx):
            if tool.support == "required":
                raise missing_capability(
                    {"extensions": {TASKS_EXTENSION: {}}},
                    f"Tool {tool.name!r} runs only as a task: declare the {TASKS_EXTENSION} "
                    "extension",
                )
            return await call_next(ctx)  # the SDK runs it inline, with an InlineRun
        arguments = params.arguments or {}
        try:
            tool.metadata.validate_arguments(arguments)
        except Exception:
            # Bad arguments cost no task: the SDK answers them exactly as it always does.
            return await call_next(ctx)
        owner = self._owner_of(ctx)
        record = await self._start(tool, arguments, owner, client_capabilities(ctx))
        return create_task_result(record)

    async def _start(
        self,
        tool: _TaskTool,
        arguments: dict[str, Any],
        owner: str,
        capabilities: Mapping[str, Any],
    ) -> TaskRecord:
        bridge = self._bridge
        if bridge is None:
            log.error("tools/call of task tool %r outside TaskTools.serving()", tool.name)
            raise MCPError(INTERNAL_ERROR, "The server is not running task tools")
        if len(self._runs) + self._starting >= self._max_tasks:
            raise MCPError(INTERNAL_ERROR, "Too many tasks in progress; try again later")
        self._starting += 1
        # Shielded: once the create is under way, a caller hanging up must not leave a
        # stored task that nothing runs; it runs unobserved instead (H51).
        return await asyncio.shield(self._create(bridge, tool, arguments, owner, capabilities))

    async def _create(
        self,
        bridge: TaskBridge,
        tool: _TaskTool,
        arguments: dict[str, Any],
        owner: str,
        capabilities: Mapping[str, Any],
    ) -> TaskRecord:
        try:
            # Durable before reply (H44): create returns once JetStream stored the task.
            record = await bridge.create(
                owner=owner, ttl_ms=self._ttl_ms, poll_interval_ms=self._poll_interval_ms
            )
        finally:
            self._starting -= 1
        context = TaskRun(bridge, record.task_id, dict(capabilities))
        body = asyncio.create_task(_call(tool, context, arguments), name=f"task tool {tool.name}")
        run = _Run(tool, context, bridge, body)
        self._runs[record.task_id] = run
        # A separate job records the end, so it runs even if the body is cancelled early.
        run.job = asyncio.create_task(self._record_end(run), name=f"task {record.task_id}")
        return record

    # -- the background run -------------------------------------------------------------

    async def _record_end(self, run: _Run) -> None:
        try:
            await asyncio.wait({run.body})
            run.finishing = True
            await _finish(run)
        finally:
            self._runs.pop(run.context.task_id, None)

    async def _on_input(self, task_id: str, responses: dict[str, Any]) -> None:
        run = self._runs.get(task_id)
        if run is not None:
            run.context.deliver(responses)
            return
        # The body that asked is gone (this server id restarted): nobody will ever finish
        # the task, so end it rather than let followers wait for its ttl.
        bridge = self._serving_bridge()
        log.warning("answer for task %s, which no tool body runs here; failing it", task_id)
        await bridge.fail(task_id, _LOST)

    async def _on_cancel(self, task_id: str) -> None:
        run = self._runs.get(task_id)
        if run is None:
            await self._serving_bridge().cancelled(task_id)  # nothing runs it: just end it
            return
        if run.finishing:
            return  # the body already ended; its own outcome stands (terminal states are final)
        run.stopped_by = "client"
        run.body.cancel()  # cooperative: a body may catch it and end as it sees fit

    def _serving_bridge(self) -> TaskBridge:
        if self._bridge is None:
            # Raising makes the bridge retry the message later, e.g. on this id's next run.
            raise RuntimeError("TaskTools is not serving")
        return self._bridge


async def _call(tool: _TaskTool, context: TaskRun, arguments: dict[str, Any]) -> _Outcome:
    """Run the body; map what it returned or raised to the task's end (H39, H41)."""
    try:
        validated = tool.metadata.validate_arguments(arguments)
        value = await tool.metadata.call_fn(tool.fn, True, validated, {tool.context_param: context})
        result = tool.metadata.convert_result(value)
        if not isinstance(result, CallToolResult):
            raise TypeError("a task tool cannot return an InputRequiredResult; use TaskContext.ask")
    except MCPError as exc:  # a JSON-RPC error: the only thing that makes a task fail
        return "fail", exc.error.model_dump(mode="json", exclude_none=True)
    except (ToolError, ResourceError) as exc:
        if isinstance(exc, UnexpectedToolError | UnexpectedResourceError):
            log.exception("task tool %r crashed (task %s)", tool.name, context.task_id)
            return "fail", dict(_INTERNAL)
        # Deliberate tool errors stay what the SDK makes of them inline: an isError
        # result, which is a completed task (H41).
        text = f"Error executing tool {tool.name}: {exc}"
        result = CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
    except Exception:
        log.exception("task tool %r crashed (task %s)", tool.name, context.task_id)
        return "fail", dict(_INTERNAL)
    return "complete", result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def _finish(run: _Run) -> None:
    """Write the task's end; a task that reached a terminal state meanwhile keeps it."""
    task_id = run.context.task_id
    body = run.body
    try:
        if not body.cancelled():
            kind, payload = body.result()
            if kind == "complete":
                await run.bridge.complete(task_id, payload)
            else:
                await run.bridge.fail(task_id, payload)
        elif run.stopped_by == "client":
            await run.bridge.cancelled(task_id)
        elif run.stopped_by == "shutdown":
            await run.bridge.fail(task_id, _SHUT_DOWN)
        else:
            log.error("task tool %r cancelled itself (task %s)", run.tool.name, task_id)
            await run.bridge.fail(task_id, _INTERNAL)
    except TerminalStateError:
        pass  # e.g. cancelled as an orphan meanwhile: terminal states are final
    except LookupError as exc:  # TaskNotFound / TaskExpired: nothing left to write
        log.info("task %s ended unrecorded: %s", task_id, exc)
    except Exception:
        log.exception("could not record the end of task %s", task_id)


def _context_parameter(tool_name: str, signature: inspect.Signature) -> str:
    """The one parameter annotated TaskContext; the SDK's Context has no place in a task."""
    found: list[str] = []
    for param in signature.parameters.values():
        annotation = param.annotation
        if param.name == _SDK_CONTEXT_PARAM:
            raise TypeError(f"task tool {tool_name!r}: the name {_SDK_CONTEXT_PARAM!r} is reserved")
        if _mentions(annotation, Context):
            raise TypeError(
                f"task tool {tool_name!r} takes the SDK Context, which ends with the request; "
                "take a TaskContext instead"
            )
        if _mentions(annotation, TaskContext):
            found.append(param.name)
    if len(found) != 1:
        raise TypeError(f"task tool {tool_name!r} needs exactly one parameter typed TaskContext")
    return found[0]


def _mentions(annotation: Any, cls: type) -> bool:
    if inspect.isclass(annotation):
        return issubclass(annotation, cls)
    return any(_mentions(arg, cls) for arg in typing.get_args(annotation))


def _inline_entry(
    fn: Callable[..., Awaitable[Any]],
    name: str,
    signature: inspect.Signature,
    context_param: str,
) -> Callable[..., Awaitable[Any]]:
    """The function MCPServer registers: `fn`'s parameters minus its TaskContext, plus the
    SDK Context (which the SDK skips in the schema and injects). Called only inline."""
    params = [p for p in signature.parameters.values() if p.name != context_param]
    sdk_context = inspect.Parameter(
        _SDK_CONTEXT_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=Context
    )
    last = len(params) - (1 if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD else 0)
    params.insert(last, sdk_context)

    async def entry(**kwargs: Any) -> Any:
        context = kwargs.pop(_SDK_CONTEXT_PARAM)
        return await fn(**kwargs, **{context_param: InlineRun(context)})

    # The SDK reads the signature and type hints; both must show the registered shape.
    setattr(entry, "__signature__", signature.replace(parameters=params))  # noqa: B010
    entry.__annotations__ = {
        p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty
    }
    if signature.return_annotation is not inspect.Signature.empty:
        entry.__annotations__["return"] = signature.return_annotation
    entry.__name__ = name
    entry.__qualname__ = getattr(fn, "__qualname__", name)
    entry.__doc__ = fn.__doc__
    entry.__module__ = fn.__module__
    return entry
