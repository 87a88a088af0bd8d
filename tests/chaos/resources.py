"""Resource samples of the run's processes: RSS and open fds from /proc, consumer count."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from tests.chaos.env import Env


def rss_kb(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def open_fds(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return None


async def sample(env: Env) -> dict[str, Any]:
    procs: dict[str, int] = {}
    for i, hub in enumerate(env.hubs):
        if hub.process is not None and hub.process.poll() is None:
            procs[f"hub{i}"] = hub.process.pid
    for node in env.cluster.nodes:
        if node.process is not None and node.process.poll() is None:
            procs[node.name] = node.process.pid
    row: dict[str, Any] = {"t": env.history.rel(time.monotonic())}
    for name, pid in procs.items():
        row[name] = {"pid": pid, "rss_kb": rss_kb(pid), "fds": open_fds(pid)}
    row["consumers"] = await env.consumer_count()
    env.history.resources.append(row)
    return row


async def sample_every(env: Env, interval: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await sample(env)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
