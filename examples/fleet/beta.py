"""Fleet server "beta": an archive lookup that fails, as a task, with a JSON-RPC error.

python -m examples.fleet.beta --nats-url nats://127.0.0.1:4222 --port 8102
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from bridge.mcp_server import TaskTools
from bridge.task_context import TaskContext
from examples.fleet.common import Connect, main, task_lifespan

ARCHIVE = {"invoice-2024-001": "paid in full on 2024-02-03"}


async def lookup(key: str, task: TaskContext) -> str:
    """Look a record up in the (slow) archive; an unknown key fails the task."""
    await task.report(f"searching the archive for {key!r}")
    record = ARCHIVE.get(key)
    if record is None:
        # A JSON-RPC error from the tool: the task ends failed with exactly this error.
        raise MCPError(INVALID_PARAMS, f"No archive record {key!r}", data={"key": key})
    return f"{key}: {record}"


def build_server(connect: Connect, *, poll_interval_ms: int = 500) -> MCPServer[Any]:
    tasks = TaskTools(poll_interval_ms=poll_interval_ms)
    tasks.add_tool(lookup, task_support="optional")
    return MCPServer(
        "beta",
        version="0.1.0",
        instructions="Archive lookups, run as tasks followed at the taskhub.",
        extensions=[tasks],
        lifespan=task_lifespan(tasks, connect),
    )


def run(argv: Sequence[str] | None = None) -> None:
    main("beta", lambda connect, _service: build_server(connect), argv)


if __name__ == "__main__":
    run()
