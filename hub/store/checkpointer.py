"""When the hub reads and writes its checkpoint (`--checkpoint`; the file:
hub/store/checkpoint_file.py).

`Checkpoints` owns the file's life in a running hub: read once at start, before the watch;
written every `--checkpoint-every` seconds while the hub is ready and its watch applied
something new, a slice per event-loop turn so the hub keeps answering; and once more at
stop, after the watch has ended. `NatsSource` (hub/store/source.py) tells it the stream it
follows and how far its watch applied it.

A write while running cannot be the cache as of one instant without stopping the hub: the
ids are copied in one turn and the head records the sequence applied then, while each
slice holds its tasks as they are when it is written, never older than at that sequence.
That is enough: on restart the watch resumes after that sequence, and with history 1 the
stream still holds the latest message of every key changed since, so each task comes back
to its latest state (a value the file already has comes again as the same message twice,
which the cache ignores). A bucket made anew meanwhile, or the hub closing, abandons it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from hub.metrics import Metrics
from hub.store import checkpoint_file
from hub.store.cache import TaskCache

log = logging.getLogger("taskhub.checkpoint")

# A write while running comes no sooner than this many times as long as the last one took:
# writing them costs the hub at most a twentieth of its time.
SPACING = 20


class Watched(Protocol):
    """What the checkpoints need to know of the watch (hub/store/source.py)."""

    @property
    def ready(self) -> bool: ...

    @property
    def applied_seq(self) -> int: ...

    @property
    def stream_created(self) -> str: ...


class Checkpoints:
    def __init__(
        self,
        path: Path,
        every: float,
        *,
        bucket: str,
        cache: TaskCache,
        metrics: Metrics,
        watched: Watched,
    ) -> None:
        self.path = path
        self.every = every  # seconds; 0: only at stop
        self.bucket = bucket
        self.cache = cache
        self.metrics = metrics
        self.watched = watched
        self._task: asyncio.Task[None] | None = None  # the writes while running
        self._writing = False  # one is under way (close waits for it)
        self._closing = False
        self._saved_seq = 0  # the sequence the file holds, as far as we know
        self._resets = 0  # times the stream was found made anew

    def restore(self, stream_created: str, last_seq: int) -> int | None:
        """Fill the empty cache from the file, if it is whole and of this stream; the
        sequence the watch resumes after, or None (the whole bucket is read)."""
        checkpoint_file.remove_leftovers(self.path)
        started = time.perf_counter()
        saved = checkpoint_file.read(
            self.path, bucket=self.bucket, stream_created=stream_created, last_seq=last_seq
        )
        if saved is None:
            return None
        try:
            held = self.cache.restore(saved.task_ids, saved.packed)
        except ValueError as exc:
            checkpoint_file.set_aside(self.path, f"holds a value that is not a task ({exc})")
            return None
        self._saved_seq = saved.seq
        log.info(
            "checkpoint: %d tasks as of stream sequence %d read in %.2f s (%d expired since); "
            "reading the %d messages after it",
            held,
            saved.seq,
            time.perf_counter() - started,
            len(saved.task_ids) - held,
            last_seq - saved.seq,
        )
        return saved.seq

    def start(self) -> None:
        """Begin the writes while running (none if `every` is 0)."""
        if self.every > 0:
            self._task = asyncio.create_task(self._now_and_then())

    def made_anew(self) -> None:
        """The stream was found deleted and made anew: the file (and a write under way)
        describes the old one."""
        self._resets += 1
        self._saved_seq = 0

    async def close(self) -> None:
        """No more writes while running. One under way stops at its next slice, or
        finishes its commit: a thread fsyncing the file must not have it taken away."""
        self._closing = True
        if self._task is not None:
            if not self._writing:
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def save(self) -> None:
        """The stop's write, at once (the watch has ended: nothing changes the cache
        meanwhile); none when the file already holds the sequence applied."""
        created, seq = self.watched.stream_created, self.watched.applied_seq
        if not created:
            return  # never watched: nothing known to save
        if seq == self._saved_seq and self.path.exists():
            log.info("checkpoint: %s already holds stream sequence %d", self.path, seq)
            return
        started = time.perf_counter()
        task_ids, packed = self.cache.packed()
        try:
            size = checkpoint_file.write(
                self.path,
                bucket=self.bucket,
                stream_created=created,
                seq=seq,
                task_ids=task_ids,
                packed=packed,
            )
        except OSError as exc:
            self._failed(exc)
            return
        self._written(seq, len(task_ids), size, started, logging.INFO)

    async def _now_and_then(self) -> None:
        pause = self.every
        while not self._closing:
            await asyncio.sleep(pause)
            if not self.watched.ready or self.watched.applied_seq == self._saved_seq:
                continue
            started = time.perf_counter()
            self._writing = True
            try:
                await self._write_in_slices()
            except Exception:  # a bug, not the disk: say so, and keep the next ones coming
                self.metrics.checkpoint_failures.inc()
                log.exception("checkpoint %s not written", self.path)
            finally:
                self._writing = False
            pause = max(self.every, SPACING * (time.perf_counter() - started))

    async def _write_in_slices(self) -> None:
        """A write while running (see the module doc)."""
        seq, created, resets = self.watched.applied_seq, self.watched.stream_created, self._resets
        started = time.perf_counter()
        task_ids = self.cache.task_ids()
        try:
            writer = checkpoint_file.Writer(
                self.path, bucket=self.bucket, stream_created=created, seq=seq
            )
            try:
                for start in range(0, len(task_ids), checkpoint_file.SLICE):
                    await asyncio.sleep(0)  # the hub's other work between slices
                    if self._closing or self._resets != resets:
                        writer.abandon()
                        return
                    writer.add(
                        *self.cache.packed_of(task_ids[start : start + checkpoint_file.SLICE])
                    )
            except BaseException:
                writer.abandon()
                raise
            size = await asyncio.to_thread(writer.commit)  # the fsync: off the loop
        except OSError as exc:
            self._failed(exc)
            return
        if self._resets == resets:  # else a file of the old stream: the next start sets it aside
            self._written(seq, writer.count, size, started, logging.DEBUG)

    def _written(self, seq: int, count: int, size: int, started: float, level: int) -> None:
        self._saved_seq = seq
        self.metrics.checkpoint_written.set(time.time())
        log.log(
            level,
            "checkpoint: %d tasks as of stream sequence %d written to %s (%.1f MB, %.2f s)",
            count,
            seq,
            self.path,
            size / 1e6,
            time.perf_counter() - started,
        )

    def _failed(self, exc: OSError) -> None:
        self.metrics.checkpoint_failures.inc()
        log.warning("checkpoint %s not written: %s", self.path, exc)
