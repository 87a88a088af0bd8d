"""The raw ceiling: what one Python process on uvloop can do with no framework at all.

An `asyncio.Protocol` server that watches the same bucket as the hub and answers the
same two hot paths with preformatted bytes: `tasks/get` splices a cached response tail
(built once per revision) after the request id, and `subscriptions/listen` writes the
ack, the current states, then every change as SSE frames in HTTP/1.1 chunks, one write
per stream per event-loop turn, coalescing per task while the socket is paused. A stream
that follows one task and is not paused is written in one pass over all such streams of
that task whose loop runs in C (`map`), as the hub's express lanes are (hub/push/followers.py).
It validates nothing and authorises nothing, so it bounds what the hub could reach in
Python; the bench reports the hub as a ratio of it.

Run: `python -m bench.raw_ceiling --nats-url URL --bucket NAME --port N` (loopback only).
"""

from __future__ import annotations

import asyncio
import signal
from collections import deque
from collections.abc import Callable
from itertools import repeat
from operator import call
from typing import cast

import msgspec

from bench.processes import reference_server_main
from bench.protocol import content_length
from bench.watch import BucketWatch
from bridge.vocabulary import SERVER_INFO_KEY, SUBSCRIPTION_ID_KEY

_SUB_KEY = msgspec.json.encode(SUBSCRIPTION_ID_KEY) + b":"
_SERVER_META = (
    b'"_meta":'
    + msgspec.json.encode({SERVER_INFO_KEY: {"name": "raw-ceiling", "version": "0"}})
    + b","
)
_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n"
)
_NOT_FOUND = b',"error":{"code":-32602,"message":"Failed to retrieve task: Task not found"}}'


class _Notifications(msgspec.Struct):
    taskIds: list[str] = []


class _Params(msgspec.Struct):
    taskId: str = ""
    notifications: _Notifications | None = None


class _Call(msgspec.Struct):
    id: msgspec.Raw
    method: str
    params: _Params


class _Envelope(msgspec.Struct):
    task: msgspec.Raw


_call_decoder = msgspec.json.Decoder(_Call)
_envelope_decoder = msgspec.json.Decoder(_Envelope)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Task:
    """One revision: the tasks/get tail and the SSE frame tail, each built once."""

    __slots__ = ("frame_tail", "get_tail")

    def __init__(self, body: bytes) -> None:
        self.get_tail = b',"result":{"resultType":"complete",' + _SERVER_META + body[1:] + b"}"
        self.frame_tail = body[1:] + b"}\n\n"


_join = b"".join


class RawServer:
    def __init__(self) -> None:
        self.tasks: dict[str, _Task] = {}
        self.followers: dict[str, set[Connection]] = {}  # the others: pending, then a write
        self.lanes: dict[str, dict[Connection, None]] = {}  # one task alone, not paused
        self.groups: dict[str, list[tuple[int, list[Callable[[bytes], None]], list[bytes]]]] = {}
        self.due: dict[str, _Task] = {}  # tasks with a change for their lane
        self.dirty: set[Connection] = set()
        self.flush_pending = False
        self.watch = BucketWatch(self.on_put, self.on_delete)
        self.loop = asyncio.get_running_loop()

    def on_put(self, key: str, data: bytes) -> None:
        try:
            task = _Task(bytes(_envelope_decoder.decode(data).task))
        except msgspec.DecodeError:
            return
        self.tasks[key] = task
        if self.lanes.get(key):
            self.due[key] = task
            self.schedule_flush()
        followers = self.followers.get(key)
        if followers:
            for conn in followers:
                conn.pending[key] = task
            self.dirty |= followers
            self.schedule_flush()

    def on_delete(self, key: str) -> None:
        self.tasks.pop(key, None)

    def schedule_flush(self) -> None:
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """One write per dirty stream per loop turn, however many changes it collected."""
        self.flush_pending = False
        due, self.due = self.due, {}
        for key, task in due.items():
            self.write_lane(key, task)
        dirty, self.dirty = self.dirty, set()
        for conn in dirty:
            conn.flush()

    def write_lane(self, key: str, task: _Task) -> None:
        groups = self.groups.get(key)
        if groups is None:
            by_length: dict[int, tuple[int, list[Callable[[bytes], None]], list[bytes]]] = {}
            for conn in self.lanes.get(key, ()):
                assert conn.transport is not None
                group = by_length.setdefault(len(conn.prefix), (len(conn.prefix), [], []))
                group[1].append(conn.transport.write)
                group[2].append(conn.prefix)
            groups = self.groups[key] = list(by_length.values())
        tail = task.frame_tail + b"\r\n"
        for length, writes, prefixes in groups:
            head = b"%x\r\n" % (length + len(tail) - 2)
            deque(map(call, writes, map(_join, zip(repeat(head), prefixes, repeat(tail)))), 0)

    def join(self, conn: Connection, key: str) -> None:
        self.followers[key].discard(conn)
        self.lanes.setdefault(key, {})[conn] = None
        self.groups.pop(key, None)

    def leave(self, conn: Connection, key: str) -> None:
        """Out of the lane (paused, or gone): back to pending and a write of its own."""
        del self.lanes[key][conn]
        self.groups.pop(key, None)
        self.followers.setdefault(key, set()).add(conn)
        conn.in_lane = False
        if key in self.due:  # a change not yet written
            conn.pending[key] = self.due[key]
            self.dirty.add(conn)


