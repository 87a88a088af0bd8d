"""Pushpin's origin: answers each stream request with a GRIP hold on the stream's topic.

`GET /sub?id=<topic>` gets `Grip-Hold: stream` and `Grip-Channel: <topic>` with one SSE
event as the body: Pushpin sends that body to the client and then holds the response
open, appending whatever is published to the channel. The event is the stream's first
frame (a freshly stamped notification), the counterpart of the hub's initial snapshot.
Anything else gets 200 with an empty body (`/readyz`). Keep-alive, no HTTP library.

Run: `python -m bench.peers.grip_origin --port N` (loopback only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import cast
from urllib.parse import parse_qs, urlsplit

import uvloop

from bench.peers.frames import event, payload
from bench.processes import raise_fd_limit
from bench.protocol import content_length, stamp

_EMPTY = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


def hold(topic: str) -> bytes:
    body = event(payload(topic, stamp()))
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Grip-Hold: stream\r\nGrip-Channel: " + topic.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )


class Origin(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buf = self.buf
        buf += data
        while (head_end := buf.find(b"\r\n\r\n")) >= 0:
            head = bytes(buf[:head_end])
            end = head_end + 4 + (content_length(head.lower()) or 0)
            if len(buf) < end:
                return
            del buf[:end]
            target = head.split(b" ", 2)[1].decode()
            topics = parse_qs(urlsplit(target).query).get("id")
            self.transport.write(hold(topics[0]) if topics else _EMPTY)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(Origin, host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.peers.grip_origin", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port))
