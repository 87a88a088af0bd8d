"""A first read from start to end: in the hub alone, or split with a worker process.

`read_in_bulk` runs the hub's `FirstRead` (hub/store/first_read/reader.py) over the whole stream,
or, given a middle sequence, over the part up to it while a worker process reads the rest
(hub/store/first_read/worker.py), and then takes the worker's cache in (`TaskCache.merge`).
What it returns says where the watch may resume and what to log; the source
(hub/store/source.py) owns both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hub.store.cache import TaskCache
from hub.store.first_read.reader import FirstRead
from hub.store.first_read.worker import LaterHalf
from hub.store.nats_frames import Apply

log = logging.getLogger("taskhub.nats")


@dataclass
class BulkRead:
    """`applied`: the watch may resume after it (0: after what `apply` applied);
    `count` messages read, `apart` of them by the worker, `merged` the tasks that came
    over from its cache as they were; `ended_early` why the read
    stopped short ("" if it did not); `phases`: a split read's timings, for the log."""

    applied: int = 0
    count: int = 0
    apart: int = 0
    merged: int = 0
    ended_early: str = ""
    phases: str = ""


async def read_in_bulk(
    js: Any,
    stream: str,
    bucket: str,
    cache: TaskCache,
    apply: Apply,
    forget_consumer: Callable[[str], None],
    connect: tuple[list[str], dict[str, Any]],
    last_seq: int,
    worker_job: dict[str, Any] | None = None,
    mid: int = 0,
) -> BulkRead:
    """Every task up to `last_seq`; the messages after `mid` (if not 0) by a worker told
    `worker_job` (its sequences added here). `connect`: servers and nats-py options."""
    started = time.perf_counter()
    result = BulkRead()
    later = None
    if mid and worker_job is not None:
        try:
            later = await LaterHalf.start(
                {**worker_job, "start_seq": mid + 1, "stop_seq": last_seq}
            )
        except Exception as exc:  # no process to be had: this one reads it all
            log.warning("first read: no worker process (%s); reading in one", exc)
    reader = FirstRead(js, stream, bucket, apply)
    try:
        try:
            await reader.run(*connect, mid if later else last_seq)
        except Exception as exc:  # NATS unreachable, the consumer refused: the watch reads
            reader.ended_early = reader.ended_early or f"{type(exc).__name__}: {exc}"
        finally:
            if reader.consumer:
                forget_consumer(reader.consumer)
        result.count, result.ended_early = reader.count, reader.ended_early
        if later is not None and not result.ended_early:
            await _take_in(later, cache, mid, started, result)
    finally:
        if later is not None:
            await later.stop()
    return result


async def _take_in(
    later: LaterHalf, cache: TaskCache, mid: int, started: float, result: BulkRead
) -> None:
    """The hub's half is whole: the watch may resume after `mid` at least, and after
    what the worker applied once its cache is in."""
    own = time.perf_counter()
    result.applied = mid
    try:
        outcome = await later.outcome()
    except Exception as exc:
        result.ended_early = f"the worker process failed: {type(exc).__name__}: {exc}"
        return
    came = time.perf_counter()
    result.merged = cache.merge(outcome.part)
    result.applied = max(mid, outcome.applied)
    result.apart, result.count = outcome.count, result.count + outcome.count
    if outcome.ended_early:
        result.ended_early = f"the worker process: {outcome.ended_early}"
    result.phases = (
        f" (the hub's half read in {own - started:.2f} s, the worker's"
        f" {came - own:.2f} s later, taken in in {time.perf_counter() - came:.2f} s)"
    )
