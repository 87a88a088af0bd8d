"""The writer process: task states written the way a server writes them, through the bridge.

Run by the orchestrator as `python -m bench.writer --nats-url URL --bucket NAME` and driven
by JSON-line commands (bench/control.py). Every statusMessage is a publish stamp
(bench/protocol.py), taken just before the bridge call, so latency at a client counts
the whole path: bridge encode, JetStream store, watch delivery, hub, socket.

Commands:
- `create`: N new tasks (bounded concurrency); returns their ids.
- `pace_start` / `pace_stop`: update given tasks round-robin at a target rate; at most one
  write per task in flight, so the compare-and-set never races itself (a due update whose
  task is still busy is skipped and counted).
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
from msgspec import UNSET

from bench.control import Params, serve
from bench.processes import self_cpu_seconds
from bench.protocol import stamp
from bridge import TaskBridge
from bridge.states import format_timestamp
from bridge.wire import DetailedTask, Envelope, encode, kv_stream, kv_subject

OWNER = "anonymous"  # the hub runs without auth on loopback
TICK_S = 0.002


async def _bounded(count: int, concurrency: int, job: Any) -> None:
    """Run `job(i)` for i in range(count) with at most `concurrency` in flight."""
    index = iter(range(count))

    async def worker() -> None:
        for i in index:
            await job(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))


class Pacer:
    """Round-robin updates at a target rate, one write per task in flight at most."""

    def __init__(self, bridge: TaskBridge, task_ids: list[str], rate: float) -> None:
        self.bridge = bridge
        self.task_ids = task_ids
        self.rate = rate
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
                task_id = self.task_ids[next_task]
                next_task = (next_task + 1) % len(self.task_ids)
                if task_id in self.busy:
                    self.skipped += 1
                    continue
                self.busy.add(task_id)
                write = asyncio.create_task(self._write(task_id))
                self.writes.add(write)
                write.add_done_callback(self.writes.discard)

    async def _write(self, task_id: str) -> None:
        try:
            await self.bridge.working(task_id, status_message=stamp())
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
        self.bridge: TaskBridge | None = None
        self.pacer: Pacer | None = None

    async def _bridge(self) -> TaskBridge:
        if self.bridge is None:
            self.bridge = await TaskBridge.connect(
                self.nats_url, "bench-writer", bucket=self.bucket
            )
        return self.bridge

    async def create(self, p: Params) -> Params:
        bridge = await self._bridge()
        ids: list[str] = [""] * p["count"]

        async def one(i: int) -> None:
            record = await bridge.create(
                owner=OWNER, poll_interval_ms=p.get("poll_interval_ms"), status_message=stamp()
            )
            ids[i] = record.task_id

        await _bounded(p["count"], 64, one)
        return {"task_ids": ids}

    async def pace_start(self, p: Params) -> Params:
        if self.pacer is not None:
            await self.pacer.stop()
        self.pacer = Pacer(await self._bridge(), p["task_ids"], p["rate"])
        return {}

    async def pace_stop(self, p: Params) -> Params:
        if self.pacer is None:
            return {"updates": 0, "skipped": 0, "errors": 0, "seconds": 0.0, "rate": 0.0}
        pacer, self.pacer = self.pacer, None
        return await pacer.stop()

    async def burst(self, p: Params) -> Params:
        """Updates/s at full speed: each coroutine updates its own task back to back."""
        bridge = await self._bridge()
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

        async def one(_: int) -> None:
            task_id = str(uuid.uuid4())
            task = DetailedTask(
                taskId=task_id,
                status="working",
                createdAt=created,
                lastUpdatedAt=created,
                ttlMs=None,
                statusMessage=stamp(),
                pollIntervalMs=UNSET,
            )
            data = encode(Envelope(owner=OWNER, server="bench-writer", task=task))
            await js.publish(kv_subject(self.bucket, task_id), data, stream=stream)

        started = time.perf_counter()
        try:
            await _bounded(p["count"], p.get("in_flight", 1000), one)
        finally:
            await nc.close()
        return {"count": p["count"], "seconds": time.perf_counter() - started}

    async def close(self) -> None:
        if self.pacer is not None:
            await self.pacer.stop()
        if self.bridge is not None:
            await self.bridge.close()


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
