"""The fleet demo's client: call each tool on its server, follow the task, answer it.

    python -m examples.fleet.client --alpha URL --beta URL [--hub URL] [--decline]

A client as MCP clients are built: one URL per server. Behind the hub as front door
(`taskhub serve --upstream alpha=... --upstream beta=...`, as `examples.fleet.run` starts
it) each URL is the hub's `/servers/NAME/mcp`, and the client does everything there: the
tool call (forwarded to the server, answered with a task), the listen stream of the task's
states, the `tasks/update` that answers the deploy confirmation. With `--hub`, tasks are
followed at that URL instead (servers reached directly, the hub beside them).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.context import ClientRequestContext

from examples.fleet.tasks_client import CreateTaskResult, HubTasks, TaskCalls

Say = Callable[[str], None]


def describe(state: dict[str, Any]) -> str:
    """One line per task state, as the hub pushed it."""
    line = f"  [{state['status']}]"
    if "statusMessage" in state:
        line += f" {state['statusMessage']}"
    if state["status"] == "completed":
        texts = [c.get("text", "") for c in state["result"].get("content", [])]
        error = " (isError)" if state["result"].get("isError") else ""
        line += f" -> {' '.join(texts)}{error}"
    if state["status"] == "failed":
        error = state["error"]
        line += f" -> error {error['code']}: {error['message']}"
    return line


async def call(client: Client, tool: str, arguments: dict[str, Any], say: Say) -> str:
    """tools/call on a fleet server; the CreateTaskResult's task id."""
    created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    if not isinstance(created, CreateTaskResult):
        raise RuntimeError(f"{tool} answered without a task: {created}")
    say(f"{tool}: the server answered with task {created.task_id} ({created.status})")
    return created.task_id


async def follow(hub: HubTasks, task_id: str, say: Say, *, confirm: bool) -> dict[str, Any]:
    """Print every state the hub pushes; answer questions; return the final state."""
    answered: set[str] = set()
    final: dict[str, Any] = {}
    async for state in hub.follow(task_id):
        say(describe(state))
        final = state
        for key, request in state.get("inputRequests", {}).items():
            if key in answered:
                continue
            answered.add(key)
            say(f"  question: {request['params']['message']} -> answering confirm={confirm}")
            answer = {"action": "accept", "content": {"confirm": confirm}}
            await hub.update(task_id, {key: answer})
    return final


async def answer_elicitation(
    context: ClientRequestContext, params: types.ElicitRequestParams
) -> types.ElicitResult:
    """Declares form elicitation to the fleet (a task may ask only for what the call
    declared); in this demo the questions are answered through the hub instead."""
    return types.ElicitResult(action="decline")


async def demo(
    alpha_url: str,
    beta_url: str,
    *,
    hub_url: str | None = None,
    confirm: bool = True,
    say: Say = print,
    step_seconds: float = 0.5,
) -> dict[str, dict[str, Any]]:
    """Run the three flows; the final state of each task, by tool name."""
    finals: dict[str, dict[str, Any]] = {}
    alpha = Client(alpha_url, extensions=[TaskCalls()], elicitation_callback=answer_elicitation)
    beta = Client(beta_url, extensions=[TaskCalls()])
    alpha_tasks, beta_tasks = HubTasks(), HubTasks()
    async with (
        alpha,
        beta,
        alpha_tasks.connect(hub_url or alpha_url),
        beta_tasks.connect(hub_url or beta_url),
    ):
        say(f"alpha: {alpha_url}\nbeta:  {beta_url}")
        say(f"tasks followed at {hub_url or 'the same URLs'}\n")
        say("1. a slow report on alpha, its progress pushed as it happens")
        report = {"topic": "sales", "steps": 3, "step_seconds": step_seconds}
        task_id = await call(alpha, "slow_report", report, say)
        finals["slow_report"] = await follow(alpha_tasks, task_id, say, confirm=confirm)

        say("\n2. a deploy on alpha that asks for confirmation, answered with tasks/update")
        task_id = await call(alpha, "deploy", {"service": "billing"}, say)
        finals["deploy"] = await follow(alpha_tasks, task_id, say, confirm=confirm)

        say("\n3. an archive lookup on beta that fails with a JSON-RPC error")
        task_id = await call(beta, "lookup", {"key": "invoice-2099-404"}, say)
        finals["lookup"] = await follow(beta_tasks, task_id, say, confirm=confirm)
    return finals


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.fleet.client")
    parser.add_argument("--alpha", required=True, help="server alpha's MCP URL (at the hub)")
    parser.add_argument("--beta", required=True, help="server beta's MCP URL (at the hub)")
    parser.add_argument("--hub", help="follow tasks at this hub URL instead of each server's")
    parser.add_argument("--decline", action="store_true", help="answer the deploy with no")
    args = parser.parse_args(argv)
    asyncio.run(demo(args.alpha, args.beta, hub_url=args.hub, confirm=not args.decline))


if __name__ == "__main__":
    main()
