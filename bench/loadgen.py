"""Load generator processes: raw uvloop sockets speaking just enough HTTP/1.1 and SSE.

Run by the orchestrator as `python -m bench.loadgen` and driven by JSON-line commands
(bench/control.py). No HTTP library: requests are prebuilt bytes (bench/protocol.py) and
answers are scanned byte-wise, so a client costs a few microseconds per frame or
response and the server stays the bottleneck. Each command reports the generator's own
CPU seconds, so a reader can tell when the client, not the server, was saturated.

Commands:
- `listen_open`: open N listen streams (at most `window` still opening at once) and
  wait for every ack and initial snapshot; `listen_measure`: count frames, bytes and
  publish→client latency for a while; `listen_close`: reset every stream. With `path`
  (e.g. `/sub?id={}`), the streams are a peer's EventSource GETs of their topic
  (bench/peers/) instead: no ack, ready at the first frame. With `retries`, a stream
  the server refuses (HTTP 5xx, reset) is opened again after a pause (RETRY_DELAY_S,
  doubling), up to that many times, and the answer counts them (`retried`).
- `poll`: closed-loop `tasks/get` on C keep-alive connections (warm-up, then measure);
  `tools_call`: the same loop of `tools/call` (the front door's load).
- `follow_poll`: each client polls its task every `interval_ms` and notes when it first
  sees each new state (staleness).
- `dashboards_open`: open N operator streams (`GET /operator/stream`) and wait until each
  has its initial state (hello … synced); `dashboards_measure`: `event: task` frames and
  write→delivery latency for a while; `dashboards_seen`: task frames per dashboard since
  the last call (whatever the hub delivered late included); `dashboards_close`: reset all.

Sockets close with SO_LINGER 0 (a reset, no TIME_WAIT), so repeated storms of 10k
connections never exhaust the loopback's ephemeral ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
from typing import Any, cast

import uvloop

from bench import protocol
from bench.control import Params, serve
from bench.processes import raise_fd_limit, self_cpu_seconds
from bench.stats import latency_summary, percentile

_LINGER_RESET = struct.pack("ii", 1, 0)
RETRY_DELAY_S = 0.1  # before a refused stream is opened again (listen_open's `retries`)
RETRY_MAX_S = 3.0


async def _connect(port: int, factory: Any) -> tuple[asyncio.Transport, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        transport, proto = await loop.create_connection(factory, sock=sock)
    except BaseException:
        sock.close()
        raise
    return transport, proto


# -- listen streams -----------------------------------------------------------------------


class Tally:
    """What every listen stream of this process received, for the current window."""

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


class ListenStream(asyncio.Protocol):
    """One `subscriptions/listen` response, read byte-wise until the client resets it."""

    def __init__(self, request: bytes, initial: int, tally: Tally, acked: bool = False) -> None:
        self.request = request
        self.initial = initial  # task frames that make up the initial snapshot
        self.tally = tally
        self.scanner = protocol.SseScanner()
        self.transport: asyncio.Transport | None = None
        self.acked = acked  # a peer's stream has no ack to wait for
        self.seen = 0
        self.ready: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)
        self.tally.bytes += len(self.request)

    def data_received(self, data: bytes) -> None:
        tally = self.tally
        tally.bytes += len(data)
        events = self.scanner.feed(data)
        if not events:
            if self.scanner.streaming and self.scanner.status != 200:
                self._fail(f"HTTP {self.scanner.status}")
            return
        frames = events.count(protocol.STAMP_MARK)
        tally.frames += frames
        if tally.recording and frames:
            now = time.time_ns()
            tally.latencies.extend(now - int(s) for s in protocol.frame_stamps(events))
        if not self.ready.done():
            self.seen += frames
            self.acked = self.acked or protocol.ACK_MARK in events
            if self.acked and self.seen >= self.initial:
                self.ready.set_result(time.perf_counter())

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail("connection closed")
        self.transport = None

    def _fail(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))

    def reset(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class ListenLoad:
    def __init__(self) -> None:
        self.tally = Tally()
        self.streams: list[ListenStream] = []

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
                    _, stream = await _connect(
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

    async def measure(self, p: Params) -> Params:
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


# -- operator streams (dashboards) --------------------------------------------------------


class Dashboard(asyncio.Protocol):
    """One `GET /operator/stream`, read byte-wise: its initial state (hello … synced), then
    the `event: task` frame of each change, counted per dashboard (coalescing shows as a
    dashboard seeing fewer changes than were written)."""

    def __init__(self, request: bytes, tally: Tally) -> None:
        self.request = request
        self.tally = tally
        self.scanner = protocol.SseScanner()
        self.transport: asyncio.Transport | None = None
        self.seen = 0  # task frames since the last `dashboards_seen`
        self.initial_tasks = 0  # task frames before `synced`
        self.initial_bytes = 0
        self.ready: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.tally.bytes += len(data)
        events = self.scanner.feed(data)
        if self.ready.done():
            if events:
                self._changes(events)
            return
        self.initial_bytes += len(data)
        if not events:
            if self.scanner.streaming and self.scanner.status != 200:
                self._fail(f"HTTP {self.scanner.status}")
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
        if not frames:
            return
        tally = self.tally
        self.seen += frames
        tally.frames += frames
        if tally.recording:
            now = time.time_ns()
            tally.latencies.extend(now - int(s) for s in protocol.frame_stamps(events))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail("connection closed")
        self.transport = None

    def _fail(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))

    def reset(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class DashboardLoad:
    def __init__(self) -> None:
        self.tally = Tally()
        self.dashboards: list[Dashboard] = []

    async def open(self, p: Params) -> Params:
        """Open `dashboards` operator streams at once; when the last had its initial state."""
        port: int = p["port"]
        request = protocol.operator_stream(port)
        self.tally.reset(recording=False)

        async def one() -> float:
            _, dashboard = await _connect(port, lambda: Dashboard(request, self.tally))
            self.dashboards.append(dashboard)
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
        tasks = [d.initial_tasks for d in self.dashboards if d.ready.done()]
        return {
            "opened": len(synced),
            "failed": len(failures),
            "first_error": repr(failures[0]) if failures else "",
            "seconds": synced[-1] if synced else 0.0,
            "p50_seconds": percentile(synced, 50),
            "initial_tasks_min": min(tasks, default=0),
            "initial_bytes": sum(d.initial_bytes for d in self.dashboards),
            "client_cpu_s": self_cpu_seconds() - cpu,
        }

    async def measure(self, p: Params) -> Params:
        """Task frames delivered to all dashboards for `seconds`, and their latency."""
        seconds: float = p["seconds"]
        self.tally.reset(recording=p.get("latency", True))
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
            "open": sum(1 for d in self.dashboards if d.transport is not None),
            **latency_summary(tally.latencies),
        }
        tally.reset(recording=False)
        return answer

    async def seen(self, p: Params) -> Params:
        """Task frames each dashboard got since the last call: mean and fewest."""
        seen = [d.seen for d in self.dashboards]
        for dashboard in self.dashboards:
            dashboard.seen = 0
        return {"mean": sum(seen) / max(1, len(seen)), "min": min(seen, default=0)}

    async def close(self, p: Params) -> Params:
        dashboards, self.dashboards = self.dashboards, []
        for dashboard in dashboards:
            dashboard.reset()
        await asyncio.sleep(0.05)  # let the resets go out before the next command
        return {"closed": len(dashboards)}


# -- request/response ---------------------------------------------------------------------


class PollRun:
    """Shared state of a closed-loop poll run: phase, counts and latencies."""

    def __init__(self, measure_from: float, measure_until: float) -> None:
        self.measure_from = measure_from
        self.measure_until = measure_until
        self.requests = 0
        self.all_requests = 0  # warm-up included
        self.errors = 0
        self.all_errors = 0  # warm-up included
        self.first_error = b""  # the first failed answer's status and body, for the report
        self.sse_answers = 0  # answers in the window whose body is an event stream
        self.bytes = 0
        self.latencies: list[int] = []
        self.idle = 0
        self.all_idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class PollConnection(asyncio.Protocol):
    """Sends the next request as soon as the previous answer is complete.

    An answer counts as an error unless it is HTTP 200 without `"error"`, and (if
    `expect` is set) containing `expect`.
    """

    def __init__(
        self, requests: list[bytes], run: PollRun, connections: int, expect: bytes = b""
    ) -> None:
        self.requests = requests
        self.expect = expect
        self.next = random.randrange(len(requests))
        self.run = run
        self.connections = connections
        self.reader = protocol.ResponseReader()
        self.transport: asyncio.Transport | None = None
        self.sent_at = 0
        self.wire_bytes = 0  # this exchange's request and response bytes so far

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        request = self.requests[self.next]
        self.next = (self.next + 1) % len(self.requests)
        self.sent_at = time.perf_counter_ns()
        self.wire_bytes = len(request)
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        run = self.run
        self.wire_bytes += len(data)
        answers = self.reader.feed(data)
        if not answers:
            return
        now = time.perf_counter()
        run.all_requests += 1
        status, body = answers[0]
        failed = status != 200 or b'"error"' in body or self.expect not in body
        if failed:
            run.all_errors += 1
            run.first_error = run.first_error or b"%d %b" % (status, body[:300])
        if run.measure_from <= now < run.measure_until:
            run.requests += 1
            run.bytes += self.wire_bytes
            run.latencies.append(time.perf_counter_ns() - self.sent_at)
            run.errors += failed
            if body.startswith((b"event:", b"data:")):
                run.sse_answers += 1
        if now >= run.measure_until:
            self._idle()
            return
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.transport = None
            self._idle()

    def _idle(self) -> None:
        run = self.run
        run.idle += 1
        if run.idle >= self.connections and not run.all_idle.done():
            run.all_idle.set_result(None)


async def poll(p: Params) -> Params:
    """Closed-loop `tasks/get` of the given tasks."""
    requests = [protocol.tasks_get(p["port"], task_id) for task_id in p["task_ids"]]
    return await closed_loop(p, requests)


# Distinct ids and arguments per request, as real callers send; the tool answer echoes them.
_CALL_VARIANTS = 16


async def tools_call(p: Params) -> Params:
    """Closed-loop `tools/call` of `tool` at `path` (`progress`: ask for progress, so an
    SDK server answers with an event stream)."""
    requests = [
        protocol.tools_call(
            p["port"],
            p["tool"],
            {"text": f"bench-{i}"},
            i + 1,
            progress=p.get("progress", False),
            path=p.get("path", "/mcp"),
        )
        for i in range(_CALL_VARIANTS)
    ]
    return await closed_loop(p, requests, expect=b'"result"')


async def closed_loop(p: Params, requests: list[bytes], expect: bytes = b"") -> Params:
    """`connections` clients, each sending its next request on each answer: a warm-up,
    then `seconds` measured."""
    port: int = p["port"]
    connections: int = p["connections"]
    start = time.perf_counter()
    run = PollRun(start + p["warmup"], start + p["warmup"] + p["seconds"])
    transports: list[asyncio.Transport] = []
    for _ in range(connections):
        transport, _ = await _connect(
            port, lambda: PollConnection(requests, run, connections, expect)
        )
        transports.append(transport)
    cpu = self_cpu_seconds()
    try:
        async with asyncio.timeout(p["warmup"] + p["seconds"] + 30.0):
            await run.all_idle
    finally:
        for transport in transports:
            transport.abort()
    seconds = p["seconds"]
    return {
        "requests": run.requests,
        "all_requests": run.all_requests,
        "rps": run.requests / seconds,
        "errors": run.errors,
        "all_errors": run.all_errors,
        "first_error": run.first_error.decode(errors="replace"),
        "sse_answers": run.sse_answers,
        "bytes": run.bytes,
        "client_cpu_s": self_cpu_seconds() - cpu,
        **latency_summary(run.latencies),
    }


class RequestConnection(asyncio.Protocol):
    """One keep-alive connection used request by request (a paced poller)."""

    def __init__(self) -> None:
        self.reader = protocol.ResponseReader()
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[tuple[int, bytes, int]] | None = None
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    async def request(self, data: bytes) -> tuple[int, bytes, int]:
        """(status, body, bytes received) of one request."""
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.received = 0
        self.transport.write(data)
        return await self.answer

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        answers = self.reader.feed(data)
        if answers and self.answer is not None and not self.answer.done():
            self.answer.set_result((*answers[0], self.received))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("connection closed"))


async def follow_poll(p: Params) -> Params:
    """Each client polls its own task every `interval_ms`; staleness of each new state seen."""
    port: int = p["port"]
    interval = p["interval_ms"] / 1000
    seconds: float = p["seconds"]
    clients: list[tuple[RequestConnection, bytes]] = []
    for task_id in p["task_ids"]:
        _, conn = await _connect(port, RequestConnection)
        clients.append((conn, protocol.tasks_get(port, task_id)))
    staleness: list[int] = []
    totals = {"requests": 0, "bytes": 0, "errors": 0}
    start = time.perf_counter()
    deadline = start + seconds

    async def follow(conn: RequestConnection, request: bytes) -> None:
        last: int | None = None
        due = start + random.uniform(0, interval)  # clients are not in phase
        while True:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if time.perf_counter() >= deadline:
                return
            status, body, received = await conn.request(request)
            totals["requests"] += 1
            totals["bytes"] += len(request) + received
            seen = protocol.body_stamp(body)
            if status != 200 or seen is None:
                totals["errors"] += 1
            elif seen != last:
                if last is not None:  # the state at start is not a change we saw late
                    staleness.append(time.time_ns() - seen)
                last = seen
            due += interval

    cpu = self_cpu_seconds()
    try:
        async with asyncio.timeout(seconds + 30.0):
            await asyncio.gather(*(follow(conn, request) for conn, request in clients))
    finally:
        for conn, _ in clients:
            if conn.transport is not None:
                conn.transport.abort()
    return {
        **totals,
        "seconds": seconds,
        "client_cpu_s": self_cpu_seconds() - cpu,
        **latency_summary(staleness, "staleness_"),
    }


async def main() -> None:
    listen = ListenLoad()
    dashboards = DashboardLoad()
    await serve(
        {
            "listen_open": listen.open,
            "listen_measure": listen.measure,
            "listen_close": listen.close,
            "dashboards_open": dashboards.open,
            "dashboards_measure": dashboards.measure,
            "dashboards_seen": dashboards.seen,
            "dashboards_close": dashboards.close,
            "poll": poll,
            "tools_call": tools_call,
            "follow_poll": follow_poll,
        }
    )
    with contextlib.suppress(Exception):
        await listen.close({})
        await dashboards.close({})


if __name__ == "__main__":
    raise_fd_limit()
    uvloop.run(main())