class Connection(asyncio.Protocol):
    """One client connection: keep-alive requests until it turns into a listen stream."""

    def __init__(self, server: RawServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.prefix = b""  # set once the connection is a listen stream
        self.following: list[str] = []
        self.pending: dict[str, _Task] = {}
        self.paused = False
        self.in_lane = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.in_lane:
            self.server.leave(self, self.following[0])
        for key in self.following:
            followers = self.server.followers.get(key)
            if followers is not None:
                followers.discard(self)
        self.server.dirty.discard(self)
        self.transport = None

    def pause_writing(self) -> None:
        self.paused = True
        if self.in_lane:
            self.server.leave(self, self.following[0])

    def resume_writing(self) -> None:
        self.paused = False
        if self.pending:
            self.server.dirty.add(self)
            self.server.schedule_flush()

    def flush(self) -> None:
        if self.paused or not self.pending or self.transport is None:
            return
        prefix = self.prefix
        data = b"".join([prefix + task.frame_tail for task in self.pending.values()])
        self.pending.clear()
        self.transport.write(_chunk(data))
        if len(self.following) == 1 and not self.paused and not self.in_lane:
            self.in_lane = True
            self.server.join(self, self.following[0])

    def data_received(self, data: bytes) -> None:
        if self.prefix:
            return  # a listen stream: the client has nothing more to say
        buf = self.buf
        buf += data
        while True:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(buf[:head_end]).lower()
            end = head_end + 4 + (content_length(head) or 0)
            if len(buf) < end:
                return
            body = bytes(buf[head_end + 4 : end])
            del buf[:end]
            self.handle(head, body)
            if self.prefix:
                return

    def handle(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if head.startswith(b"get /readyz"):
            ready = self.server.watch.ready.is_set()
            status = b"200 OK" if ready else b"503 Service Unavailable"
            self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")
            return
        try:
            call = _call_decoder.decode(body)
        except msgspec.DecodeError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            return
        if call.method == "subscriptions/listen":
            self.listen(call)
            return
        task = self.server.tasks.get(call.params.taskId)
        tail = _NOT_FOUND if task is None else task.get_tail
        response = b'{"jsonrpc":"2.0","id":' + bytes(call.id) + tail
        self.transport.write(_JSON_HEAD + b"%d\r\n\r\n" % len(response) + response)

    def listen(self, call: _Call) -> None:
        assert self.transport is not None
        sub_id = bytes(call.id)
        wanted = call.params.notifications.taskIds if call.params.notifications else []
        tasks = self.server.tasks
        granted = [key for key in wanted if key in tasks]
        self.following = granted
        for key in granted:
            self.server.followers.setdefault(key, set()).add(self)
        self.prefix = (
            b'data: {"jsonrpc":"2.0","method":"notifications/tasks","params":{"_meta":{'
            + _SUB_KEY
            + sub_id
            + b"},"
        )
        ack = (
            b'data: {"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",'
            b'"params":{"_meta":{'
            + _SUB_KEY
            + sub_id
            + b'},"notifications":{"taskIds":'
            + msgspec.json.encode(granted)
            + b"}}}\n\n"
        )
        frames = b"".join([self.prefix + tasks[key].frame_tail for key in granted])
        self.transport.write(_SSE_HEAD + _chunk(ack + frames))


async def serve(nats_url: str, bucket: str, host: str, port: int) -> None:
    server = RawServer()
    await server.watch.start(nats_url, bucket)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        lambda: Connection(server), host, port, backlog=4096, reuse_address=True
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()
    await server.watch.close()


def main() -> None:
    reference_server_main("python -m bench.raw_ceiling", __doc__, serve)


if __name__ == "__main__":
    main()
