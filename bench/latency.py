"""Publish→client latency against offered rate, hub and raw ceiling side by side.

`python -m bench.latency` holds the fan-out scenario's streams open on each server in
turn and measures a latency window at each offered rate, so a tail that grows the
same way for both is seen to be the machine's (writer, nats-server, load generator and
server sharing the cores), not the hub's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence

from bench.harness import Harness, bucket_name
from bench.processes import raise_fd_limit
from bench.scenarios import Paced, _open_streams
from bench.sizes import FULL

DEFAULT_RATES = (5_000, 10_000, 20_000, 40_000)


def _log(message: str) -> None:
    print(f"[bench.latency] {message}", flush=True)


async def measure(
    streams: int, tasks: int, rates: Sequence[int], seconds: float
) -> dict[str, list[tuple[int, float, float, float]]]:
    """Per server: (frames/s offered, delivered, p50 ms, p99 ms) for each rate."""
    results: dict[str, list[tuple[int, float, float, float]]] = {}
    async with Harness(_log) as h:
        bucket = await h.bucket(bucket_name("latency"))
        writer = await h.writer(bucket)
        loadgen = await h.loadgen()
        task_ids = (await writer.call("create", 120, count=tasks))["task_ids"]
        followers = streams / tasks
        paced = Paced(h, writer, loadgen, task_ids, followers, streams)
        for name in ("hub", "raw"):
            server = await (
                h.start_hub(bucket, max_streams=streams + 100)
                if name == "hub"
                else h.start_raw(bucket)
            )
            await _open_streams(loadgen, server, task_ids, streams, 1, 1000)
            rows = results[name] = []
            for frames in rates:
                window = await paced.window(
                    server, rate=frames / followers, seconds=seconds, warmup=1.0, latency=True
                )
                rows.append((frames, window["rate"], window["p50_ms"], window["p99_ms"]))
                _log(f"{name} at {frames:,}/s: p99 {window['p99_ms']:.1f} ms")
            await loadgen.call("listen_close", 60)
            await h.stop(server)
        await h.close_worker(writer)
        await h.close_worker(loadgen)
    return results


def table(results: dict[str, list[tuple[int, float, float, float]]]) -> str:
    lines = ["| frames/s | hub p50 / p99 | raw p50 / p99 |", "|---|---|---|"]
    for hub, raw in zip(results["hub"], results["raw"], strict=True):
        lines.append(
            f"| {hub[0]:,} | {hub[2]:.1f} / {hub[3]:.1f} ms | {raw[2]:.1f} / {raw[3]:.1f} ms |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--streams", type=int, default=FULL.fanout_streams)
    parser.add_argument("--tasks", type=int, default=FULL.fanout_tasks)
    parser.add_argument("--rates", type=int, nargs="+", default=list(DEFAULT_RATES))
    parser.add_argument("--seconds", type=float, default=3.0, help="per window")
    args = parser.parse_args(argv)
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        results = asyncio.run(measure(args.streams, args.tasks, args.rates, args.seconds))
        print(table(results))


if __name__ == "__main__":
    main()
