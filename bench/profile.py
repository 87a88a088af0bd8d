"""Where a server's time goes: py-spy samples of its process during a measurement window.

`python -m bench --profile DIR` records the hub while it is under load (fan-out at
saturation, closed-loop polling) and writes, per window, py-spy's collapsed stacks
(`<label>.txt`, ready for flamegraph tools) and `<label>-top.txt`, the functions with
the most samples on top of the stack (self) and anywhere in it (inclusive). Sampling
perturbs the figures it watches, so a profiled run's table is not one to publish.
py-spy is optional (`pip install py-spy`); without it `--profile` only warns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

from bench.processes import Child


def available() -> bool:
    return shutil.which("py-spy") is not None


class Recording:
    """One py-spy process sampling one server for a fixed duration."""

    def __init__(self, child: Child, output: Path) -> None:
        self.child = child
        self.output = output

    @classmethod
    async def start(cls, pid: int, output: Path, seconds: float, env: dict[str, str]) -> Recording:
        # py-spy pauses the process for each sample (its default, blocking mode): a little
        # of its time, and in exchange exact stacks. Read without pausing, a stack changes
        # while it is read, and time lands on the wrong functions (in a scratch run at 1M
        # tasks, 14% "self" on one measured at 0.16 µs a call).
        args = [
            shutil.which("py-spy") or "py-spy",
            "record",
            "--pid", str(pid),
            "--duration", str(max(1, round(seconds))),
            "--rate", "200",
            "--format", "raw",
            "--output", str(output),
        ]  # fmt: skip
        log = output.with_suffix(".log")
        return cls(await Child.start("py-spy", args, log, cwd=output.parent, env=env), output)

    async def finish(self, timeout: float = 30.0, *, now: bool = False) -> str:
        """Wait for py-spy to write its file (`now`: stop it sampling first, as Ctrl-C
        does, so it writes what it has); the summary (or why there is none)."""
        if now and self.child.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.process.pid, signal.SIGINT)
        try:
            await asyncio.wait_for(self.child.process.wait(), timeout)
        except TimeoutError:
            await self.child.stop(1.0)
        if not self.output.exists():
            return f"py-spy wrote nothing: {self.child.log_tail(5)}"
        summary = summarize(self.output.read_text())
        self.output.with_name(self.output.stem + "-top.txt").write_text(summary)
        return summary


def summarize(collapsed: str, top: int = 25) -> str:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_function(frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return "no samples\n"
    lines = [f"{total} samples", "", "self %   function"]
    lines += [f"{100 * n / total:6.1f}   {name}" for name, n in own.most_common(top)]
    lines += ["", "incl %   function"]
    lines += [f"{100 * n / total:6.1f}   {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines) + "\n"


def _function(frame: str) -> str:
    """`handle (hub/app.py:97)` → `handle (hub/app.py)`: aggregate over line numbers."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({path})" if path else name
