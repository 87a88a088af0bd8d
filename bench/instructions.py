"""Instructions per delivered frame on the fan-out path: the hub beside the raw ceiling.

Wall-clock figures move with the machine by more than a change to the delivery path saves
(docs/scaling.md); instructions counted by `valgrind --tool=callgrind` do not. Each target
runs its own path in a process of its own: a task revision stored, ingested (the hub's
`TaskCache.apply_put` and fan-out; the raw ceiling's `on_put`), and each follower's chunk
written by the target's own code to a real loopback socket that a separate, uncounted
process reads. No NATS and no HTTP parsing: what is counted is the per-revision and
per-frame work. Each target runs twice, with N and 2N revisions; the difference over
N × streams frames is its instructions per frame, so start-up, imports and the streams'
set-up cancel out. Callgrind counts user space only: the kernel's `send` is not in it.

Run: `python -m bench.instructions [--streams 100] [--revisions 1000]`; needs valgrind,
which it installs with apt-get when missing and run as root. `--probe hub|raw` runs one
target's path without valgrind (what the suite checks) and prints the frames read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import cast

import uvloop

from bench.peers.setup import apt_install

TARGETS = ("hub", "raw")
_TASK_ID = str(uuid.UUID(int=15))
_ROOT = Path(__file__).resolve().parents[1]


def revision(i: int) -> bytes:
    """The stored value of the bench task's i-th revision (~450 bytes, as bench/writer.py's)."""
    stamp = f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"
    task = {
        "taskId": _TASK_ID,
        "status": "working",
        "createdAt": "2026-01-01T00:00:00.000Z",
        "lastUpdatedAt": stamp,
        "ttlMs": 3_600_000,
        "statusMessage": f"step {i}: " + "x" * 240,
        "pollIntervalMs": 1000,
    }
    return json.dumps({"owner": "anonymous", "server": "bench-writer-1", "task": task}).encode()


def _reader(listener: socket.socket, streams: int) -> None:
    """The uncounted end: accept `streams` connections, read them to EOF, then print how
    many SSE frames (`data: ` lines) arrived in all."""
    selector = selectors.DefaultSelector()
    tails: dict[socket.socket, bytes] = {}
    frames = accepted = 0
    selector.register(listener, selectors.EVENT_READ)
    while accepted < streams or tails:
        for key, _ in selector.select():
            sock = cast(socket.socket, key.fileobj)
            if sock is listener:
                conn, _ = listener.accept()
                selector.register(conn, selectors.EVENT_READ)
                tails[conn] = b""
                accepted += 1
                continue
            data = sock.recv(1 << 20)
            if not data:
                selector.unregister(sock)
                del tails[sock]
                sock.close()
                continue
            seen = tails[sock] + data
            frames += seen.count(b"data: ")
            tails[sock] = seen[-5:]  # a marker split over two reads, counted once whole
    print(frames, flush=True)


async def _probe(target: str, port: int, streams: int, revisions: int) -> None:
    """Open `streams` followers of one task on `target`'s own objects, then store
    `revisions` new revisions, one per event-loop turn (each is one flush)."""
    loop = asyncio.get_running_loop()
    transports = []
    for _ in range(streams):
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        transports.append(transport)
    values = [revision(i) for i in range(revisions + 1)]
    if target == "hub":
        from hub.metrics import Metrics
        from hub.push.detached import DetachedStream
        from hub.push.fanout import Fanout
        from hub.push.sse_frames import ack_frame
        from hub.push.subscriber import Subscriber
        from hub.store.cache import TaskCache
        from hub.store.listener import Nobody

        metrics = Metrics()
        fanout = Fanout(metrics)

        class Delivery(Nobody):  # the store's listener: each change to the fan-out
            changed = staticmethod(fanout.publish)

        cache = TaskCache(Delivery())
        cache.apply_put(_TASK_ID, 1, values[0])
        for n, transport in enumerate(transports):
            sub = Subscriber(b"%d" % n, [_TASK_ID])
            fanout.subscribe(sub)
            stream = DetachedStream(sub, metrics, fanout.unsubscribe, loop)
            stream.start(transport, b"", ack_frame(sub.subscription_id, [_TASK_ID]), None)

        def store(seq: int, value: bytes) -> None:
            cache.apply_put(_TASK_ID, seq, value)
    else:
        from bench.raw_ceiling import Connection, RawServer

        server = RawServer()
        server.on_put(_TASK_ID, values[0])
        for n, transport in enumerate(transports):
            conn = Connection(server)
            conn.connection_made(transport)
            transport.set_protocol(conn)
            conn.prefix = b'data: {"raw":%d,' % n
            conn.following = [_TASK_ID]
            server.followers.setdefault(_TASK_ID, set()).add(conn)

        def store(seq: int, value: bytes) -> None:
            server.on_put(_TASK_ID, value)

    for i in range(1, revisions + 1):
        store(i + 1, values[i])
        await asyncio.sleep(0)  # the turn ends: the flush writes every follower's chunk
    for transport in transports:
        # Every byte out before the loop ends; the targets' own protocols hold the
        # connection callbacks, so the probe looks at the buffer itself.
        while transport.get_write_buffer_size():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        transport.close()
    await asyncio.sleep(0)


def run_probe(target: str, streams: int, revisions: int, valgrind: list[str]) -> tuple[int, int]:
    """One probe run of `target` (under `valgrind` if given); (frames read, instructions)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    reader = subprocess.Popen(
        [sys.executable, "-m", "bench.instructions", "--reader", "--streams", str(streams)],
        stdin=listener.fileno(),
        stdout=subprocess.PIPE,
        text=True,
        cwd=_ROOT,
    )
    listener.close()
    probe = subprocess.run(
        [
            *valgrind,
            *(sys.executable, "-m", "bench.instructions", "--child", target),
            *("--port", str(port), "--streams", str(streams), "--revisions", str(revisions)),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        cwd=_ROOT,
    )
    out, _ = reader.communicate(timeout=60)
    if probe.returncode != 0:
        raise RuntimeError(f"the {target} probe failed:\n{probe.stderr[-2000:]}")
    collected = re.search(r"Collected : (\d+)", probe.stderr)
    return int(out), int(collected.group(1)) if collected else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--revisions", type=int, default=1000)
    parser.add_argument("--probe", choices=TARGETS, help="one run without valgrind")
    parser.add_argument("--child", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reader:  # its listening socket is its stdin
        _reader(socket.socket(fileno=0), args.streams)
        return
    if args.child:
        uvloop.run(_probe(args.child, args.port, args.streams, args.revisions))
        return
    if args.probe:
        frames, _ = run_probe(args.probe, args.streams, args.revisions, [])
        print(f"{args.probe}: {frames:,} frames read")
        return
    valgrind = shutil.which("valgrind")
    if valgrind is None and os.geteuid() == 0:  # as the peers' set-up does (bench/peers/)
        print("valgrind is missing; running apt-get install -y valgrind", file=sys.stderr)
        failure = apt_install(["valgrind"])
        valgrind = shutil.which("valgrind")
        if valgrind is None:
            sys.exit(f"apt-get install valgrind failed: {failure}")
    if valgrind is None:
        sys.exit("valgrind is not installed, and this is not root: apt-get install valgrind")
    tool = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    rows = []
    for target in TARGETS:
        counts = [
            run_probe(target, args.streams, n, tool) for n in (args.revisions, 2 * args.revisions)
        ]
        (frames_1, instr_1), (frames_2, instr_2) = counts
        frames = frames_2 - frames_1
        rows.append((target, (instr_2 - instr_1) / max(1, frames), frames))
    print(f"`python -m bench.instructions --streams {args.streams} --revisions {args.revisions}`")
    print("| target | instructions per delivered frame | frames counted |")
    print("|---|---|---|")
    for target, per_frame, frames in rows:
        print(f"| {target} | {per_frame:,.0f} | {frames:,} |")


if __name__ == "__main__":
    main()
