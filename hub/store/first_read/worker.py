"""The later half of a first read, in a process of its own: the hub's second core.

A first read (hub/store/first_read/reader.py) keeps one core busy: at a million tasks the
hub checks, encodes and packs a million values
(docs/scaling.md#what-a-cached-task-costs-and-where-start-up-goes). When the bucket holds
SPLIT_FROM messages or more and the hub may run on two cores or more, the read is split
at a stream sequence `mid` (`split_at`):

- the hub reads the last value of every key up to `mid`, as a whole first read would;
- a child, `python -m hub.store.first_read.worker`, reads every message after `mid` into a
  cache of its own, through the same reader rules, and writes that cache to its stdout as
  MessagePack (`TaskCache.part`), which the hub then takes in (`TaskCache.merge`): a dict
  update, not a million checks.

The halves share no task: a key whose last value is at or before `mid` has no message
after it, and every key with one after it is the child's. With history 1, every message
after `mid` is a last value; with more history the child applies the older ones first,
as the watch would. The child's job (servers, credentials, the stream and its sequences)
comes on its stdin as one JSON line, so no secret shows in a process list, and it exits
when its stdin closes: a hub killed mid-read leaves no child behind.

Whatever goes wrong in the child (it cannot start, its read ends early, it dies) costs
speed, never a task: the hub resumes its watch after what it has applied, contiguously.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
from typing import Any

import msgspec
import nats

from hub.store.cache import CachePart, TaskCache
from hub.store.first_read.reader import FirstRead

log = logging.getLogger("taskhub.nats")

# Below this many messages one process reads them all: the child's start (an interpreter
# and its imports) would cost about what it saves.
SPLIT_FROM = 50_000
# The share of the stream's sequences the child reads: a little less than half, as
# its interpreter start and the hand-over of its cache come on top of its read, so that
# at a million tasks both halves end together
# (docs/scaling.md#what-a-cached-task-costs-and-where-start-up-goes).
CHILD_SHARE = 0.49
# How long the hub waits for the child's result after its own half is read.
RESULT_TIMEOUT_S = 120.0


class Outcome(msgspec.Struct, array_like=True):
    """What the child read: the last stream sequence it applied (every one from its
    first on too), how many messages, why it ended early ("" if it did not), its cache."""

    applied: int
    count: int
    ended_early: str
    part: CachePart


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def split_at(first_seq: int, last_seq: int, messages: int, split_from: int = SPLIT_FROM) -> int:
    """The sequence after which the child reads (0: no split)."""
    if messages < split_from or cores() < 2 or last_seq <= first_seq:
        return 0
    return first_seq + int((last_seq - first_seq) * (1 - CHILD_SHARE))


class LaterHalf:
    """The child process reading a stream's messages from `start_seq` to `stop_seq`."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdout is not None
        # Read as it comes, while the hub reads its own half: it is the child's whole cache.
        self._output = asyncio.ensure_future(process.stdout.read())

    @classmethod
    async def start(cls, job: dict[str, Any]) -> LaterHalf:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "hub.store.first_read.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps(job).encode() + b"\n")  # kept open: see `_orphaned`
        await process.stdin.drain()
        return cls(process)

    async def outcome(self, timeout: float = RESULT_TIMEOUT_S) -> Outcome:
        """The child's result; raises if it failed, said something else or took too long."""
        async with asyncio.timeout(timeout):
            data = await self._output
            code = await self.process.wait()
        if code != 0:
            raise RuntimeError(f"exited with {code}")
        return msgspec.msgpack.decode(data, type=Outcome)

    async def stop(self) -> None:
        """Kill the child if it still runs, and reap it."""
        self._output.cancel()
        if self.process.stdin is not None:
            self.process.stdin.close()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()


async def read(job: dict[str, Any]) -> Outcome:
    """The child's work: its half of the stream into a cache of its own."""
    options = job["options"]
    if options.get("tls") is not None:
        from hub.config import connect_options  # the TLS context: only when there is TLS

        options = connect_options(options)
    nc = await nats.connect(servers=job["servers"], allow_reconnect=False, **options)
    cache = TaskCache()

    def apply(key: str, seq: int, removed: bool, data: bytes) -> None:
        if removed:
            cache.apply_delete(key, seq)
        else:
            cache.apply_put(key, seq, data)

    try:
        js = nc.jetstream(timeout=10)
        reader = FirstRead(js, job["stream"], job["bucket"], apply, start_seq=job["start_seq"])
        try:
            await reader.run(job["servers"], options, job["stop_seq"])
        except Exception as exc:  # as the hub's own half: what was applied stands
            reader.ended_early = reader.ended_early or f"{type(exc).__name__}: {exc}"
        if reader.consumer:
            with contextlib.suppress(Exception):
                await js.delete_consumer(job["stream"], reader.consumer)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return Outcome(reader.applied, reader.count, reader.ended_early, cache.part())


def _orphaned() -> None:
    """Exit when stdin closes: the hub is gone (or done with us). Read from the file
    descriptor, not `sys.stdin`: a thread blocked in a buffered reader aborts the
    interpreter's exit."""
    while os.read(0, 4096):
        pass
    os._exit(3)


async def answer(job: dict[str, Any]) -> None:
    """Read, and write the outcome to stdout. Not returned to `asyncio.run`: on its way
    out (CPython 3.11) it puts back its SIGINT handler, a `partial` holding the task, and
    `signal` formats that task's repr, its result (the whole cache) and all."""
    outcome = await read(job)
    sys.stdout.buffer.write(msgspec.msgpack.encode(outcome))
    sys.stdout.buffer.flush()


def main() -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    job = json.loads(sys.stdin.buffer.readline())
    threading.Thread(target=_orphaned, daemon=True).start()
    asyncio.run(answer(job))


if __name__ == "__main__":
    main()
