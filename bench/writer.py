"""The writer process: task states written the way a server writes them, through the bridge.

Run by the orchestrator as `python -m bench.writer --nats-url URL --bucket NAME` and driven
by JSON-line commands (bench/control.py). Every statusMessage is a publish stamp
(bench/protocol.py), taken just before the bridge call, so latency at a client counts
the whole path: bridge encode, JetStream store, watch delivery, hub, socket.

Tasks are spread over bridges of TASKS_PER_BRIDGE each, task i on bridge i // that, as a
fleet spreads them over servers: a bridge keeps the last revision of 4096 tasks, so one
bridge cycling through 10,000 would read every task back before each write and the bench
would measure its cache misses.

Commands:
- `create`: N new tasks (bounded concurrency); returns their ids.
- `pace_start` / `pace_stop`: update given tasks round-robin at a target rate; at most one
  write per task in flight, so the compare-and-set never races itself, and at most
  `in_flight` in all if given, so a rate past the writer's own ceiling means "flat out"
  rather than a queue of stale stamps (a due update that cannot go is skipped and counted).
- `burst`: bridge updates/s at full speed, `concurrency` coroutines each on its own task.
- `populate`: N envelopes published raw (`js.publish` with a bounded number in flight),
  for the cold-start scenario; the bridge's one-by-one durability is not what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import nats
import uvloop

from bench.control import Params, serve
from bench.processes import self_cpu_seconds
from bench.protocol import stamp
from bridge import TaskBridge
from bridge.states import format_timestamp
from bridge.wire import DetailedTask, Envelope, encode, kv_stream, kv_subject

OWNER = "anonymous"  # the hub runs without auth on loopback
TICK_S = 0.002
POPULATE_TTL_MS = 86_400_000
TASKS_PER_BRIDGE = 4000  # within TaskBridge's cache of revisions (4096)


async def _bounded(count: int, concurrency: int, job: Any) -> None:
    """Run `job(i)` for i in range(count) with at most `concurrency` in flight."""
    index = iter(range(count))

    async def worker() -> None:
        for i in index:
            await job(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))


class Pacer:
    """Round-robin updates at a target rate, one write per task in flight at most."""

    def __init__(
        self,
        bridges: list[TaskBridge],
        task_ids: list[str],
        rate: float,
        in_flight: int | None = None,
    ) -> None:
        self.bridges = bridges
        self.task_ids = task_ids
        self.rate = rate
        self.in_flight = in_flight or len(task_ids)
        self.busy: set[str] = set()
        self.issued = 0
        self.done = 0
        self.skipped = 0
        self.errors = 0
        self.started = time.perf_counter()
        self.runner = asyncio.create_task(self._run())
        self.writes: set[asyncio.Task[None]] = set()

    async def _run(self) -> None:
        next_task = 0
        while True:
            await asyncio.sleep(TICK_S)
            due = int(self.rate * (time.perf_counter() - self.started)) - self.issued
            for _ in range(max(0, due)):
                self.issued += 1
                index, task_id = next_task, self.task_ids[next_task]
                next_task = (next_task + 1) % len(self.task_ids)
                if task_id in self.busy or len(self.busy) >= self.in_flight:
                    self.skipped += 1
                    continue
                self.busy.add(task_id)
                bridge = self.bridges[index // TASKS_PER_BRIDGE]
                write = asyncio.create_task(self._write(bridge, task_id))
                self.writes.add(write)
                write.add_done_callback(self.writes.discard)

    async def _write(self, bridge: TaskBridge, task_id: str) -> None:
        try:
            await bridge.working(task_id, status_message=stamp())
            self.done += 1
        except Exception:
            self.errors += 1
        finally:
            self.busy.discard(task_id)

    async def stop(self) -> Params:
        self.runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.runner
        if self.writes:
            await asyncio.wait(self.writes, timeout=10)
        seconds = time.perf_counter() - self.started
        return {
            "updates": self.done,
            "skipped": self.skipped,
            "errors": self.errors,
            "seconds": seconds,
            "rate": self.done / seconds,
        }


class Writer:
    def __init__(self, nats_url: str, bucket: str) -> None:
        self.nats_url = nats_url
        self.bucket = bucket
        self.bridges: list[TaskBridge] = []
        self.pacer: Pacer | None = None

    async def _bridges(self, tasks: int) -> list[TaskBridge]:
        """Enough bridges for `tasks` tasks (one at least), each a server of its own."""
        while len(self.bridges) * TASKS_PER_BRIDGE < max(1, tasks):
            server = "bench-writer" + (f"-{len(self.bridges) + 1}" if self.bridges else "")
            self.bridges.append(await TaskBridge.connect(self.nats_url, server, bucket=self.bucket))
        return self.bridges

    async def create(self, p: Params) -> Params:
        bridges = await self._bridges(p["count"])
        ids: list[str] = [""] * p["count"]

        async def one(i: int) -> None:
            record = await bridges[i // TASKS_PER_BRIDGE].create(
                owner=OWNER, poll_interval_ms=p.get("poll_interval_ms"), status_message=stamp()
            )
            ids[i] = record.task_id

        await _bounded(p["count"], 64, one)
        return {"task_ids": ids}

    async def pace_start(self, p: Params) -> Params:
        if self.pacer is not None:
            await self.pacer.stop()
        task_ids: list[str] = p["task_ids"]
        bridges = await self._bridges(len(task_ids))
        self.pacer = Pacer(bridges, task_ids, p["rate"], p.get("in_flight"))
        return {}

    async def pace_stop(self, p: Params) -> Params:
        if self.pacer is None:
            return {"updates": 0, "skipped": 0, "errors": 0, "seconds": 0.0, "rate": 0.0}
        pacer, self.pacer = self.pacer, None
        return await pacer.stop()

    async def burst(self, p: Params) -> Params:
        """Updates/s at full speed: each coroutine updates its own task back to back."""
        bridge = (await self._bridges(1))[0]
        concurrency: int = p["concurrency"]
        task_ids = (await self.create({"count": concurrency}))["task_ids"]
        count = 0
        deadline = time.perf_counter() + p["seconds"]

        async def loop(task_id: str) -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                await bridge.working(task_id, status_message=stamp())
                count += 1

        cpu = self_cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(loop(task_id) for task_id in task_ids))
        seconds = time.perf_counter() - started
        return {
            "updates": count,
            "seconds": seconds,
            "updates_per_s": count / seconds,
            "writer_cpu_s": self_cpu_seconds() - cpu,
        }

    async def populate(self, p: Params) -> Params:
        """`count` valid envelopes, published raw with `in_flight` acks outstanding."""
        nc = await nats.connect(self.nats_url)
        js = nc.jetstream(timeout=30)
        stream = kv_stream(self.bucket)
        created = format_timestamp(datetime.now(UTC))
        sizes: list[int] = []

        async def one(_: int) -> None:
            task_id = str(uuid.uuid4())
            # As a fleet's tasks are: a TTL, a poll interval, 20 servers.
            task = DetailedTask(
                taskId=task_id,
                status="working",
                createdAt=created,
                lastUpdatedAt=created,
                ttlMs=POPULATE_TTL_MS,
                statusMessage=stamp(),
                pollIntervalMs=5000,
            )
            sizes.append(len(encode(task)))
            data = encode(Envelope(owner=OWNER, server=f"srv-{len(sizes) % 20}", task=task))
            await js.publish(kv_subject(self.bucket, task_id), data, stream=stream)

        started = time.perf_counter()
        try:
            await _bounded(p["count"], p.get("in_flight", 1000), one)
        finally:
            await nc.close()
        seconds = time.perf_counter() - started
        return {"count": p["count"], "seconds": seconds, "json_bytes": sum(sizes) / len(sizes)}

    async def close(self) -> None:
        if self.pacer is not None:
            await self.pacer.stop()
        for bridge in self.bridges:
            await bridge.close()


async def main(nats_url: str, bucket: str) -> None:
    writer = Writer(nats_url, bucket)
    try:
        await serve(
            {
                "create": writer.create,
                "pace_start": writer.pace_start,
                "pace_stop": writer.pace_stop,
                "burst": writer.burst,
                "populate": writer.populate,
            }
        )
    finally:
        await writer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.writer", description=__doc__)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--bucket", required=True)
    args = parser.parse_args()
    uvloop.run(main(args.nats_url, args.bucket))
