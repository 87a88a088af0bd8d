"""The peers' publisher: HTTP POSTs to a peer's publish endpoint, paced like the writer.

Run by the orchestrator as `python -m bench.peers.publisher --kind nchan|pushpin`
and driven by JSON-line commands (bench/control.py), with the writer's command names, so
a scenario paces a peer exactly as it paces the hub: updates/s round-robin over the
topics, at most one publish per topic in flight (a due one that cannot go is skipped and
counted), each stamped just before it is sent. One keep-alive connection per topic.

- nchan: `POST /pub?id=<topic>` with the notification as the body.
- pushpin: `POST /publish/` with `{"items":[{"channel":..,"formats":{"http-stream":
  {"content":"data: ...\\n\\n"}}}]}` (Pushpin's HTTP publish API).

Commands: `pace_start` / `pace_stop` (as bench/writer.py, plus the peer's publish
`port`), and `publish_once`: one publish per topic, awaited, so a subscriber that asks
for the newest message on connect gets one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

import msgspec
import uvloop

from bench.control import Params, serve
from bench.loadgen import RequestConnection
from bench.peers.frames import event, payload
from bench.processes import raise_fd_limit
from bench.protocol import stamp
from bench.sockets import connect

TICK_S = 0.002
_ACCEPTED = (200, 201, 202)


def request(kind: str, port: int, topic: str) -> bytes:
    """One publish of a freshly stamped notification for `topic`."""
    data = payload(topic, stamp())
    if kind == "nchan":
        path = f"/pub?id={topic}"
        body = data
    else:
        path = "/publish/"
        item = {"channel": topic, "formats": {"http-stream": {"content": event(data).decode()}}}
        body = msgspec.json.encode({"items": [item]})
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Publisher:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.port = 0
        self.connections: dict[str, RequestConnection] = {}
        self.pacer: asyncio.Task[None] | None = None
        self.busy: set[str] = set()
        self.counts = {"updates": 0, "skipped": 0, "errors": 0}
        self.started = 0.0
        self.sends: set[asyncio.Task[None]] = set()

    async def _connection(self, topic: str) -> RequestConnection:
        conn = self.connections.get(topic)
        if conn is None or conn.transport is None or conn.transport.is_closing():
            _, conn = await connect(self.port, RequestConnection)
            self.connections[topic] = conn
        return conn

    async def _publish(self, topic: str) -> None:
        try:
            conn = await self._connection(topic)
            status, _, _ = await conn.request(request(self.kind, self.port, topic))
            self.counts["updates" if status in _ACCEPTED else "errors"] += 1
        except (OSError, ConnectionError):
            self.counts["errors"] += 1
            self.connections.pop(topic, None)
        finally:
            self.busy.discard(topic)

    def _target(self, port: int) -> None:
        """Publish to `port` from now on (a peer restarted on a new port)."""
        if port != self.port:
            self.close()
            self.connections.clear()
            self.port = port

    async def publish_once(self, p: Params) -> Params:
        self._target(p["port"])
        topics: list[str] = p["task_ids"]
        self.busy.update(topics)
        await asyncio.gather(*(self._publish(topic) for topic in topics))
        return dict(self.counts)

    async def pace_start(self, p: Params) -> Params:
        await self.pace_stop({})
        self._target(p["port"])
        topics: list[str] = p["task_ids"]
        for topic in topics:  # connect first: the first window should not pay for it
            await self._connection(topic)
        self.counts = {"updates": 0, "skipped": 0, "errors": 0}
        self.started = time.perf_counter()
        self.pacer = asyncio.create_task(self._pace(topics, p["rate"]))
        return {}

    async def _pace(self, topics: list[str], rate: float) -> None:
        issued = 0
        next_topic = 0
        while True:
            await asyncio.sleep(TICK_S)
            due = int(rate * (time.perf_counter() - self.started)) - issued
            for _ in range(max(0, due)):
                issued += 1
                topic = topics[next_topic]
                next_topic = (next_topic + 1) % len(topics)
                if topic in self.busy:
                    self.counts["skipped"] += 1
                    continue
                self.busy.add(topic)
                send = asyncio.create_task(self._publish(topic))
                self.sends.add(send)
                send.add_done_callback(self.sends.discard)

    async def pace_stop(self, p: Params) -> Params:
        if self.pacer is None:
            return {"updates": 0, "skipped": 0, "errors": 0, "seconds": 0.0, "rate": 0.0}
        pacer, self.pacer = self.pacer, None
        pacer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pacer
        if self.sends:
            await asyncio.wait(self.sends, timeout=10)
        seconds = time.perf_counter() - self.started
        return {**self.counts, "seconds": seconds, "rate": self.counts["updates"] / seconds}

    def close(self) -> None:
        for conn in self.connections.values():
            if conn.transport is not None:
                conn.transport.abort()


async def main(kind: str) -> None:
    publisher = Publisher(kind)
    try:
        await serve(
            {
                "pace_start": publisher.pace_start,
                "pace_stop": publisher.pace_stop,
                "publish_once": publisher.publish_once,
            }
        )
    finally:
        await publisher.pace_stop({})
        publisher.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.peers.publisher", description=__doc__)
    parser.add_argument("--kind", choices=("nchan", "pushpin"), required=True)
    args = parser.parse_args()
    raise_fd_limit()
    uvloop.run(main(args.kind))
