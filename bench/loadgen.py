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
- `follow_start`, `follow_measure`, `follow_stop`: pollers and listeners following tasks
  at once, and the staleness of each new state they see (bench/follow_load.py; the
  upstream_tasks scenario).
- `dashboards_open`: open N operator streams (`GET /operator/stream`) and wait until each
  has its initial state (hello … synced); `dashboards_measure`: `event: task` frames and
  write→delivery latency for a while; `dashboards_seen`: task frames per dashboard since
  the last call (whatever the hub delivered late included); `dashboards_close`: reset all.

The streams live in bench/stream_load.py; sockets close with a reset (bench/sockets.py),
so repeated storms of 10k connections never exhaust the loopback's ephemeral ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import cast

import uvloop

from bench import protocol
from bench.control import Params, serve
from bench.follow_load import FollowLoad
from bench.processes import raise_fd_limit, self_cpu_seconds
from bench.sockets import connect
from bench.stats import latency_summary
from bench.stream_load import DashboardLoad, ListenLoad

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
        transport, _ = await connect(
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
        _, conn = await connect(port, RequestConnection)
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
    follow = FollowLoad()
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
            "follow_start": follow.start,
            "follow_measure": follow.measure,
            "follow_stop": follow.stop,
        }
    )
    with contextlib.suppress(Exception):
        await listen.close({})
        await dashboards.close({})
        await follow.stop({})


if __name__ == "__main__":
    raise_fd_limit()
    uvloop.run(main())
