"""The session's GET stream: `notifications/tasks/status` under 2025-11-25.

It carries the status of every task of the session's principal created since the
session began (through this session or another of the same principal: one auth context),
each change coalesced per task for a slow reader, as the legacy flat `Task`. Each event's
id is the task revision's stream sequence, which every replica shares: a client that
comes back with `Last-Event-ID: N`, to this hub or another, first gets the current state
of each such task changed after N, then every change. The stream ends when the hub shuts
down or the client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import Any

import msgspec
from starlette.types import Receive, Send

from hub.legacy.results import SHUTDOWN_CHECK_S, disconnected, start_event_stream
from hub.legacy.sessions import Session
from hub.legacy.vocabulary import legacy_task
from hub.rpc import jsonrpc
from hub.runtime import Hub
from hub.store.snapshot import TaskSnapshot

CLOCK_SLACK_S = 60.0  # a server's clock may trail the hub's: its createdAt may too


def _created(task: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(task["createdAt"])).timestamp()
    except (KeyError, ValueError):
        return 0.0


async def status_stream(
    hub: Hub,
    session: Session,
    last_event_id: int | None,
    receive: Receive,
    send: Send,
    headers: list[Any],
) -> None:
    pending: dict[str, TaskSnapshot] = {}
    wake = asyncio.Event()

    def offer(snapshot: TaskSnapshot) -> None:
        held = pending.get(snapshot.task_id)
        if held is None or held.revision < snapshot.revision:
            pending[snapshot.task_id] = snapshot
            wake.set()

    unfollow = hub.follow_owner(session.principal, offer)
    gone = asyncio.ensure_future(disconnected(receive))
    since = session.created - CLOCK_SLACK_S
    try:
        await start_event_stream(send, headers)
        if last_event_id is not None:  # resumption: what changed since, as it is now
            for snapshot in hub.cache.owned_by(session.principal):
                if snapshot.revision > last_event_id:
                    offer(snapshot)
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        while not gone.done() and not hub.closing:
            waiting = asyncio.ensure_future(wake.wait())
            await asyncio.wait(
                (waiting, gone), timeout=SHUTDOWN_CHECK_S, return_when=asyncio.FIRST_COMPLETED
            )
            waiting.cancel()
            wake.clear()
            batch = sorted(pending.values(), key=lambda s: s.revision)
            pending.clear()
            chunk = b"".join(_event(snapshot, since) for snapshot in batch)
            if not chunk and loop.time() - last_write >= hub.config.keepalive:
                chunk = b": keep-alive\n\n"
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                last_write = loop.time()
    except OSError:
        return  # the client went while we wrote
    finally:
        unfollow()
        gone.cancel()
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b""})


def _event(snapshot: TaskSnapshot, since: float) -> bytes:
    task = msgspec.json.decode(snapshot.body)
    if _created(task) < since:
        return b""  # older than the session: not one of its tasks
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/tasks/status",
        "params": legacy_task(task),
    }
    data = jsonrpc.line_safe(msgspec.json.encode(message))
    return b"id: %d\nevent: message\ndata: " % snapshot.revision + data + b"\n\n"
