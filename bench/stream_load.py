"""The load generator's SSE streams (bench/loadgen.py runs them): listen streams and the
operator stream's dashboards, read byte-wise on raw sockets.

Both kinds share one client protocol (`StreamClient`: write the request, scan the answer,
fail the `ready` future on a refusal or a lost connection, reset on close) and one load
(`StreamLoad`: a tally of frames, bytes and publish→client latency over a window, and a
close that resets every stream). What differs is what "ready" means and which frames count:
a listen stream is ready once its ack and initial snapshot arrived; a dashboard once
`synced` arrived, and only `event: task` frames after it are deliveries of a change.
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic, TypeVar, cast

from bench import protocol
from bench.control import Params
from bench.processes import self_cpu_seconds
from bench.sockets import connect
from bench.stats import latency_summary, percentile

RETRY_DELAY_S = 0.1  # before a refused stream is opened again (listen_open's `retries`)
RETRY_MAX_S = 3.0


class Tally:
    """What every stream of this process received, for the current window."""

    def __init__(self) -> None:
        self.frames = 0
        self.bytes = 0
        self.recording = False
        self.latencies: list[int] = []

    def reset(self, recording: bool) -> None:
        self.frames = 0
        self.bytes = 0
        self.recording = recording
        self.latencies = []

    def count(self, frames: int, events: bytes) -> None:
        """`frames` stamped frames arrived in `events`: counted, and timed if recording."""
        self.frames += frames
        if self.recording and frames:
            now = time.time_ns()
            self.latencies.extend(now - int(s) for s in protocol.frame_stamps(events))


class StreamClient(asyncio.Protocol):
    """One SSE response on a raw socket: `ready` resolves when the subclass says, and
    fails on a non-200 answer or a lost connection."""

    def __init__(self, request: bytes, tally: Tally) -> None:
        self.request = request
        self.tally = tally
        self.scanner = protocol.SseScanner()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.tally.bytes += len(data)
        events = self.scanner.feed(data)
        if events:
            self.events(events, data)
        elif not self.ready.done() and self.scanner.streaming and self.scanner.status != 200:
            self._fail(f"HTTP {self.scanner.status}")

    def events(self, events: bytes, data: bytes) -> None:
        raise NotImplementedError

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail("connection closed")
        self.transport = None

    def _fail(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))

    def reset(self) -> None:
        if self.transport is not None:
            self.transport.abort()


Stream = TypeVar("Stream", bound="StreamClient")


class StreamLoad(Generic[Stream]):
    """The streams of one kind this process holds, measured and closed together."""

    def __init__(self) -> None:
        self.tally = Tally()
        self.streams: list[Stream] = []

    async def measure(self, p: Params) -> Params:
        """Frames delivered to every stream for `seconds`, and (if asked) their latency."""
        seconds: float = p["seconds"]
        self.tally.reset(recording=p.get("latency", False))
        cpu = self_cpu_seconds()
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - started
        tally = self.tally
        answer: Params = {
            "frames": tally.frames,
            "bytes": tally.bytes,
            "seconds": elapsed,
            "rate": tally.frames / elapsed,
            "client_cpu_s": self_cpu_seconds() - cpu,
            "open": sum(1 for s in self.streams if s.transport is not None),
        }
        if tally.recording:
            answer.update(latency_summary(tally.latencies))
        tally.reset(recording=False)
        return answer

    async def close(self, p: Params) -> Params:
        streams, self.streams = self.streams, []
        for stream in streams:
            stream.reset()
        await asyncio.sleep(0.05)  # let the resets go out before the next command
        return {"closed": len(streams)}


# -- listen streams -----------------------------------------------------------------------


class ListenStream(StreamClient):
    """One `subscriptions/listen` response, read byte-wise until the client resets it."""

    def __init__(self, request: bytes, initial: int, tally: Tally, acked: bool = False) -> None:
        super().__init__(request, tally)
        self.initial = initial  # task frames that make up the initial snapshot
        self.acked = acked  # a peer's stream has no ack to wait for
        self.seen = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.tally.bytes += len(self.request)

    def events(self, events: bytes, data: bytes) -> None:
        frames = events.count(protocol.STAMP_MARK)
        self.tally.count(frames, events)
        if not self.ready.done():
            self.seen += frames
            self.acked = self.acked or protocol.ACK_MARK in events
            if self.acked and self.seen >= self.initial:
                self.ready.set_result(time.perf_counter())


class ListenLoad(StreamLoad[ListenStream]):
    async def open(self, p: Params) -> Params:
        port: int = p["port"]
        task_ids: list[str] = p["task_ids"]
        per_stream: int = p["per_stream"]
        count: int = p["streams"]
        window = asyncio.Semaphore(p.get("window", 1000))
        path: str | None = p.get("path")
        self.tally.reset(recording=False)

        async def one(i: int) -> None:
            # Stream i follows tasks i*k … i*k+k-1 (mod T): every task gets the same fan-out.
            follows = [task_ids[(i * per_stream + j) % len(task_ids)] for j in range(per_stream)]
            if path is None:
                request = protocol.listen(port, follows, f"s{i}")
            else:  # a peer's stream: one topic per stream
                request = protocol.event_source(port, path.format(follows[0]))
            async with window:
                for attempt in range(retries + 1):
                    _, stream = await connect(
                        port,
                        lambda: ListenStream(
                            request, per_stream, self.tally, acked=path is not None
                        ),
                    )
                    self.streams.append(stream)
                    try:
                        await stream.ready
                        return
                    except ConnectionError:
                        if attempt == retries:
                            raise
                    # Refused (an HTTP 5xx, a reset): again after a pause, as EventSource
                    # does, the pause doubling up to a browser's usual 3 s.
                    stream.reset()
                    self.streams.remove(stream)
                    retried[0] += 1
                    await asyncio.sleep(min(RETRY_MAX_S, RETRY_DELAY_S * 2**attempt))

        retries: int = p.get("retries", 0)
        retried = [0]
        cpu = self_cpu_seconds()
        started = time.perf_counter()
        async with asyncio.timeout(p.get("timeout", 120.0)):
            results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        finished = [
            s.ready.result() for s in self.streams if s.ready.done() and not s.ready.exception()
        ]
        return {
            "opened": count - len(failures),
            "failed": len(failures),
            "first_error": repr(failures[0]) if failures else "",
            "retried": retried[0],
            "seconds": (max(finished) - started) if finished else 0.0,
            "wall_seconds": time.perf_counter() - started,
            "client_cpu_s": self_cpu_seconds() - cpu,
        }


# -- operator streams (dashboards) --------------------------------------------------------


class Dashboard(StreamClient):
    """One `GET /operator/stream`, read byte-wise: its initial state (hello … synced), then
    the `event: task` frame of each change, counted per dashboard (coalescing shows as a
    dashboard seeing fewer changes than were written)."""

    def __init__(self, request: bytes, tally: Tally) -> None:
        super().__init__(request, tally)
        self.seen = 0  # task frames since the last `dashboards_seen`
        self.initial_tasks = 0  # task frames before `synced`
        self.initial_bytes = 0

    def data_received(self, data: bytes) -> None:
        if not self.ready.done():
            self.initial_bytes += len(data)
        super().data_received(data)

    def events(self, events: bytes, data: bytes) -> None:
        if self.ready.done():
            self._changes(events)
            return
        # Before `synced`: the current states, which are not deliveries of a change.
        synced = events.find(protocol.SYNCED_EVENT)
        end = synced if synced >= 0 else len(events)
        self.initial_tasks += events.count(protocol.TASK_EVENT, 0, end)
        if synced >= 0:
            self.ready.set_result(time.perf_counter())
            self._changes(events[synced:])

    def _changes(self, events: bytes) -> None:
        frames = events.count(protocol.TASK_EVENT)
        self.seen += frames
        self.tally.count(frames, events)


class DashboardLoad(StreamLoad[Dashboard]):
    async def open(self, p: Params) -> Params:
        """Open `dashboards` operator streams at once; when the last had its initial state."""
        port: int = p["port"]
        request = protocol.operator_stream(port)
        self.tally.reset(recording=False)

        async def one() -> float:
            _, dashboard = await connect(port, lambda: Dashboard(request, self.tally))
            self.streams.append(dashboard)
            synced: float = await dashboard.ready
            return synced

        cpu = self_cpu_seconds()
        started = time.perf_counter()
        async with asyncio.timeout(p.get("timeout", 120.0)):
            results = await asyncio.gather(
                *(one() for _ in range(p["dashboards"])), return_exceptions=True
            )
        failures = [r for r in results if isinstance(r, BaseException)]
        synced = sorted(r - started for r in results if isinstance(r, float))
        tasks = [d.initial_tasks for d in self.streams if d.ready.done()]
        return {
            "opened": len(synced),
            "failed": len(failures),
            "first_error": repr(failures[0]) if failures else "",
            "seconds": synced[-1] if synced else 0.0,
            "p50_seconds": percentile(synced, 50),
            "initial_tasks_min": min(tasks, default=0),
            "initial_bytes": sum(d.initial_bytes for d in self.streams),
            "client_cpu_s": self_cpu_seconds() - cpu,
        }

    async def measure(self, p: Params) -> Params:
        """Task frames delivered to all dashboards for `seconds`, and their latency."""
        return await super().measure({"latency": True, **p})

    async def seen(self, p: Params) -> Params:
        """Task frames each dashboard got since the last call: mean and fewest."""
        seen = [d.seen for d in self.streams]
        for dashboard in self.streams:
            dashboard.seen = 0
        return {"mean": sum(seen) / max(1, len(seen)), "min": min(seen, default=0)}
