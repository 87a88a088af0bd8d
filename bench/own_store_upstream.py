"""The upstream_tasks scenario's upstream: `examples/own_store` as it runs, whose tasks change
on a known schedule.

`python -m examples.own_store.server` keeps its tasks in memory and answers `tasks/get`;
its tools move a task only a few times (`slow`: three steps, then completed). To measure
staleness the bench needs tasks that keep changing, at times it knows: this process is the
same server object (`OwnStoreServer`, served by uvicorn with the example's own settings)
plus one bench-only path, `POST /pace?interval_ms=N`. From then on every live task changes
every N ms, the T tasks spread evenly over the interval, each change a `working` state whose
`statusMessage` is `t=<time.time_ns() at the change>` (bench/protocol.py's stamp; its
`lastUpdatedAt` is the same instant to the millisecond). A client's staleness is its receive
time less that stamp, on the same machine clock. Pacing goes through `set_status`, which
stops the tool's own timers, so nothing else moves a paced task. A timer per task: pacing
costs the process a few microseconds per change, nothing between changes.

Run: python -m bench.own_store_upstream --port N [--poll-interval-ms 500] [--ttl-ms T]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence

import msgspec
import uvicorn
from starlette.types import Receive, Scope, Send

from bench.protocol import stamp
from examples.own_store.server import DEFAULT_POLL_INTERVAL_MS, SHUTDOWN_GRACE_S, OwnStoreServer
from examples.own_store.tasks import TerminalTask

PACE_PATH = "/pace"


class PacedStore:
    """ASGI: `POST /pace?interval_ms=N` starts pacing every live task; the rest is the
    own_store server's."""

    def __init__(self, server: OwnStoreServer) -> None:
        self.server = server
        self.timers: dict[str, asyncio.TimerHandle] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PACE_PATH and scope["method"] == "POST":
            query = dict(
                part.split("=", 1) for part in scope["query_string"].decode().split("&") if part
            )
            paced = self.pace(int(query.get("interval_ms", "1000")))
            body = msgspec.json.encode({"tasks": paced})
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.server(scope, receive, send)

    def pace(self, interval_ms: int) -> int:
        """Every live task changes every `interval_ms`, the first changes spread evenly
        over one interval; how many tasks are paced."""
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        loop = asyncio.get_running_loop()
        interval = interval_ms / 1000
        task_ids = list(self.server.store.entries)
        now = loop.time()
        for i, task_id in enumerate(task_ids):
            due = now + interval * (i + 1) / len(task_ids)
            self.timers[task_id] = loop.call_at(due, self._change, task_id, due, interval)
        return len(task_ids)

    def _change(self, task_id: str, due: float, interval: float) -> None:
        try:
            self.server.set_status(task_id, "working", message=stamp())
        except (KeyError, TerminalTask):  # expired or ended: no longer paced
            self.timers.pop(task_id, None)
            return
        loop = asyncio.get_running_loop()
        due = max(due + interval, loop.time())  # a late loop skips, never bunches up
        self.timers[task_id] = loop.call_at(due, self._change, task_id, due, interval)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.own_store_upstream", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--poll-interval-ms", type=int, default=DEFAULT_POLL_INTERVAL_MS)
    parser.add_argument("--ttl-ms", type=int, default=3_600_000)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    server = OwnStoreServer(ttl_ms=args.ttl_ms, poll_interval_ms=args.poll_interval_ms)
    # The example's own settings (examples/own_store/server.py main), so the process
    # measured is the server as it runs.
    config = uvicorn.Config(
        PacedStore(server),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
