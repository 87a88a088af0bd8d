"""The listening side: re-listening SSE followers, spread over both hubs.

A follower takes a few freshly acknowledged tasks from the writers' queue, listens for
them (through the hub's client proxy), and follows them to their terminal states. When a
stream breaks (EOF, HTTP error, completion result, a reset) or goes silent past
`SILENCE_S` it listens again, at the other hub if that is up, for the tasks not yet
terminal; now and then it ends a stream voluntarily and re-listens (churn). Every
session, frame and line-arrival time is recorded in the history; the checks are made
afterwards by `tests.chaos.invariants`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tests.chaos.env import SILENCE_S, Env
from tests.chaos.history import Frame, Session
from tests.chaos.workload import ENDINGS, Writers
from tests.helpers import SUB_KEY, headers_for, rpc

ACK = "notifications/subscriptions/acknowledged"


class Broken(Exception):
    pass


async def events(lines: AsyncIterator[str], on_line: Any) -> AsyncIterator[dict[str, Any]]:
    """JSON-RPC messages of an SSE body; every line (keep-alive comments too) is noted."""
    data: list[str] = []
    while True:
        try:
            line = await asyncio.wait_for(lines.__anext__(), SILENCE_S)
        except StopAsyncIteration:
            raise Broken("eof") from None
        except TimeoutError:
            raise Broken("silent") from None
        on_line()
        if line == "":
            if data:
                yield json.loads("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


class Follower:
    def __init__(self, index: int, env: Env, writers: Writers, seed: int) -> None:
        self.index = index
        self.env = env
        self.writers = writers
        self.rng = random.Random(seed * 7919 + index)
        self.hub = index % 2
        self.pending: set[str] = set()
        self.attempt = 0
        self.session: Session | None = None

    async def run(self, stop: asyncio.Event) -> None:
        history = self.env.history
        while True:
            if not self.pending:
                batch = self._take(self.rng.randint(3, 5))
                if not batch:
                    if self.writers.done.is_set() and self.writers.created.empty():
                        return
                    await asyncio.sleep(0.2)
                    continue
                self.pending = set(batch)
                history.followed[self.index] |= self.pending
            await self._listen_once(stop)

    def _take(self, count: int) -> list[str]:
        seen = self.env.history.followed[self.index]
        batch: list[str] = []
        while len(batch) < count and not self.writers.created.empty():
            task_id = self.writers.created.get_nowait()
            if task_id not in seen and task_id not in batch:
                batch.append(task_id)
        return batch

    def _next_hub(self, moved: bool) -> int:
        live = [i for i in range(len(self.env.hubs)) if self.env.alive[i]]
        others = [i for i in live if i != self.hub]
        if moved and others:
            return others[0]
        return self.rng.choice(live) if live else self.hub

    async def _listen_once(self, stop: asyncio.Event) -> None:
        env, history = self.env, self.env.history
        self.attempt += 1
        request_id = f"f{self.index}.{self.attempt}"
        requested = sorted(self.pending)
        hub = self.hub
        ready = await env.hub_ready(hub)
        session = Session(self.index, request_id, hub, ready, time.monotonic(), requested)
        history.sessions.append(session)
        churn_after = self.rng.uniform(1.0, 6.0) if self.rng.random() < 0.15 else None
        body = rpc("subscriptions/listen", {"notifications": {"taskIds": requested}}, id=request_id)
        moved = False
        try:
            async with env.http.stream(
                "POST", env.listen_url(hub), json=body, headers=headers_for(body)
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise Broken(f"http {response.status_code}: {response.text[:160]}")
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    await response.aread()
                    raise Broken(f"not a stream: {response.text[:160]}")
                if churn_after is not None:
                    async with asyncio.timeout(churn_after):
                        await self._follow(response, session)
                else:
                    await self._follow(response, session)
            session.end = "done"
        except TimeoutError:
            session.end = "churn"
        except Broken as exc:
            session.end = str(exc)
            moved = True
        except (httpx.TransportError, httpx.StreamError) as exc:
            session.end = type(exc).__name__
            moved = True
        except json.JSONDecodeError:
            session.end = "bad json"
            moved = True
        session.ended = time.monotonic()
        self.hub = self._next_hub(moved)
        if moved:
            await asyncio.sleep(min(0.05 * self.attempt, 0.5) * self.rng.uniform(0.5, 1.5))

    async def _follow(self, response: httpx.Response, session: Session) -> None:
        history = self.env.history
        activity = history.activity[self.index]

        def on_line() -> None:
            activity.append(time.monotonic())

        stream = events(response.aiter_lines(), on_line)
        ack = await stream.__anext__()
        if ack.get("method") != ACK:
            raise Broken(f"first message is not the ack: {str(ack)[:120]}")
        granted = list(ack["params"]["notifications"]["taskIds"])
        session.granted = granted
        if set(granted) != set(session.requested):
            raise Broken("not every task granted")
        async for message in stream:
            if "method" not in message:
                if message.get("id") == session.request_id and "result" in message:
                    raise Broken("completion result")
                continue
            if message["method"] != "notifications/tasks":
                continue
            params = dict(message["params"])
            meta = params.pop("_meta", None)
            task_id = str(params.get("taskId"))
            frame = Frame(
                time.monotonic(),
                task_id,
                str(params.get("status")),
                params.get("statusMessage"),
                params,
                meta == {SUB_KEY: session.request_id},
            )
            session.frames.append(frame)
            if frame.status in ENDINGS and task_id in self.pending:
                history.terminal_seen[self.index][task_id] = params
                self.pending.discard(task_id)
                if not self.pending:
                    return
