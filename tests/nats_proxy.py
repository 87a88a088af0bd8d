"""A TCP proxy between a NATS client and nats-server that loses chosen messages on purpose.

Real bytes on real sockets: the client speaks to the proxy as to a server, and the proxy
parses the server's side of the protocol just enough to frame each message (`MSG`, `HMSG`,
control lines). `lose_replies(after=b"HPUB $KV.", count=2)` drops the next `count`
messages delivered to the client's `_INBOX` subjects once the client has sent a line
starting with `after`: the ack of a JetStream publish and the reply to the read that
follows it, the "ack lost, read-back failed" fault of a deposed or partitioned leader.

`rewrite_replies(prefix, rewrite)` replaces the server's reply to each request whose
subject starts with `prefix` by `rewrite(subject, reply)`: the answer of a deposed leader
from its old store. `hold_deliveries()` keeps JetStream push deliveries (and the
heartbeats of their subscriptions) from the client until `release_deliveries()`: a watch
running behind. `drop_deliveries(count)` loses the next `count` push deliveries: a watch
that missed a message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

Rewrite = Callable[[bytes, bytes], bytes]  # (request subject, reply payload) → payload


@dataclass
class _Plan:
    after: bytes
    count: int
    armed: bool = False  # the trigger line went by; drop the next `count` replies
    dropped: list[bytes] = field(default_factory=list)  # the subjects of what was lost


class NatsProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.server: asyncio.Server | None = None
        self.plan: _Plan | None = None
        self.lost = asyncio.Event()  # set once the plan dropped all it was to drop
        self.rewritten = 0  # replies replaced so far
        self._rewrite: tuple[bytes, Rewrite] | None = None
        self._requests: dict[bytes, bytes] = {}  # reply inbox → subject of its request
        self._holding = False
        self._to_drop = 0  # push deliveries still to lose
        self.dropped_deliveries = 0
        # (client connection, sid) of each subscription that push deliveries came to
        self._delivering: set[tuple[asyncio.StreamWriter, bytes]] = set()
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"nats://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def lose_replies(self, *, after: bytes, count: int) -> None:
        self.plan = _Plan(after, count)
        self.lost.clear()

    def rewrite_replies(self, prefix: bytes, rewrite: Rewrite | None) -> None:
        """Rewrite replies to requests on `prefix…` from now on; None stops it."""
        self._rewrite = None if rewrite is None else (prefix, rewrite)

    def hold_deliveries(self) -> None:
        self._holding = True

    def drop_deliveries(self, count: int) -> None:
        self._to_drop = count

    async def release_deliveries(self) -> None:
        self._holding = False
        held, self._held = self._held, []
        for writer, data in held:
            writer.write(data)
            await writer.drain()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        up = asyncio.create_task(self._client_to_server(client_r, server_w))
        down = asyncio.create_task(self._server_to_client(server_r, client_w))
        self._tasks |= {up, down}
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            for writer in (client_w, server_w):
                writer.close()
            self._tasks -= {up, down}

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while line := await reader.readline():  # control lines; payloads pass as lines too
            plan = self.plan
            if plan is not None and not plan.armed and line.startswith(plan.after):
                plan.armed = True
            if self._rewrite is not None and line.startswith((b"PUB ", b"HPUB ")):
                parts = line.split()
                has_reply = len(parts) == (4 if parts[0] == b"PUB" else 5)
                if has_reply and parts[1].startswith(self._rewrite[0]):
                    self._requests[parts[2]] = parts[1]
            writer.write(line)
            await writer.drain()

    async def _server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while line := await reader.readline():
            payload = b""
            if line.startswith((b"MSG ", b"HMSG ")):
                size = int(line.split()[-1])
                payload = await reader.readexactly(size + 2)  # and its CRLF
                if self._drop(line) or self._drop_delivery(line):
                    continue
                line, payload = self._rewritten(line, payload)
                if self._hold(writer, line + payload):
                    continue
            writer.write(line + payload)
            await writer.drain()

    def _rewritten(self, line: bytes, payload: bytes) -> tuple[bytes, bytes]:
        """`MSG <subject> <sid> <size>`: a reply to a request being rewritten, replaced."""
        parts = line.split()
        request = self._requests.pop(parts[1], None)
        if request is None or self._rewrite is None or parts[0] != b"MSG":
            return line, payload
        body = self._rewrite[1](request, payload[:-2])
        self.rewritten += 1
        return b" ".join([*parts[:-1], str(len(body)).encode()]) + b"\r\n", body + b"\r\n"

    def _hold(self, writer: asyncio.StreamWriter, data: bytes) -> bool:
        parts = data.split(b"\r\n", 1)[0].split()
        if _is_delivery(parts):
            self._delivering.add((writer, parts[2]))  # a push consumer's subscription
        if not self._holding or (writer, parts[2]) not in self._delivering:
            return False
        self._held.append((writer, data))
        return True

    def _drop_delivery(self, line: bytes) -> bool:
        if not self._to_drop or not _is_delivery(line.split()):
            return False
        self._to_drop -= 1
        self.dropped_deliveries += 1
        return True

    def _drop(self, line: bytes) -> bool:
        plan = self.plan
        subject = line.split()[1]
        if plan is None or not plan.armed or not subject.startswith(b"_INBOX"):
            return False
        plan.dropped.append(subject)
        if len(plan.dropped) >= plan.count:
            self.plan = None
            self.lost.set()
        return True


def _is_delivery(parts: list[bytes]) -> bool:
    """`MSG|HMSG <subject> <sid> <reply> …` of a JetStream push delivery."""
    return len(parts) >= 5 and parts[3].startswith(b"$JS.ACK.")
