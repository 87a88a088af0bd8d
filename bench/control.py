"""How the bench drives its worker processes: one JSON line in, one JSON line out.

Load generators and writers run in processes of their own, so their CPU never counts
against the server under test and never shares its event loop. The orchestrator sends
`{"cmd": name, ...params}` on the child's stdin; the child answers with one JSON object
on stdout (`{"error": ...}` when the command failed). End of stdin ends the child.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from bench.processes import Child

Params = dict[str, Any]
Handler = Callable[[Params], Awaitable[Params]]


class WorkerError(RuntimeError):
    """A worker process failed a command or died."""


class Worker:
    """The orchestrator's handle on a worker child."""

    def __init__(self, child: Child) -> None:
        self.child = child

    @classmethod
    async def start(
        cls, name: str, args: list[str], log: Path, cwd: Path, env: dict[str, str]
    ) -> Worker:
        """Start `python <args>` (e.g. `["-m", "bench.loadgen"]`) as a worker."""
        argv = [sys.executable, *args]
        return cls(await Child.start(name, argv, log, cwd=cwd, env=env, pipes=True))

    async def call(self, cmd: str, timeout: float, **params: Any) -> Params:
        process = self.child.process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(msgspec.json.encode({"cmd": cmd, **params}) + b"\n")
        try:
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), timeout)
        except (TimeoutError, ConnectionError) as exc:
            raise WorkerError(
                f"{self.child.name}: {cmd} got no answer ({type(exc).__name__}):\n"
                + self.child.log_tail()
            ) from None
        if not line:
            raise WorkerError(f"{self.child.name} exited during {cmd}:\n{self.child.log_tail()}")
        answer: Params = msgspec.json.decode(line)
        if "error" in answer:
            raise WorkerError(f"{self.child.name}: {cmd} failed: {answer['error']}")
        return answer

    async def close(self, grace: float = 10.0) -> None:
        """Close stdin (the worker's cue to exit), then stop it by PID if it lingers."""
        stdin = self.child.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(self.child.process.wait(), grace)
        except TimeoutError:
            await self.child.stop(1.0)


async def serve(handlers: Mapping[str, Handler]) -> None:
    """The worker side: answer commands from stdin until it closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        request: Params = msgspec.json.decode(line)
        name = request.pop("cmd", "")
        handler = handlers.get(name)
        try:
            if handler is None:
                raise KeyError(f"unknown command {name!r}")
            answer = await handler(request)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.buffer.write(msgspec.json.encode(answer) + b"\n")
        sys.stdout.buffer.flush()
