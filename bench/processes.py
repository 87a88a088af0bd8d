"""The processes a bench run starts, and what they cost: CPU seconds and RSS from /proc.

Each child is started here and stopped here by its own PID (SIGTERM, then SIGKILL after a
grace period); it also gets SIGTERM from the kernel if the bench dies first, so a crashed
run leaves nothing behind. The file-descriptor limit is raised once in the bench process
and inherited by every child, because 10k streams need 10k sockets on both ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, BinaryIO

import uvloop

from hub.commands.embedded_nats import die_with_parent

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def raise_fd_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def reference_server_main(
    prog: str,
    description: str | None,
    serve: Callable[[str, str, str, int], Coroutine[Any, Any, None]],
) -> None:
    """The command line of a reference server (`bench.raw_ceiling`, `bench.origin`):
    `serve(nats_url, bucket, host, port)` on uvloop until a signal stops it."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.nats_url, args.bucket, args.host, args.port))


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a live process (/proc/<pid>/stat fields 14 and 15).

    System time is mostly socket syscalls here, so the split tells the kernel's share of
    a frame from the Python's.
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may contain spaces
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, to the nanosecond: the run time of each
    of its threads (/proc/<pid>/task/*/schedstat, first field), summed.

    /proc/<pid>/stat counts in clock ticks (10 ms): over a 3 s window of a server at 0.2
    cores, two readings truncated to a tick each moved a figure by up to 3%. A thread that
    exits between two readings takes its time with it; the servers measured here keep
    theirs (an event loop, its executor's idle workers). Without schedstat: the ticks."""
    total = 0
    try:
        for thread in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(FileNotFoundError),  # a thread gone since the listing
                open(f"/proc/{pid}/task/{thread}/schedstat", "rb") as f,
            ):
                total += int(f.read().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return sum(cpu_times(pid))
    return total / 1e9


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy, whoever ran (/proc/stat's `cpu`
    line less idle and iowait): beside the bench's own processes, what others took."""
    with open("/proc/stat", "rb") as f:
        fields = [int(value) for value in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size (/proc/<pid>/statm, second field, in pages)."""
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _append(path: Path) -> BinaryIO:
    return open(path, "ab")


class Child:
    """One process this run started; its stderr goes to a log file in the run's temp dir."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    @classmethod
    async def start(
        cls,
        name: str,
        args: list[str],
        log: Path,
        *,
        cwd: Path,
        env: dict[str, str],
        pipes: bool = False,
        new_session: bool = False,
    ) -> Child:
        """`new_session`: the child leads a process group of its own (a peer server that
        forks workers), so its whole group can be stopped without touching anything else;
        its stdout goes to the log too (Pushpin's runner logs there)."""
        with _append(log) as err:
            out: int | BinaryIO = asyncio.subprocess.DEVNULL
            if pipes:
                out = asyncio.subprocess.PIPE
            elif new_session:
                out = err
            process = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
                start_new_session=new_session,
                limit=1 << 24,  # one answer line may carry thousands of task ids
            )
        return cls(name, process, log)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def cpu_times(self) -> tuple[float, float]:
        return cpu_times(self.pid)

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM this child (by PID), SIGKILL it after `grace` seconds; its exit code."""
        process = self.process
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                await process.wait()
        return process.returncode
