"""A running peer: its process tree, its ports, and how a stream and a publish reach it.

`launch` starts a peer's root process in a session of its own (bench/peers/tree.py),
registers it with the harness, so it is stopped even when a scenario fails, and waits
until every port it should listen on accepts a connection.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import REPO_ROOT, Harness, HarnessError, Server
from bench.peers.tree import ProcessTree
from bench.processes import Child


@dataclass
class PeerServer:
    name: str  # nchan | pushpin | nginx
    port: int  # where clients connect
    publish_port: int  # where the publisher POSTs
    tree: ProcessTree
    stream_path: str = "/sub?id={}"  # a stream's GET, `{}` the topic
    origin: Server | None = None  # Pushpin's origin, a server of the bench's own


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


async def launch(
    h: Harness, name: str, argv: list[str], ports: list[int], log: Path, timeout: float = 30.0
) -> ProcessTree:
    """Start `argv`, wait until each of `ports` accepts; HarnessError with its log if not."""
    child = await Child.start(name, argv, log, cwd=REPO_ROOT, env=h.env, new_session=True)
    tree = ProcessTree(child)
    h.trees.append(tree)
    deadline = time.perf_counter() + timeout
    waiting = list(ports)
    while waiting:
        if not child.alive:
            await stop(h, tree)
            raise HarnessError(f"{name} exited: {child.log_tail(5)}")
        if time.perf_counter() > deadline:
            await stop(h, tree)
            raise HarnessError(f"{name} not listening on {waiting} in {timeout:.0f} s")
        if await _accepts(waiting[0]):
            waiting.pop(0)
        else:
            await asyncio.sleep(0.02)
    return tree


async def stop(h: Harness, tree: ProcessTree) -> None:
    await tree.stop()
    if tree in h.trees:
        h.trees.remove(tree)
