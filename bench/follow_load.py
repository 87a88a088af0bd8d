"""The upstream_tasks scenario's clients (bench/loadgen.py runs them): pollers and listeners
following tasks at once, on raw sockets, and how stale each new state is when it arrives.

- A poller sends `tasks/get` of its task every `interval_ms` on its own keep-alive
  connection (first poll at a random phase, so clients are not in step).
- A listener holds one `subscriptions/listen` stream of its task (SSE, read byte-wise).

Client i of each kind follows task i mod T. Every state the upstream writes carries its
change time (`statusMessage: "t=<time_ns>"`, bench/own_store_upstream.py); a client records
receive time − that stamp the first time it sees a newer state than it had. The state it
holds when it starts is not a change seen late and is not counted.

Commands: `follow_start` (open the listeners, wait for each one's ack and first state, start
the pollers), `follow_measure` (counts, errors and staleness over `seconds`), `follow_stop`.
An error is a `tasks/get` answer that is not HTTP 200 or carries a JSON-RPC error (a 429 of
the hub's pacing included), a poll whose connection failed, a listen frame carrying an
error, or a stream that ended while measured; the first one's text is kept for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import cast

from bench import protocol
from bench.control import Params
from bench.processes import self_cpu_seconds
from bench.sockets import connect
from bench.stats import latency_summary

RECONNECT_S = 0.2  # a poller whose connection failed tries again after this


class Counts:
    """What the clients of one kind saw in the current window."""

    def __init__(self) -> None:
        self.reset(False)

    def reset(self, recording: bool) -> None:
        self.recording = recording
        self.messages = 0  # polls answered, or task frames received
        self.errors = 0
        self.staleness: list[int] = []

    def error(self, load: FollowLoad, text: str) -> None:
        if self.recording:
            self.errors += 1
            load.first_error = load.first_error or text

    def seen(self, stamp: int, last: int | None) -> int | None:
        """A state stamped `stamp` arrived; the newest stamp the client now holds."""
        if last is not None and stamp <= last:
            return last  # the same state again, or an older one: not a change
        if last is not None and self.recording:
            self.staleness.append(time.time_ns() - stamp)
        return stamp


class PollConnection(asyncio.Protocol):
    """One keep-alive connection used request by request."""

    def __init__(self) -> None:
        self.reader = protocol.ResponseReader()
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    async def request(self, data: bytes) -> tuple[int, bytes]:
        if self.transport is None:
            raise ConnectionError("connection closed")
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.answer

    def data_received(self, data: bytes) -> None:
        answers = self.reader.feed(data)
        if answers and self.answer is not None and not self.answer.done():
            self.answer.set_result(answers[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("connection closed"))


class Listener(asyncio.Protocol):
    """One listen stream: ready at its ack and first task frame; then each newer state."""

    def __init__(self, load: FollowLoad, request: bytes) -> None:
        self.load = load
        self.request = request
        self.scanner = protocol.SseScanner()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acked = False
        self.last: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        events = self.scanner.feed(data)
        if not events:
            if self.scanner.streaming and self.scanner.status != 200:
                self._lost(f"listen: HTTP {self.scanner.status}")
            return
        counts = self.load.listen
        framed = False
        for event in events.split(b"\n\n"):
            if protocol.ACK_MARK in event:
                self.acked = True
            elif b'"error"' in event:
                counts.error(self.load, "listen frame: " + event[-300:].decode(errors="replace"))
            elif b"notifications/tasks" in event:
                framed = True
                counts.messages += counts.recording
                for found in protocol.frame_stamps(event):
                    self.last = counts.seen(int(found), self.last)
        if framed and self.acked and not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.transport = None
            self._lost("listen stream ended")

    def _lost(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))
        elif not self.load.stopping:
            self.load.listen.error(self.load, why)
            self.load.lost += self.load.listen.recording


class FollowLoad:
    def __init__(self) -> None:
        self.poll = Counts()
        self.listen = Counts()
        self.listeners: list[Listener] = []
        self.pollers: list[asyncio.Task[None]] = []
        self.connections: list[PollConnection] = []
        self.first_error = ""
        self.lost = 0  # streams that ended while measured
        self.stopping = False

    async def start(self, p: Params) -> Params:
        port: int = p["port"]
        path: str = p.get("path", "/mcp")
        task_ids: list[str] = p["task_ids"]
        interval = p["interval_ms"] / 1000
        self.stopping = False
        self.first_error = ""
        window = asyncio.Semaphore(p.get("window", 200))
        cpu = self_cpu_seconds()
        started = time.perf_counter()

        async def open_one(i: int) -> None:
            task_id = task_ids[i % len(task_ids)]
            request = protocol.post(
                port,
                "subscriptions/listen",
                protocol.rpc_body(
                    "subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, f"l{i}"
                ),
                path=path,
            )
            async with window:
                _, listener = await connect(port, lambda: Listener(self, request))
                self.listeners.append(listener)
                await listener.ready

        async with asyncio.timeout(p.get("timeout", 120.0)):
            results = await asyncio.gather(
                *(open_one(i) for i in range(p["listeners"])), return_exceptions=True
            )
        failures = [r for r in results if isinstance(r, BaseException)]
        for i in range(p["pollers"]):
            get = protocol.post(
                port,
                "tasks/get",
                protocol.rpc_body("tasks/get", {"taskId": task_ids[i % len(task_ids)]}, i + 1),
                task_ids[i % len(task_ids)],
                path,
            )
            self.pollers.append(asyncio.create_task(self._poller(port, get, interval)))
        return {
            "opened": len(results) - len(failures),
            "failed": len(failures),
            "first_error": repr(failures[0]) if failures else "",
            "seconds": time.perf_counter() - started,
            "client_cpu_s": self_cpu_seconds() - cpu,
        }

    async def _poller(self, port: int, request: bytes, interval: float) -> None:
        counts = self.poll
        last: int | None = None
        conn: PollConnection | None = None
        due = time.perf_counter() + random.uniform(0, interval)
        while True:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            due += interval
            try:
                if conn is None or conn.transport is None:
                    _, conn = await connect(port, PollConnection)
                    self.connections.append(conn)
                status, body = await conn.request(request)
            except OSError as exc:
                counts.error(self, f"tasks/get: {type(exc).__name__}: {exc}")
                conn = None
                due = max(due, time.perf_counter() + RECONNECT_S)
                continue
            counts.messages += counts.recording
            if status != 200 or b'"error"' in body:
                counts.error(self, f"tasks/get: {status} {body[:300].decode(errors='replace')}")
                continue
            found = protocol.body_stamp(body)
            if found is not None:
                last = counts.seen(found, last)

    async def measure(self, p: Params) -> Params:
        seconds: float = p["seconds"]
        self.poll.reset(True)
        self.listen.reset(True)
        self.lost = 0
        self.first_error = ""
        cpu = self_cpu_seconds()
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - started
        client_cpu = self_cpu_seconds() - cpu
        self.poll.recording = self.listen.recording = False
        both = self.poll.staleness + self.listen.staleness
        return {
            "seconds": elapsed,
            "client_cpu_s": client_cpu,
            "polls": self.poll.messages,
            "poll_errors": self.poll.errors,
            "frames": self.listen.messages,
            "listen_errors": self.listen.errors,
            "streams_lost": self.lost,
            "open": sum(1 for s in self.listeners if s.transport is not None),
            "first_error": self.first_error,
            **latency_summary(both, "staleness_"),
            **latency_summary(self.poll.staleness, "poll_staleness_"),
            **latency_summary(self.listen.staleness, "listen_staleness_"),
        }

    async def stop(self, p: Params) -> Params:
        self.stopping = True
        pollers, self.pollers = self.pollers, []
        for poller in pollers:
            poller.cancel()
        for poller in pollers:
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        for conn in self.connections:
            if conn.transport is not None:
                conn.transport.abort()
        listeners, self.listeners = self.listeners, []
        for listener in listeners:
            if listener.transport is not None:
                listener.transport.abort()
        self.connections = []
        await asyncio.sleep(0.05)  # let the resets go out before the next command
        return {"stopped": len(pollers) + len(listeners)}
