"""The writing side: tasks over two bridges, paced over the run, and the tasks/get poller.

Task n (0-based) is written by bridge n % 2: create ("created") → 1..3 `working` updates
("progress k") → completed / failed / cancelled (by n % 3) with statusMessage "final n".
Each write is recorded as attempted before it is sent and as acknowledged with the stored
task once the bridge returns. Writes are retried through outages (`retried`); a create
that raises `CreateOutcomeUnknown` is noted and that task is left alone (it is resolved
with `bridge.get` after the run).
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from bridge import CreateOutcomeUnknown, TaskNotFound, TaskRecord
from bridge.states import IllegalTransition, InvalidPayload, TerminalStateError
from tests.chaos.env import Env
from tests.chaos.history import GetAnswer
from tests.helpers import headers_for, rpc

ENDINGS = ("completed", "failed", "cancelled")
RETRY_DEADLINE_S = 90.0
T = TypeVar("T")

NO_ANSWER = -2  # GetAnswer.code when the hub gave no answer (down, stalled, reset)


def task_dict(record: TaskRecord) -> dict[str, Any]:
    task: dict[str, Any] = msgspec.to_builtins(record.task)
    return task


def rank(status: str, message: str | None) -> int:
    """created 0, progress k → k, terminal 100: a stream never goes down this scale."""
    if status in ENDINGS:
        return 100
    if message and message.startswith("progress "):
        return int(message.split()[1])
    return 0


async def retried(env: Env, call: Callable[[], Awaitable[T]]) -> T:
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            return await call()
        except (IllegalTransition, InvalidPayload, TaskNotFound, CreateOutcomeUnknown):
            raise  # a state-machine answer, or a create to resolve, not an outage
        except Exception as exc:  # timeouts, no responders, reconnects, 503s
            env.history.write_retries[type(exc).__name__] += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


class Writers:
    def __init__(
        self, env: Env, seed: int, tasks: int, span_s: float, ttl_ms: int | None = None
    ) -> None:
        self.env = env
        self.seed = seed
        self.tasks = tasks
        self.span_s = span_s  # task starts are spread evenly over this
        self.ttl_ms = ttl_ms  # every task's, or None: kept for good
        self.created: asyncio.Queue[str] = asyncio.Queue()  # for followers, twice each
        self.to_poll: asyncio.Queue[str] = asyncio.Queue()
        self.done = asyncio.Event()
        self.failures: list[str] = []

    async def run(self, t0: float) -> None:
        async def one(n: int) -> None:
            start = t0 + n * self.span_s / max(1, self.tasks)
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            try:
                await self.write_task(n)
            except Exception as exc:
                self.failures.append(f"task {n}: {type(exc).__name__}: {exc}")

        try:
            await asyncio.gather(*(one(n) for n in range(self.tasks)))
        finally:
            self.done.set()

    async def write_task(self, n: int) -> None:
        env, history = self.env, self.env.history
        bridge = env.bridges[n % 2]
        rng = random.Random(self.seed * 1_000_003 + n)
        try:
            # The id is not known before the call, so "created" is added as attempted
            # for the returned id; create writes nothing else.
            record = await retried(
                env,
                lambda: bridge.create(
                    owner="anonymous", ttl_ms=self.ttl_ms, status_message="created"
                ),
            )
        except CreateOutcomeUnknown as exc:
            history.unknown_creates[exc.task_id] = time.monotonic()
            history.attempt(exc.task_id, "working", "created")
            history.index_of[exc.task_id] = n
            return
        task_id = record.task_id
        history.attempt(task_id, "working", "created")
        history.ack(task_id, task_dict(record))
        history.created_at[task_id] = time.monotonic()
        history.index_of[task_id] = n
        for _ in range(2):
            self.created.put_nowait(task_id)
        self.to_poll.put_nowait(task_id)
        for k in range(1, 2 + n % 3):
            await asyncio.sleep(rng.uniform(0.2, 0.8))
            message = f"progress {k}"
            history.attempt(task_id, "working", message)
            working = functools.partial(bridge.working, task_id, status_message=message)
            record = await retried(env, working)
            history.ack(task_id, task_dict(record))
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        ending, final = ENDINGS[n % 3], f"final {n}"
        history.attempt(task_id, ending, final)

        async def terminal() -> TaskRecord:
            if ending == "completed":
                result = {"content": [{"type": "text", "text": f"result {n}"}]}
                return await bridge.complete(task_id, result, status_message=final)
            if ending == "failed":
                error = {"code": -32603, "message": f"boom {n}"}
                return await bridge.fail(task_id, error, status_message=final)
            return await bridge.cancelled(task_id, status_message=final)

        try:
            record = await retried(env, terminal)
        except TerminalStateError:
            # An earlier attempt landed but its ack was lost: it counts if it is ours.
            stored = await retried(env, lambda: self._stored(n, task_id))
            if (stored.task.status, stored.task.statusMessage) != (ending, final):
                self.failures.append(f"{task_id}: stored {stored.task} instead of {ending}")
            history.write_retries["landed-before-retry"] += 1
            record = stored
        history.ack(task_id, task_dict(record))

    async def _stored(self, n: int, task_id: str) -> TaskRecord:
        record = await self.env.bridges[n % 2].get(task_id)
        if record is None:
            raise TaskNotFound(task_id)
        return record


async def get_task(env: Env, hub: int, task_id: str, final: bool) -> GetAnswer:
    """One tasks/get at `hub`, after a /readyz probe, recorded in the history."""
    ready = await env.hub_ready(hub)
    body = rpc("tasks/get", {"taskId": task_id}, id=task_id)
    answer = GetAnswer(time.monotonic(), hub, task_id, ready, final, code=-1)
    try:
        response = await env.http.post(
            env.hubs[hub].url + "/mcp", json=body, headers=headers_for(body), timeout=5.0
        )
        answer.at = time.monotonic()
        message = response.json()
    except Exception as exc:  # the hub is down or stalled: no answer to record
        answer.code = NO_ANSWER
        answer.message = type(exc).__name__
        env.history.gets.append(answer)
        return answer
    if "error" in message:
        answer.code = int(message["error"].get("code", -1))
        answer.message = str(message["error"].get("message"))
    else:
        result = dict(message["result"])
        result.pop("resultType", None)
        result.pop("_meta", None)
        answer.code = None
        answer.status, answer.message, answer.task = (
            result.get("status"),
            result.get("statusMessage"),
            result,
        )
    env.history.gets.append(answer)
    return answer


async def poll(env: Env, writers: Writers, stop: asyncio.Event) -> None:
    """tasks/get of each freshly acknowledged create on every ready hub, 0–1 s later."""
    limit = asyncio.Semaphore(16)
    pending: set[asyncio.Task[None]] = set()
    rng = random.Random(writers.seed + 17)

    async def check(task_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        async with limit:
            await asyncio.gather(*(get_task(env, hub, task_id, False) for hub in range(2)))

    while not (stop.is_set() and writers.to_poll.empty()):
        try:
            task_id = await asyncio.wait_for(writers.to_poll.get(), 0.2)
        except TimeoutError:
            continue
        task = asyncio.create_task(check(task_id, rng.uniform(0.0, 1.0)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending, return_exceptions=True)


async def sample_ready(env: Env, stop: asyncio.Event) -> None:
    """/readyz of both hubs every 0.1 s: None for a hub that is down on purpose."""
    while not stop.is_set():
        states = await asyncio.gather(*(env.hub_ready(i) for i in range(2)))
        env.history.ready_rounds.append(
            (time.monotonic(), [ok if env.alive[i] else None for i, ok in enumerate(states)])
        )
        await asyncio.sleep(0.1)
