"""What nats-server spends per task write, with no hub watching and with one.

The fan-out rows beside nchan count the hub's nats-server share per delivered frame
(docs/performance.md): nchan keeps what is published in its own memory, the hub reads a
JetStream bucket that the writers store to. This measures that share's floor: the bench's
writer (bench/writer.py, through the bridge) updates tasks at fixed rates while nobody
watches the bucket, then while a hub watches it, and reports nats-server's CPU per write
and per frame at 100 followers a task, as the peers' fan-out has them.

Run: `python -m bench.store_floor [--rates 100 200 400] [--seconds 10]` (~1 min).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from bench.harness import Harness, bucket_name
from bench.processes import cpu_seconds, raise_fd_limit

FOLLOWERS = 100  # per task, as in the peers' fan-out
TASKS = 20


def _log(message: str) -> None:
    print(f"[bench.store_floor] {message}", flush=True)


async def measure(rates: Sequence[int], seconds: float) -> list[tuple[str, int, float, float]]:
    """(watcher, writes/s offered, writes/s done, nats-server µs per write) per window."""
    rows: list[tuple[str, int, float, float]] = []
    async with Harness(_log) as h:
        assert h.nats.process is not None
        nats_pid = h.nats.process.pid
        bucket = await h.bucket(bucket_name("store-floor"))
        writer = await h.writer(bucket)
        task_ids = (await writer.call("create", 120, count=TASKS))["task_ids"]
        for watcher in ("none", "hub"):
            hub = await h.start_hub(bucket, max_streams=100) if watcher == "hub" else None
            for rate in rates:
                pace = {"task_ids": task_ids, "rate": rate}
                await writer.call("pace_start", 30, **pace)  # a second to warm up
                await asyncio.sleep(1.0)
                await writer.call("pace_stop", 30)
                before = cpu_seconds(nats_pid)
                await writer.call("pace_start", 30, **pace)
                await asyncio.sleep(seconds)
                done = await writer.call("pace_stop", 30)
                spent = cpu_seconds(nats_pid) - before
                rows.append((watcher, rate, done["rate"], spent / max(1, done["updates"]) * 1e6))
                _log(f"{watcher} at {rate}/s: {rows[-1][3]:.0f} µs of nats-server per write")
            if hub is not None:
                await h.stop(hub)
        await h.close_worker(writer)
    return rows


def table(rows: list[tuple[str, int, float, float]]) -> str:
    lines = [
        "| watching the bucket | writes/s offered (done) | nats-server CPU per write "
        f"| per frame at {FOLLOWERS} followers |",
        "|---|---|---|---|",
    ]
    for watcher, rate, done, per_write in rows:
        who = "nobody" if watcher == "none" else "one hub"
        lines.append(
            f"| {who} | {rate:,} ({done:,.0f}) | {per_write:.0f} µs | "
            f"{per_write / FOLLOWERS:.1f} µs |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.store_floor", description=__doc__)
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 200, 400])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    raise_fd_limit()
    print(table(asyncio.run(measure(args.rates, args.seconds))))


if __name__ == "__main__":
    main()
