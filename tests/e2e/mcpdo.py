"""The Inspector CLI `mcpdo` (`@modelcontextprotocol/inspector` 2.12.0, Node 22) as a test
client: a private daemon per test (its own HOME, socket directory and token), started by the
test and stopped by PID, and one command per `mcpdo` run against a named connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from tests.e2e.npm import MCPDO, MCPDOD, TS_DIR

COMMAND_TIMEOUT = 30.0  # seconds for one mcpdo command
DAEMON_TIMEOUT = 15.0  # seconds for the daemon to come up or to go
TERMINAL = {"completed", "failed", "cancelled"}


class McpdoError(AssertionError):
    def __init__(self, code: int, payload: Any, stderr: str) -> None:
        super().__init__(f"mcpdo exited {code}: {payload}\n{stderr}")
        self.code = code
        self.payload = payload


class Mcpdo:
    """`mcpdo --format json ...` in a private environment, against the test's daemon."""

    def __init__(self, node: str, root: Path) -> None:
        self.node = node
        self.daemon_dir = root / "d"  # the socket path must stay under 107 bytes
        home = root / "home"
        home.mkdir()
        self.daemon_dir.mkdir(mode=0o700)
        self.env = {
            **os.environ,
            "HOME": str(home),  # catalog, OAuth store and secrets file live under it
            "MCP_INSPECTOR_DAEMON_DIR": str(self.daemon_dir),
            "MCP_INSPECTOR_DAEMON_TOKEN": secrets.token_hex(32),
            "MCP_INSPECTOR_SECRET_STORE": "file",  # no OS keychain here
            "NO_COLOR": "1",
        }
        self.env.pop("MCP_CATALOG_PATH", None)
        self.env.pop("MCP_STORAGE_DIR", None)
        self.daemon: asyncio.subprocess.Process | None = None

    async def run(self, *args: str) -> Any:
        """Run one command; its JSON output, or McpdoError with mcpdo's JSON error."""
        proc = await asyncio.create_subprocess_exec(
            self.node,
            str(MCPDO),
            "--format",
            "json",
            *args,
            cwd=TS_DIR,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"mcpdo {args} took over {COMMAND_TIMEOUT}s") from None
        stdout, stderr = out.decode(), err.decode()
        if proc.returncode != 0:
            raise McpdoError(proc.returncode or 0, _error_payload(stderr), stderr)
        try:
            return json.loads(stdout)
        except ValueError:
            raise AssertionError(f"mcpdo {args}: not JSON: {stdout!r}\n{stderr}") from None

    async def start_daemon(self) -> None:
        """Start `mcpdod` as mcpdo would (same script, dir and token), but as our child."""
        self.daemon = await asyncio.create_subprocess_exec(
            self.node,
            str(MCPDOD),
            cwd=TS_DIR,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        deadline = time.monotonic() + DAEMON_TIMEOUT
        while True:
            if self.daemon.returncode is not None:
                raise AssertionError(f"mcpdod exited {self.daemon.returncode}")
            try:
                status = await self.run("daemon", "status")  # never starts a daemon
                if status.get("pid") == self.daemon.pid:
                    return
            except McpdoError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"mcpdod did not answer within {DAEMON_TIMEOUT}s")
            await asyncio.sleep(0.05)

    async def stop_daemon(self) -> None:
        # Closes every connection; would also stop a daemon some command had started itself.
        with contextlib.suppress(AssertionError):
            await self.run("daemon", "stop")
        daemon = self.daemon
        if daemon is None:
            return
        try:
            async with asyncio.timeout(DAEMON_TIMEOUT):
                await daemon.wait()
        except TimeoutError:
            daemon.kill()
            await daemon.wait()

    async def connect(self, name: str, url: str, era: str = "modern") -> dict[str, Any]:
        connection: dict[str, Any] = await self.run("connect", f"@{name}", url, "--era", era)
        return connection

    async def call(self, name: str, tool: str, arguments: dict[str, Any]) -> Any:
        return await self.run(
            f"@{name}", "tools/call", tool, "--tool-args-json", json.dumps(arguments)
        )

    async def get(self, name: str, task_id: str) -> dict[str, Any]:
        task: dict[str, Any] = (await self.run(f"@{name}", "tasks/get", task_id))["task"]
        return task

    async def until_terminal(self, name: str, task_id: str) -> dict[str, Any]:
        """mcpdo `tasks/get` until the task is terminal (bounded)."""
        deadline = time.monotonic() + 20
        while (task := await self.get(name, task_id))["status"] not in TERMINAL:
            assert time.monotonic() < deadline, f"{task_id} still {task['status']}"
            await asyncio.sleep(0.05)
        return task


def _error_payload(stderr: str) -> Any:
    """mcpdo's JSON error (`{"error": {...}}`, the last stderr line), else the raw text."""
    for line in reversed(stderr.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return stderr
