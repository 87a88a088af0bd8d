"""The fleet demo's client: call each tool on its own server, follow the task at the hub.

    python -m examples.fleet.client --hub URL --alpha URL --beta URL [--decline]

Every call goes to the fleet server that owns the tool; the answer is a task. From then
on the client talks to the hub only: it listens to the task's states, answers the deploy
confirmation with tasks/update, and reads the outcome from the final state.
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
    hub_url: str,
    alpha_url: str,
    beta_url: str,
    *,
    confirm: bool = True,
    say: Say = print,
    step_seconds: float = 0.5,
) -> dict[str, dict[str, Any]]:
    """Run the three flows; the final state of each task, by tool name."""
    finals: dict[str, dict[str, Any]] = {}
    hub = HubTasks()
    alpha = Client(alpha_url, extensions=[TaskCalls()], elicitation_callback=answer_elicitation)
    beta = Client(beta_url, extensions=[TaskCalls()])
    async with hub.connect(hub_url), alpha, beta:
        say(f"alpha: {alpha_url}\nbeta:  {beta_url}\nhub:   {hub_url}\n")
        say("1. a slow report on alpha, followed at the hub")
        report = {"topic": "sales", "steps": 3, "step_seconds": step_seconds}
        task_id = await call(alpha, "slow_report", report, say)
        finals["slow_report"] = await follow(hub, task_id, say, confirm=confirm)

        say("\n2. a deploy on alpha that asks for confirmation, answered at the hub")
        task_id = await call(alpha, "deploy", {"service": "billing"}, say)
        finals["deploy"] = await follow(hub, task_id, say, confirm=confirm)

        say("\n3. an archive lookup on beta that fails with a JSON-RPC error")
        task_id = await call(beta, "lookup", {"key": "invoice-2099-404"}, say)
        finals["lookup"] = await follow(hub, task_id, say, confirm=confirm)
    return finals


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.fleet.client")
    parser.add_argument("--hub", required=True, help="the hub's MCP endpoint URL")
    parser.add_argument("--alpha", required=True, help="server alpha's MCP endpoint URL")
    parser.add_argument("--beta", required=True, help="server beta's MCP endpoint URL")
    parser.add_argument("--decline", action="store_true", help="answer the deploy with no")
    args = parser.parse_args(argv)
    asyncio.run(demo(args.hub, args.alpha, args.beta, confirm=not args.decline))


if __name__ == "__main__":
    main()
