"""One chaos run: start everything, write and follow under the fault plan, then check.

`run(options)` returns the report (a dict, also written to `<out>/report.json`) and keeps
the history in `<out>/history.json`; the processes' logs are under `<out>/procs`. The
whole run, teardown excepted, has a hard deadline of duration + 120 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.wire import expires_at
from tests.chaos import faults, invariants, plan, report, resources
from tests.chaos.env import Env
from tests.chaos.history import Ack, History
from tests.chaos.streams import Follower
from tests.chaos.workload import (
    Writers,
    get_task,
    poll,
    retried,
    sample_ready,
    task_dict,
)
from tests.cluster import PartitionableCluster

DRAIN_S = 60.0  # after the last write, followers have this long to see every terminal
# The soak's tasks expire, so the hubs hold a steady number of them and their memory can
# level off; the other runs keep theirs to the final reads.
SOAK_TTL_MS = 300_000
# A task whose TTL ends this near the final reads is not read (it may expire meanwhile).
EXPIRY_MARGIN_S = 120.0
CONSUMER_SETTLE_S = 30.0


@dataclass
class Options:
    seed: int
    duration: float
    tasks: int
    streams: int
    soak: bool
    out: Path


async def run(options: Options) -> dict[str, Any]:
    history = History()
    procs = options.out / "procs"
    cluster = await PartitionableCluster.create(procs / "nats")
    env = Env(procs, f"chaos-{options.seed}", history, cluster)
    fault_plan = plan.make_plan(options.seed, options.duration, options.soak)
    print(plan.format_plan(options.seed, fault_plan), flush=True)
    errors: list[str] = []
    background: list[asyncio.Task[Any]] = []
    consumer_settle: tuple[int, int, float] | None = None
    final_hubs: list[int] = []
    started = time.monotonic()
    try:
        async with asyncio.timeout(options.duration + 120.0):
            hub_env = {"TASKHUB_MAX_STREAMS_PER_PRINCIPAL": str(4 * options.streams + 50)}
            await env.open(hub_env)
            print(f"up in {time.monotonic() - started:.1f}s; {env.where_to_look()}", flush=True)
            consumer_settle, final_hubs = await _workload(
                env, options, fault_plan, errors, background
            )
    except TimeoutError:
        errors.append(f"hard deadline of {options.duration + 120:.0f}s exceeded")
    except Exception as exc:
        errors.append(f"harness error: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await env.close()
    checks, allowed = invariants.check_all(history, final_hubs, consumer_settle, errors)
    result = report.build(history, options, fault_plan, checks, allowed, env)
    result["wall_s"] = round(time.monotonic() - started, 1)
    (options.out / "report.json").write_text(json.dumps(result, indent=2, default=str))
    history.dump(options.out / "history.json")
    return result


async def _workload(
    env: Env,
    options: Options,
    fault_plan: list[plan.Fault],
    errors: list[str],
    background: list[asyncio.Task[Any]],
) -> tuple[tuple[int, int, float] | None, list[int]]:
    history = env.history
    span = options.duration * (0.93 if options.soak else 0.85)
    ttl_ms = SOAK_TTL_MS if options.soak else None
    writers = Writers(env, options.seed, options.tasks, span, ttl_ms)
    stop_faults, stop_poll, stop_bg = asyncio.Event(), asyncio.Event(), asyncio.Event()
    history.t0 = t0 = time.monotonic()
    background.append(asyncio.create_task(sample_ready(env, stop_bg)))
    background.append(
        asyncio.create_task(resources.sample_every(env, 10.0 if options.soak else 5.0, stop_bg))
    )
    poller = asyncio.create_task(poll(env, writers, stop_poll))
    background.append(poller)
    followers = [Follower(i, env, writers, options.seed) for i in range(options.streams)]
    following = [asyncio.create_task(f.run(stop_bg)) for f in followers]
    background.extend(following)
    fault_task = asyncio.create_task(faults.run_plan(env, fault_plan, t0, stop_faults))
    background.append(fault_task)
    writing = asyncio.create_task(writers.run(t0))
    background.append(writing)

    await writing
    errors.extend(writers.failures[:20])
    print(
        f"writes done at t+{time.monotonic() - t0:.1f}s "
        f"({sum(len(a) for a in history.acks.values())} acked)",
        flush=True,
    )
    await fault_task  # the plan runs to its end, even past the last write
    _, still = await asyncio.wait(following, timeout=DRAIN_S)
    for task in still:
        task.cancel()
    if still:
        stuck = [
            f"follower {f.index} waiting for {sorted(f.pending)}" for f in followers if f.pending
        ]
        errors.append(
            f"{len(still)} followers not done {DRAIN_S:.0f}s after the last write: {stuck[:3]}"
        )
    for task in following:
        if task.done() and not task.cancelled() and task.exception() is not None:
            errors.append(f"follower crashed: {task.exception()!r}")
    stop_poll.set()
    await poller

    if not await env.settle(timeout=60.0):
        errors.append("the cluster or a hub did not settle after the run")
    for task_id in list(history.unknown_creates):
        bridge = env.bridges[history.index_of[task_id] % 2]
        try:
            record = await retried(env, functools.partial(_get, bridge, task_id))
        except Exception:
            history.resolved_unknown[task_id] = None
            continue
        history.resolved_unknown[task_id] = record is not None
        if record is not None:
            stored = task_dict(record)
            history.acks[task_id].append(
                Ack(time.monotonic(), stored["status"], stored.get("statusMessage"), stored)
            )

    final_hubs = [i for i in range(len(env.hubs)) if env.alive[i]]
    limit = asyncio.Semaphore(24)

    async def final_get(hub: int, task_id: str) -> None:
        async with limit:
            await get_task(env, hub, task_id, True)

    now = time.time()
    to_read = []
    for task_id, acks in history.acks.items():
        task = acks[-1].task if acks else {}
        expiry = expires_at(task["createdAt"], task.get("ttlMs")) if task else None
        if expiry is not None and abs(expiry - now) < EXPIRY_MARGIN_S:
            history.near_expiry.add(task_id)
            continue
        if expiry is not None and expiry < now:
            history.gone.add(task_id)
        to_read.append(task_id)
    await asyncio.gather(*(final_get(h, t) for h in final_hubs for t in to_read))
    print(f"final reads done at t+{time.monotonic() - t0:.1f}s", flush=True)

    waited_from = time.monotonic()
    count = await env.consumer_count()
    while (count is None or count > len(final_hubs)) and (
        time.monotonic() - waited_from < CONSUMER_SETTLE_S
    ):
        await asyncio.sleep(0.5)
        count = await env.consumer_count()
    history.consumer_counts.append((time.monotonic(), -1 if count is None else count))
    stop_bg.set()
    await resources.sample(env)
    settle = (-1 if count is None else count, len(final_hubs), time.monotonic() - waited_from)
    return settle, final_hubs


async def _get(bridge: Any, task_id: str) -> Any:
    with contextlib.suppress(LookupError):
        return await bridge.get(task_id)
    return None
