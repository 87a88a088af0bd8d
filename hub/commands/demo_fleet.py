"""The simulated fleet of `taskhub demo`: three servers and a client, in one process.

The servers write tasks through the bridge, as real ones do, and take answers and cancels
from their control consumers; the client answers and cancels through the hub's `POST /mcp`,
as real ones do. So the demo shows the whole path, not a picture of it. Every kind of task
a dashboard must show appears: progress, input answered, failure, cancellation, expiry, a
stuck task now and then, and one server that goes silent for a while and then recovers.
Short TTLs keep the view bounded: tasks leave it as fast as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import nats
from nats.aio.client import Client

from bridge import TaskBridge
from bridge.states import IllegalTransition
from bridge.task_store import TaskExpired, TaskNotFound
from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
)
from bridge.wire import TaskRecord

log = logging.getLogger("taskhub.demo")

SERVERS = ("atlas-1", "borealis-1", "cirrus-1")
SILENT_SERVER = "cirrus-1"
OWNER = "anonymous"  # an open hub's only principal: the client can see and steer the tasks
TOPICS = ("billing", "search", "reports", "ingest", "payments", "thumbnails", "backups")
CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "title": "Go ahead?"}},
    "required": ["confirm"],
}


@dataclass(frozen=True)
class Pace:
    """How fast the fleet runs; tests shrink it. Terminal tasks outlive their run by ttl_ms."""

    new_task_s: float = 0.6  # ~1.7 new tasks per second
    step_s: float = 1.0
    ttl_ms: int = 90_000  # > 60 s past a run, so running tasks are not flagged expiring
    expiring_ttl_ms: int = 40_000
    stuck_ttl_ms: int = 120_000  # stuck after 30 s, expired after 2 min
    poll_interval_ms: int = 1_000
    max_live: int = 300  # scripts running at once; beyond it, no new task starts
    silent_first_s: float = 40.0
    silent_every_s: float = 120.0
    # Past 10 s waiting control messages mark it silent (to operators), past 30 s its
    # frozen tasks are stuck (to everyone: an open hub shows no one the server list).
    silent_for_s: float = 40.0


# Relative weights of the task kinds (`Fleet.<kind>`).
KINDS = {
    "progress": 30,
    "quick": 20,
    "input": 15,
    "failure": 10,
    "cancel": 10,
    "expiry": 8,
    "stuck": 3,
}


class SimServer:
    """One server id: a bridge on the shared connection, paused while silent.

    Silence is real: the bridge is closed, so its control consumer stops, and no script
    writes until `start` attaches a new bridge with the same id (the durable consumer
    then delivers what waited).
    """

    def __init__(self, nc: Client, server_id: str, bucket: str) -> None:
        self.nc, self.id, self.bucket = nc, server_id, bucket
        self.bridge: TaskBridge | None = None
        self.awake = asyncio.Event()
        self.answers: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.cancelled: dict[str, asyncio.Event] = {}
        self.idle: set[str] = set()  # tasks left working without updates (stuck, expiring)

    async def start(self) -> None:
        self.bridge = await TaskBridge.attach(self.nc, self.id, bucket=self.bucket)
        self.bridge.on_input(self._on_input)
        self.bridge.on_cancel(self._on_cancel)
        self.awake.set()

    async def go_silent(self) -> None:
        self.awake.clear()
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            await bridge.close()  # the control consumer stops; the connection stays

    async def write(self, change: Callable[[TaskBridge], Awaitable[TaskRecord]]) -> TaskRecord:
        """Any write waits while the server is silent."""
        while True:
            await self.awake.wait()
            if self.bridge is not None:
                return await change(self.bridge)

    async def working(self, task_id: str, message: str) -> TaskRecord:
        return await self.write(lambda b: b.working(task_id, status_message=message))

    async def _on_input(self, task_id: str, responses: dict[str, Any]) -> None:
        waiting = self.answers.get(task_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(responses)

    async def _on_cancel(self, task_id: str) -> None:
        # Called by this bridge's own consumer, so the bridge is there; waiting for
        # `awake` here would hold up `go_silent`, which waits for the handler.
        if self.bridge is not None:
            with contextlib.suppress(IllegalTransition, LookupError):
                await self.bridge.cancelled(task_id, status_message="cancelled by the user")
        waiting = self.cancelled.get(task_id)
        if waiting is not None:
            waiting.set()


class HubClient:
    """The simulated user: `tasks/update` and `tasks/cancel` at the hub's `/mcp`."""

    def __init__(self, http: httpx2.AsyncClient, mcp_url: str) -> None:
        self.http, self.url = http, mcp_url
        self._ids = itertools.count(1)

    async def call(self, method: str, params: dict[str, Any]) -> None:
        meta = {
            PROTOCOL_VERSION_KEY: PROTOCOL_VERSION,
            CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}},
            CLIENT_INFO_KEY: {"name": "taskhub-demo", "version": "0"},
        }
        body = {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": method,
            "params": {**params, "_meta": meta},
        }
        headers = {
            "MCP-Protocol-Version": PROTOCOL_VERSION,
            "Mcp-Method": method,
            "Mcp-Name": params["taskId"],  # H13: the task id, on every tasks/* request
            "Accept": "application/json, text/event-stream",
        }
        response = await self.http.post(self.url, json=body, headers=headers)
        if response.status_code != 200 or '"error"' in response.text:
            log.info("demo client: %s answered %s %s", method, response.status_code, response.text)

    async def answer(self, task_id: str, key: str, confirm: bool) -> None:
        answer = {"action": "accept", "content": {"confirm": confirm}}
        await self.call("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})

    async def cancel(self, task_id: str) -> None:
        await self.call("tasks/cancel", {"taskId": task_id})


class Fleet:
    """The servers' scripts and the client's answers; `run()` until cancelled."""

    client: HubClient  # set by run(), with the HTTP client it owns

    def __init__(self, nats_url: str, hub_url: str, bucket: str, pace: Pace | None = None) -> None:
        self.nats_url, self.hub_url, self.bucket = nats_url, hub_url.rstrip("/"), bucket
        self.pace = pace or Pace()
        self.random = random.Random()
        self.scripts: set[asyncio.Task[None]] = set()
        self.servers: list[SimServer] = []

    async def run(self) -> None:
        async with self.connected():
            silence = asyncio.create_task(self._silences())
            try:
                await self._create_forever()
            finally:
                silence.cancel()
                await self._stop_scripts()
                await asyncio.gather(silence, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[None]:
        """The servers on one NATS connection and the client's HTTP client, then closed."""
        nc = await nats.connect(self.nats_url, name="taskhub-demo-fleet")
        try:
            async with httpx2.AsyncClient(timeout=10.0) as http:
                self.client = HubClient(http, self.hub_url + "/mcp")
                self.servers = [SimServer(nc, sid, self.bucket) for sid in SERVERS]
                try:
                    for server in self.servers:
                        await server.start()
                    yield
                finally:
                    for server in self.servers:
                        await server.go_silent()
        finally:
            await nc.close()

    async def _create_forever(self) -> None:
        kinds, weights = list(KINDS), list(KINDS.values())
        while True:
            if len(self.scripts) < self.pace.max_live:
                server = self.random.choice(self.servers)
                kind = self.random.choices(kinds, weights)[0]
                if server.awake.is_set():
                    self._spawn(server, kind)
            await asyncio.sleep(self.pace.new_task_s)

    def _spawn(self, server: SimServer, kind: str) -> None:
        script: Callable[[SimServer], Awaitable[None]] = getattr(self, kind)
        task = asyncio.create_task(self._guarded(server, kind, script))
        self.scripts.add(task)
        task.add_done_callback(self.scripts.discard)

    async def _guarded(
        self, server: SimServer, kind: str, script: Callable[[SimServer], Awaitable[None]]
    ) -> None:
        try:
            await script(server)
        except (IllegalTransition, TaskExpired, TaskNotFound, TimeoutError):
            pass  # cancelled, expired or gone meanwhile: the script simply ends
        except (httpx2.HTTPError, nats.errors.Error, OSError) as exc:
            log.info("demo %s task on %s: %s", kind, server.id, exc)  # NATS or the hub away
        except Exception:  # one task's bad luck must not stop the fleet
            log.warning("demo %s task on %s failed", kind, server.id, exc_info=True)

    async def _stop_scripts(self) -> None:
        for task in list(self.scripts):
            task.cancel()
        await asyncio.gather(*self.scripts, return_exceptions=True)

    async def _silences(self) -> None:
        server = next(s for s in self.servers if s.id == SILENT_SERVER)
        await asyncio.sleep(self.pace.silent_first_s)
        while True:
            log.info("demo: %s goes silent for %.0f s", server.id, self.pace.silent_for_s)
            await server.go_silent()
            # A user gives up on one of its tasks: the cancel waits, unconsumed.
            await asyncio.sleep(min(2.0, self.pace.silent_for_s / 4))
            for task_id in sorted(server.idle)[:1]:
                with contextlib.suppress(httpx2.HTTPError):
                    await self.client.cancel(task_id)
            await asyncio.sleep(self.pace.silent_for_s)
            await server.start()
            log.info("demo: %s recovered", server.id)
            await asyncio.sleep(self.pace.silent_every_s)

    # -- the scripts: one task each, server side and client side ------------------------

    async def _create(self, server: SimServer, message: str, ttl_ms: int | None = None) -> str:
        ttl = self.pace.ttl_ms if ttl_ms is None else ttl_ms
        record = await server.write(
            lambda b: b.create(
                owner=OWNER,
                ttl_ms=ttl,
                poll_interval_ms=self.pace.poll_interval_ms,
                status_message=message,
            )
        )
        return record.task_id

    async def _steps(self, server: SimServer, task_id: str, topic: str, steps: int) -> None:
        percent = self.random.random() < 0.5
        for step in range(1, steps + 1):
            message = (
                f"{topic}: {round(100 * step / steps)}%"
                if percent
                else f"{topic}: step {step} of {steps}"
            )
            await server.working(task_id, message)
            await asyncio.sleep(self.pace.step_s * self.random.uniform(0.6, 1.4))

    async def _complete(self, server: SimServer, task_id: str, text: str) -> None:
        result = {"content": [{"type": "text", "text": text}]}
        await server.write(lambda b: b.complete(task_id, result, status_message=text))

    def _topic(self) -> str:
        return self.random.choice(TOPICS)

    async def progress(self, server: SimServer) -> None:
        topic, steps = self._topic(), self.random.randint(4, 8)
        task_id = await self._create(server, f"{topic}: starting")
        await self._steps(server, task_id, topic, steps)
        await self._complete(server, task_id, f"{topic}: {steps} steps done")

    async def quick(self, server: SimServer) -> None:
        topic = self._topic()
        task_id = await self._create(server, f"{topic}: looking up")
        await asyncio.sleep(self.pace.step_s * self.random.uniform(0.5, 2))
        await self._complete(server, task_id, f"{topic}: found")

    async def input(self, server: SimServer) -> None:
        topic = self._topic()
        task_id = await self._create(server, f"deploy {topic}: building")
        await self._steps(server, task_id, f"deploy {topic}", 2)
        answered = asyncio.get_running_loop().create_future()
        server.answers[task_id] = answered
        try:
            question = {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": f"Deploy {topic} to production?",
                    "requestedSchema": CONFIRM_SCHEMA,
                },
            }
            waiting = f"deploy {topic}: waiting for confirmation"
            await server.write(
                lambda b: b.require_input(task_id, {"confirm": question}, status_message=waiting)
            )
            await asyncio.sleep(self.pace.step_s * self.random.uniform(2, 4))  # a user reads
            confirm = self.random.random() < 0.8
            await self.client.answer(task_id, "confirm", confirm)
            # Through the hub, NATS and this server's consumer; bounded by the task's life.
            async with asyncio.timeout(self.pace.ttl_ms / 1000):
                responses = await answered
        finally:
            server.answers.pop(task_id, None)
        if responses["confirm"].get("content", {}).get("confirm") is not True:
            await self._complete(server, task_id, f"deploy {topic}: declined by the user")
            return
        await self._steps(server, task_id, f"deploy {topic}: rolling out", 3)
        await self._complete(server, task_id, f"deploy {topic}: live")

    async def failure(self, server: SimServer) -> None:
        topic = self._topic()
        task_id = await self._create(server, f"{topic}: fetching")
        await self._steps(server, task_id, f"{topic}: fetching", self.random.randint(1, 3))
        error = {"code": -32603, "message": f"{topic}: upstream timed out"}
        await server.write(lambda b: b.fail(task_id, error))

    async def cancel(self, server: SimServer) -> None:
        topic = self._topic()
        task_id = await self._create(server, f"{topic}: exporting")
        done = server.cancelled.setdefault(task_id, asyncio.Event())
        try:
            steps = asyncio.create_task(self._steps(server, task_id, f"{topic} export", 20))
            try:
                await asyncio.sleep(self.pace.step_s * self.random.uniform(2, 4))
                await self.client.cancel(task_id)  # the server's cancel handler writes it
                async with asyncio.timeout(self.pace.ttl_ms / 1000):
                    await done.wait()
            finally:
                steps.cancel()
                await asyncio.gather(steps, return_exceptions=True)
        finally:
            server.cancelled.pop(task_id, None)

    async def expiry(self, server: SimServer) -> None:
        topic = self._topic()
        task_id = await self._create(server, f"{topic}: queued", self.pace.expiring_ttl_ms)
        await asyncio.sleep(self.pace.step_s)
        await server.working(task_id, f"{topic}: waiting for a slot")
        await self._idle(server, task_id, self.pace.expiring_ttl_ms)  # left working: expires

    async def stuck(self, server: SimServer) -> None:
        message = f"{self._topic()}: waiting on a lock"
        task_id = await self._create(server, message, self.pace.stuck_ttl_ms)
        await self._idle(server, task_id, self.pace.stuck_ttl_ms)  # never updated again

    async def _idle(self, server: SimServer, task_id: str, ttl_ms: int) -> None:
        server.idle.add(task_id)
        try:
            await asyncio.sleep(ttl_ms / 1000)
        finally:
            server.idle.discard(task_id)
