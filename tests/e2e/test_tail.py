"""`taskhub tail` as a user runs it: a real process reading a real hub's operator stream.

The hub runs in this event loop (`start_served_hub`) or as `taskhub serve` (`HubProcess`)
on the session's nats-server; tasks are written with the bridge, as servers write them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge import TaskBridge
from tests.cluster import HubProcess
from tests.helpers import eventually, mint_token, start_served_hub

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
SECRET = "tail-tests-secret-of-at-least-32-bytes!"


class Tail:
    """A `taskhub tail` child process; its stdout read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    async def line(self, predicate: Callable[[str], bool], timeout: float = 10.0) -> str:
        """The next stdout line that satisfies `predicate` (all lines are kept)."""
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    raise EOFError(f"tail ended; its lines: {self.lines}")
                line = raw.decode().rstrip("\n")
                self.lines.append(line)
                if predicate(line):
                    return line

    async def finish(self, timeout: float = 15.0) -> tuple[int, str]:
        """Exit code and stderr once it exits; the rest of stdout joins `lines`."""
        assert self.process.stdout is not None and self.process.stderr is not None
        async with asyncio.timeout(timeout):
            rest, err = await asyncio.gather(self.process.stdout.read(), self.process.stderr.read())
            code = await self.process.wait()
        self.lines += rest.decode().splitlines()
        return code, err.decode()


@asynccontextmanager
async def tail(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[Tail]:
    environment = {k: v for k, v in os.environ.items() if k != "TASKHUB_TOKEN"}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hub.commands.cli", "tail", *args),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**environment, **(env or {})},
    )
    try:
        yield Tail(process)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def task_line(task_id: str, status: str | None = None) -> Callable[[str], bool]:
    def matches(line: str) -> bool:
        data = json.loads(line)
        task = data.get("task", {})
        return task.get("taskId") == task_id and (status is None or task["status"] == status)

    return matches


@asynccontextmanager
async def bridge(nats_url: str, bucket: str, server_id: str) -> AsyncIterator[TaskBridge]:
    async with await TaskBridge.connect(nats_url, server_id, bucket=bucket) as tasks:
        yield tasks


async def test_until_done_follows_the_named_tasks_to_their_end(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    try:
        async with bridge(nats_url, bucket, server_id) as tasks:
            a = (await tasks.create(owner="anonymous", status_message="step 1 of 2")).task_id
            b = (await tasks.create(owner="anonymous")).task_id
            other = (await tasks.create(owner="anonymous")).task_id
            await eventually(lambda: harness.hub.cache.get(other) is not None)
            args = ("--url", harness.url, "--until-done", "--json", "--task", a, "--task", b)
            async with tail(*args) as process:
                await process.line(task_line(a, "working"))
                await tasks.working(a, status_message="step 2 of 2")
                await tasks.complete(a, {"content": []})
                await process.line(task_line(a, "completed"))
                assert process.process.returncode is None  # b is still working
                await tasks.fail(b, {"code": -32603, "message": "boom"})
                code, err = await process.finish()
        assert code == 0, err
        events = [json.loads(line) for line in process.lines]  # every line is JSON
        assert {e["task"]["taskId"] for e in events} == {a, b}  # --task: not `other`
        assert all(e["event"] == "task" and e["owner"] == "anonymous" for e in events)
        assert all(e["server"] == server_id for e in events)
        last = {e["task"]["taskId"]: e["task"] for e in events}
        assert last[a]["status"] == "completed" and last[a]["result"]["content"] == []
        assert last[b]["status"] == "failed" and last[b]["error"]["message"] == "boom"
    finally:
        await harness.stop()


async def test_an_authenticated_hub_refuses_tail_without_a_token(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path, jwt_secret=SECRET)
    try:
        async with tail("--url", harness.url, "--until-done", "--json") as process:
            code, err = await process.finish()
        assert code == 2
        assert process.lines == []
        assert len(err.strip().splitlines()) == 1, err
        assert "401" in err and "--token" in err

        bad = mint_token("another-secret-of-at-least-32-bytes!!", "alice")
        async with tail("--url", harness.url, "--until-done", env={"TASKHUB_TOKEN": bad}) as p:
            code, err = await p.finish()
        assert code == 2 and "401" in err

        good = mint_token(SECRET, "alice")  # alice has no tasks: done at `synced`
        async with tail("--url", harness.url, "--until-done", env={"TASKHUB_TOKEN": good}) as p:
            code, err = await p.finish()
        assert code == 0, err

        async with tail("--url", harness.url, "--token", good, "--status", "bogus") as p:
            code, err = await p.finish()
        assert code == 2 and "400" in err and "bogus" in err

        async with tail("--url", harness.url, "--token", good, "--owner", "bob") as p:
            code, err = await p.finish()  # only operators may look at others' tasks
        assert code == 2 and "403" in err and len(err.strip().splitlines()) == 1
    finally:
        await harness.stop()


async def test_plain_lines_when_stdout_is_not_a_terminal(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    try:
        async with bridge(nats_url, bucket, server_id) as tasks:
            task_id = (await tasks.create(owner="anonymous", status_message="warming up")).task_id
            async with tail("--url", harness.url, "--server", server_id) as process:
                await process.line(lambda line: "connected to" in line)
                first = await process.line(lambda line: task_id in line)
                assert "working" in first and f"server={server_id}" in first
                await tasks.working(task_id, status_message="step 2 of 4")
                step = await process.line(lambda line: task_id in line)
                assert "[50%]" in step and "'step 2 of 4'" in step
                await tasks.complete(task_id, {"content": []})
                done = await process.line(lambda line: task_id in line)
                assert " completed " in done
                process.process.send_signal(signal.SIGINT)  # Ctrl-C
                code, err = await process.finish()
        assert code == 130 and err == ""
        assert not any(line.lstrip().startswith("{") for line in process.lines)
    finally:
        await harness.stop()


async def test_tail_waits_for_an_unreachable_hub_and_reconnects(
    nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> None:
    hub = HubProcess(tmp_path / "hub", nats_url, bucket, "--log-level", "warning")
    try:
        async with bridge(nats_url, bucket, server_id) as tasks:
            task_id = (await tasks.create(owner="anonymous")).task_id
            args = ("--url", hub.url, "--until-done", "--json", "--task", task_id)
            async with tail(*args) as process:
                assert process.process.stderr is not None
                notice = await asyncio.wait_for(process.process.stderr.readline(), 10)
                assert b"disconnected \xe2\x80\x94 reconnecting" in notice  # the hub is not up
                hub.start()
                async with httpx.AsyncClient() as client:
                    await hub.wait_ready(client)
                await process.line(task_line(task_id, "working"), timeout=20)
                hub.stop()  # the stream ends; tail keeps trying
                await tasks.complete(task_id, {"content": []})
                hub.start()
                code, _ = await process.finish(timeout=30)
        assert code == 0
        statuses: list[Any] = [json.loads(line)["task"]["status"] for line in process.lines]
        assert statuses[0] == "working" and statuses[-1] == "completed"
    finally:
        hub.stop()
