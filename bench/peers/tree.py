"""A peer server's processes: the tree under the one process the bench started, by PID.

nginx forks a worker; Pushpin's runner starts condure, pushpin-proxy and pushpin-handler.
What a peer costs is the sum over its tree, and which member ran out of CPU is the answer
to "which process saturated". The root leads a process group of its own, so stopping it
signals that group (only processes this run started) when a member outlives the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from bench.processes import Child, cpu_seconds, rss_bytes


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def label(pid: int) -> str:
    """A short name for a process: `nginx-worker`, `condure`, `pushpin-proxy`, ..."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    first = argv[0].decode(errors="replace")
    if first.startswith("nginx: "):  # nginx retitles itself: "nginx: worker process"
        return "nginx-" + first.split()[1]
    return os.path.basename(first) or "unknown"


def descendants(root: int) -> list[int]:
    """`root` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                children.setdefault(_parent(int(entry)), []).append(int(entry))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


class ProcessTree:
    """A started peer and its descendants; CPU and RSS summed, CPU also per member."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.members: dict[int, str] = {}

    @property
    def pid(self) -> int:
        return self.child.pid

    def refresh(self) -> dict[int, str]:
        """The tree as it is now (members seen before are remembered, for stop)."""
        for pid in descendants(self.child.pid):
            self.members.setdefault(pid, label(pid))
        return {pid: self.members[pid] for pid in descendants(self.child.pid)}

    def cpu_by_member(self) -> dict[str, float]:
        """CPU seconds per member name (two members of one name are summed)."""
        spent: dict[str, float] = {}
        for pid, name in self.refresh().items():
            with contextlib.suppress(OSError):
                spent[name] = spent.get(name, 0.0) + cpu_seconds(pid)
        return spent

    def rss_bytes(self) -> int:
        total = 0
        for pid in self.refresh():
            with contextlib.suppress(OSError):
                total += rss_bytes(pid)
        return total

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the root, then any member still alive (and the group the root leads,
        while a member keeps that group id taken); SIGKILL after `grace` seconds."""
        self.refresh()
        await self.child.stop(grace)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [pid for pid, name in self.members.items() if _running(pid, name)]
            if not alive:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, sig)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            for _ in range(int(grace / 0.05)):
                if not any(_running(pid, self.members[pid]) for pid in alive):
                    return
                await asyncio.sleep(0.05)


def _running(pid: int, name: str) -> bool:
    """Alive, not a zombie, and still the member of that name (not a reused PID)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
    return state != b"Z" and label(pid) == name
