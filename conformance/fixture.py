"""The conformance fixture: every tool, prompt and resource the MCP conformance suite calls.

python -m conformance.fixture --nats-url nats://127.0.0.1:4222 --port 0 --ready-file url.txt

An `mcp` SDK `MCPServer` whose task tools run on the bridge (`bridge.mcp_server.TaskTools`),
so their tasks live in NATS where the hub (or this server's own `tasks/*` handlers) find
them. The names, arguments and answers below are the ones the suite's scenarios expect
(`@modelcontextprotocol/conformance` 0.2.0-alpha.12, `dist/index.js`; see README.md):

- tasks-* scenarios: `greet` (sync only), `slow_compute` (optional task), `failing_job`
  (required task, ends with an isError result), `protocol_error_job` (ends `failed`),
  `confirm_delete` (one elicitation), `multi_input` (two at once) and
  `test_tool_with_task` (an MRTR round on `tools/call`, then a task).
- tools-*, resources-*, prompts-*, completion-complete, json-schema-2020-12, caching,
  http-custom-header-server-validation: the `test_*` tools, `test://` resources and
  `test_*` prompts of the suite's reference "everything" server.
- server-stateless and input-required-result-*: `test_missing_capability`,
  `test_streaming_elicitation`, `test_logging_tool`, `test_trigger_*_change` and the
  `test_input_required_result_*` tools and prompt.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import typing
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from mcp.server import ServerRequestContext
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult
from mcp.server.mcpserver import Context, MCPServer, RequestStateSecurity
from mcp.server.mcpserver.prompts.base import Prompt, UserMessage
from mcp.shared.exceptions import MCPError
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    CallToolRequestParams,
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    EmbeddedResource,
    ImageContent,
    InputRequiredResult,
    PromptReference,
    ResourceTemplateReference,
    TextContent,
    TextResourceContents,
)
from mcp_types.methods import CacheableMethod
from pydantic import Field

from bridge import TaskBridge
from bridge.events import DEFAULT_SERVICE
from bridge.mcp_server import TaskTools, declares_tasks
from bridge.task_context import TaskContext, elicitation_form
from conformance.inputs import CONFIRM_SCHEMA, NAME_SCHEMA, elicit, elicited
from conformance.mrtr import register_mrtr_tools
from examples.fleet.common import Connect, Lifespan
from examples.fleet.common import main as common_main

NAME = "taskhub-conformance-fixture"

# A 1x1 PNG and a tiny WAV: the suite checks type, mimeType and that data is base64.
PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0g"
    "AAAABJRU5ErkJggg=="
)
WAV_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
# RequestStateSecurity wants 32+ bytes; a fixture key, not a secret (every replica shares it).
REQUEST_STATE_KEY = b"taskhub-conformance-fixture-request-state-key"
# SEP-2549 hints on every cacheable result (caching scenario).
CACHE_HINTS: dict[CacheableMethod, CacheHint] = {
    method: CacheHint(ttl_ms=60_000, scope="public") for method in typing.get_args(CacheableMethod)
}

# The keyword set json-schema-2020-12 looks for, kept verbatim in tools/list.
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _text(text: str, *, is_error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


# -- task tools (tasks-* scenarios) ---------------------------------------------------------


async def slow_compute(task: TaskContext, seconds: float = 1.0, label: str = "") -> str:
    """Sleep `seconds`, then answer; `tasks/cancel` while it sleeps ends it `cancelled`."""
    if seconds > 0:
        await task.report(f"{label or 'slow_compute'}: computing for {seconds:g}s")
        await asyncio.sleep(seconds)
    return f"{label or 'slow_compute'}: computed in {seconds:g}s"


async def failing_job(task: TaskContext) -> CallToolResult:
    """Runs about a second, then reports a tool execution error (a `completed` task)."""
    await task.report("failing_job: working")
    await asyncio.sleep(1.0)
    return _text("failing_job: the job failed (a tool error, not a protocol error)", is_error=True)


async def protocol_error_job(task: TaskContext) -> str:
    """Crashes: the task ends `failed` with a JSON-RPC error (-32603)."""
    await task.report("protocol_error_job: about to crash")
    raise RuntimeError("protocol_error_job crashed on purpose")


async def confirm_delete(filename: str, task: TaskContext) -> CallToolResult:
    """Asks once (`elicitation/create`) whether to delete `filename`."""
    answer = await task.elicit(f"Delete {filename}?", CONFIRM_SCHEMA)
    if answer.action == "accept" and answer.content and answer.content.get("confirm") is True:
        return _text(f"{filename} deleted")
    return _text(f"{filename} kept: the user did not confirm", is_error=True)


async def multi_input(task: TaskContext) -> str:
    """Asks two questions at once, so two input keys are outstanding together."""
    name, confirm = await task.ask_all(
        [
            elicitation_form("What is your name?", NAME_SCHEMA),
            elicitation_form("Proceed?", CONFIRM_SCHEMA),
        ]
    )
    return f"multi_input: got {json.dumps(name)} and {json.dumps(confirm)}"


async def test_tool_with_task(task: TaskContext, user_name: str = "") -> str:
    """MRTR first (the name, on tools/call), then a task that greets whoever answered."""
    await task.report("test_tool_with_task: greeting")
    return f"Hello, {user_name or 'stranger'}! (from a task)"


class FixtureTaskTools(TaskTools):
    """TaskTools plus the one composition the bridge does not offer by itself: an MRTR round
    (InputRequiredResult on `tools/call`) finished synchronously before the task is created
    (tasks-mrtr-composition). The answer is handed to the body as its `user_name` argument."""

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name == "test_tool_with_task" and declares_tasks(ctx):
            answer = (params.input_responses or {}).get("user_name")
            name = elicited(answer, "name")
            if not isinstance(name, str):
                return InputRequiredResult(
                    input_requests={"user_name": elicit("What is your name?", NAME_SCHEMA)}
                )
            params = params.model_copy(update={"arguments": {"user_name": name}})
        return await super().intercept_tool_call(params, ctx, call_next)


class Fleet:
    """The bridge this process runs on (set by the lifespan), for the change events.

    `test_trigger_*_change` announce a change twice: on the SDK's own bus, for
    `subscriptions/listen` at this server, and as a fleet event through the bridge
    (`TaskBridge.events`, issue 11 item 2), for listen streams at the hub in front.
    """

    def __init__(self, connect: Connect, service: str) -> None:
        self.connect = connect
        self.service = service
        self.bridge: TaskBridge | None = None

    def lifespan(self, tasks: TaskTools) -> Lifespan:
        @contextlib.asynccontextmanager
        async def run(_: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
            bridge = await self.connect()
            self.bridge = bridge
            try:
                async with tasks.serving(bridge):
                    yield {}
            finally:
                self.bridge = None
                await bridge.close()

        return run

    async def announce(self, kind: Literal["tools", "prompts"]) -> None:
        events = getattr(self.bridge, "events", None)  # a bridge without fleet events: none
        if events is None:
            return
        publisher = events(self.service)
        await (publisher.tools_changed() if kind == "tools" else publisher.prompts_changed())


def task_tools() -> FixtureTaskTools:
    tasks = FixtureTaskTools(ttl_ms=600_000, poll_interval_ms=200)
    tasks.add_tool(slow_compute, task_support="optional")
    tasks.add_tool(failing_job, task_support="required")
    tasks.add_tool(protocol_error_job, task_support="required")
    tasks.add_tool(confirm_delete, task_support="required")
    tasks.add_tool(multi_input, task_support="required")
    tasks.add_tool(test_tool_with_task, task_support="required")
    return tasks


# -- everything else ------------------------------------------------------------------------


def register_tools(server: MCPServer[Any], fleet: Fleet) -> None:
    @server.tool()
    def greet(name: str) -> str:
        """Sync only: says hello."""
        return f"Hello, {name}!"

    @server.tool()
    def test_simple_text() -> str:
        """A single text block."""
        return "This is a simple text response for testing."

    @server.tool()
    def test_image_content() -> list[ImageContent]:
        """A single image block."""
        return [ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")]

    @server.tool()
    def test_audio_content() -> list[AudioContent]:
        """A single audio block."""
        return [AudioContent(type="audio", data=WAV_BASE64, mime_type="audio/wav")]

    @server.tool()
    def test_embedded_resource() -> list[EmbeddedResource]:
        """A single embedded resource block."""
        resource = TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        )
        return [EmbeddedResource(type="resource", resource=resource)]

    @server.tool()
    def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
        """Text, image and resource blocks together."""
        resource = TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text='{"test": "data", "value": 123}',
        )
        return [
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG_BASE64, mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Three progress notifications on the request's own stream."""
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
        meta = ctx.request_context.meta or {}
        return str(meta.get("progress_token", meta.get("progressToken", 0)))

    @server.tool()
    def test_error_handling() -> str:
        """Raises: the SDK answers with an isError result."""
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool()
    def test_x_mcp_header(
        region: Annotated[
            str,
            Field(
                description="Mirrored into the Mcp-Param-Region header",
                json_schema_extra={"x-mcp-header": "Region"},
            ),
        ] = "<none>",
    ) -> str:
        """An `x-mcp-header` parameter (http-custom-header-server-validation)."""
        return f"region={region}"

    @server.tool()
    async def test_missing_capability(ctx: Context) -> str:
        """Needs the client's `sampling` capability; -32021 without it."""
        capabilities = ctx.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="This tool requires the client 'sampling' capability",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "Client declared sampling capability; proceeding."

    @server.tool()
    async def test_streaming_elicitation(ctx: Context) -> str:
        """Streams a progress notification before its result (never a request)."""
        await ctx.report_progress(50, 100, "half way")
        return "Streaming complete"

    @server.tool()
    async def test_logging_tool(ctx: Context) -> str:
        """Logs; the SDK sends the log only to requests that set a logLevel."""
        await ctx.info("Diagnostic trace logging activated")
        return "Logging evaluated"

    def dynamic() -> str:
        return "dynamic"

    @server.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """Changes the tool list and announces it on subscriptions/listen."""
        server.add_tool(dynamic, name="test_dynamic_tool")
        server.remove_tool("test_dynamic_tool")
        await ctx.notify_tools_changed()
        await fleet.announce("tools")
        return "tool list changed"

    @server.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """Changes the prompt list and announces it on subscriptions/listen."""
        server.add_prompt(Prompt.from_function(dynamic, name="test_dynamic_prompt"))
        server.remove_prompt("test_dynamic_prompt")
        await ctx.notify_prompts_changed()
        await fleet.announce("prompts")
        return "prompt list changed"

    @server.tool(name="json_schema_2020_12_tool")
    def json_schema_2020_12_tool() -> str:
        """Its inputSchema carries the JSON Schema 2020-12 keywords (installed below)."""
        return "json_schema_2020_12_tool"

    # MCPServer derives inputSchema from the signature and has no override; this is the
    # SDK's own fixture's way to publish a hand-written one.
    tool = server._tool_manager.get_tool("json_schema_2020_12_tool")
    assert tool is not None
    tool.parameters = JSON_SCHEMA_2020_12

    register_mrtr_tools(server)


