"""Fleet server "alpha": a slow report that reports each step, and a deploy that asks first.

python -m examples.fleet.alpha --nats-url nats://127.0.0.1:4222 --port 8101
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

from bridge.mcp_server import TaskTools
from bridge.task_context import TaskContext
from examples.fleet.common import Connect, main, task_lifespan

CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "title": "Deploy now?"}},
    "required": ["confirm"],
}


async def slow_report(
    task: TaskContext, topic: str = "sales", steps: int = 4, step_seconds: float = 0.5
) -> str:
    """Compile a report section by section; each section is a progress step."""
    for step in range(1, steps + 1):
        await task.report(f"step {step} of {steps}: {topic}")
        await asyncio.sleep(step_seconds)  # the slow work this example stands in for
    return f"Report on {topic}: {steps} sections compiled"


async def deploy(service: str, task: TaskContext) -> CallToolResult:
    """Deploy a service to production once the user confirms."""
    await task.report(f"{service}: build ready")
    answer = await task.elicit(
        f"Deploy {service} to production?",
        CONFIRM_SCHEMA,
        status_message=f"{service}: waiting for confirmation",
    )
    if answer.action == "accept" and answer.content and answer.content.get("confirm") is True:
        await task.report(f"{service}: deploying")
        text = f"{service} deployed to production"
        return CallToolResult(content=[TextContent(type="text", text=text)])
    # A tool-level "no" is still a completed task: isError is not failure (H41).
    text = f"{service} not deployed: the user did not confirm"
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def build_server(connect: Connect, *, poll_interval_ms: int = 500) -> MCPServer[Any]:
    tasks = TaskTools(poll_interval_ms=poll_interval_ms)
    tasks.add_tool(slow_report, task_support="optional")
    tasks.add_tool(deploy, task_support="required")
    return MCPServer(
        "alpha",
        version="0.1.0",
        instructions="Reports and deploys; both run as tasks followed at the taskhub.",
        extensions=[tasks],
        lifespan=task_lifespan(tasks, connect),
    )


def run(argv: Sequence[str] | None = None) -> None:
    main("alpha", lambda connect, _service: build_server(connect), argv)


if __name__ == "__main__":
    run()