def register_resources(server: MCPServer[Any]) -> None:
    @server.resource("test://static-text", mime_type="text/plain")
    def static_text() -> str:
        """A static text resource."""
        return "This is the content of the static text resource."

    @server.resource("test://static-binary", mime_type="image/png")
    def static_binary() -> bytes:
        """A static binary resource (a PNG)."""
        return base64.b64decode(PNG_BASE64)

    @server.resource("test://template/{id}/data", mime_type="application/json")
    def template(id: str) -> str:
        """A resource template: the id comes back in the data."""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.resource("test://watched-resource", mime_type="text/plain")
    def watched() -> str:
        """A resource that can be followed for updates."""
        return "Watched resource content"


def register_prompts(server: MCPServer[Any]) -> None:
    @server.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A prompt without arguments."""
        text = "This is a simple prompt for testing."
        return [UserMessage(role="user", content=TextContent(type="text", text=text))]

    @server.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        """A prompt with two required arguments."""
        text = f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
        return [UserMessage(role="user", content=TextContent(type="text", text=text))]

    @server.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        """A prompt that embeds the resource it is given."""
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        text = "Please process the embedded resource above."
        return [
            UserMessage(role="user", content=EmbeddedResource(type="resource", resource=resource)),
            UserMessage(role="user", content=TextContent(type="text", text=text)),
        ]

    @server.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt with an image."""
        image = ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")
        text = "Please analyze the image above."
        return [
            UserMessage(role="user", content=image),
            UserMessage(role="user", content=TextContent(type="text", text=text)),
        ]

    @server.prompt()
    async def test_input_required_result_prompt(
        ctx: Context,
    ) -> list[UserMessage] | InputRequiredResult:
        """prompts/get with an MRTR round (input-required-result-non-tool-request)."""
        responses = ctx.input_responses or {}
        if "user_context" in responses:
            context = elicited(responses["user_context"], "context") or "?"
            text = f"Use the following context: {context}"
            return [UserMessage(role="user", content=TextContent(type="text", text=text))]
        schema = {
            "type": "object",
            "properties": {"context": {"type": "string"}},
            "required": ["context"],
        }
        request = elicit("What context should the prompt use?", schema)
        return InputRequiredResult(input_requests={"user_context": request})

    @server.completion()  # type: ignore[no-untyped-call, untyped-decorator]
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        """completion/complete: no suggestions (the scenario checks the shape)."""
        return Completion(values=[], total=0, has_more=False)


def build_server(connect: Connect, service: str = DEFAULT_SERVICE) -> MCPServer[Any]:
    """The fixture; `service` names it for fleet events (the hub's `--upstream NAME=URL`)."""
    tasks = task_tools()
    fleet = Fleet(connect, service)
    server: MCPServer[Any] = MCPServer(
        NAME,
        version="0.1.0",
        instructions="Fixture for the MCP conformance suite; task tools run on taskhub's bridge.",
        extensions=[tasks],
        lifespan=fleet.lifespan(tasks),
        request_state_security=RequestStateSecurity(keys=[REQUEST_STATE_KEY]),
        cache_hints=CACHE_HINTS,
    )
    register_tools(server, fleet)
    register_resources(server)
    register_prompts(server)
    return server


def main(argv: Sequence[str] | None = None) -> None:
    """The fleet servers' command line (examples/fleet/common.py), on this fixture."""
    common_main("conformance-fixture", build_server, argv, prog="python -m conformance.fixture")


if __name__ == "__main__":
    main()
