"""Many streams and one stalled stream: everyone gets every final state, nobody waits.

Invariants 2 and 5 under load: 200 concurrent listen streams over 50 tasks each end
with every terminal state, in order per task; a client that stops reading while
thousands of updates flow costs bounded memory, delays no other stream, and still
finds each task's final state when it reads again, unless it stays stalled past
`--send-timeout`: then its stream is dropped and its slot freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from bridge.wire import kv_subject
from tests.helpers import (
    HubHarness,
    envelope,
    eventually,
    headers_for,
    new_task_id,
    rpc,
    start_hub,
)

STREAMS = 200
TASKS = 50
TASKS_PER_STREAM = 10
STEPS = 5


async def write(js: Any, bucket: str, task_id: str, status: str, step: int, pad: str = "") -> None:
    data = envelope(task_id, status, statusMessage=f"step {step} {pad}")
    await js.publish(kv_subject(bucket, task_id), data)


async def test_200_streams_over_50_tasks_all_see_every_terminal_state(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    tasks = [new_task_id() for _ in range(TASKS)]
    for tid in tasks:
        await write(js, bucket, tid, "working", 0)
    follows = [
        [tasks[(i + k * 5) % TASKS] for k in range(TASKS_PER_STREAM)] for i in range(STREAMS)
    ]
    acked = 0
    all_acked = asyncio.Event()
    final: list[dict[str, str]] = [{} for _ in range(STREAMS)]

    async def follow(index: int) -> None:
        nonlocal acked
        mine = follows[index]
        async with hub.listen(mine, id=index) as stream:
            ack = await stream.next(timeout=30)
            assert ack["params"]["notifications"]["taskIds"] == mine
            acked += 1
            if acked == STREAMS:
                all_acked.set()
            last_step: dict[str, int] = {}
            while len(final[index]) < TASKS_PER_STREAM:
                params = (await stream.next(timeout=30))["params"]
                assert params["_meta"] == {"io.modelcontextprotocol/subscriptionId": index}
                tid, step = params["taskId"], int(params["statusMessage"].split()[1])
                assert tid in mine and params["taskId"] not in final[index]
                assert step >= last_step.get(tid, 0), "per-task order went backwards"
                last_step[tid] = step
                if params["status"] in ("completed", "failed", "cancelled"):
                    final[index][tid] = params["status"]

    followers = [asyncio.create_task(follow(i)) for i in range(STREAMS)]
    async with asyncio.timeout(60):
        await all_acked.wait()
        assert len(hub.hub.fanout) == STREAMS
        for step in range(1, STEPS):
            for tid in tasks:
                await write(js, bucket, tid, "working", step)
        outcomes = ["completed", "failed", "cancelled"]
        for n, tid in enumerate(tasks):
            await write(js, bucket, tid, outcomes[n % 3], STEPS)
        await asyncio.gather(*followers)
    expected = {tid: outcomes[n % 3] for n, tid in enumerate(tasks)}
    for index in range(STREAMS):
        assert final[index] == {tid: expected[tid] for tid in follows[index]}
    await eventually(lambda: len(hub.hub.fanout) == 0)


# A header value with a tab: harmless, but the whole-post path leaves such a request to
# uvicorn's parser (hub/http/whole_post.py), so its stream runs on a task of its own.
NOT_IN_PLACE = {"X-Note": "not\tin place"}


async def open_stalled_listen(
    url: str, task_ids: list[str], extra: dict[str, str] | None = None
) -> socket.socket:
    """A raw client that sends a listen request and then reads nothing."""
    host, port = url.removeprefix("http://").split(":")
    body = rpc("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, id="stalled")
    payload = json.dumps(body).encode()
    headers = {**headers_for(body), "Host": f"{host}:{port}", "Content-Length": str(len(payload))}
    headers.update(extra or {})
    request = "POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(request.encode() + b"\r\n" + payload)
    sock.setblocking(False)
    return sock


def drain(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def test_a_stalled_stream_costs_bounded_memory_and_delays_nobody(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    tasks = [new_task_id() for _ in range(5)]
    for tid in tasks:
        await write(js, bucket, tid, "working", 0)
    stalled = await open_stalled_listen(hub.url, tasks)
    try:
        await eventually(lambda: len(hub.hub.fanout) == 1)
        stalled_sub = next(iter(hub.hub.fanout._subscribers))
        padding = "x" * 2000  # big frames fill the socket buffers fast
        async with hub.listen(tasks, id="healthy") as healthy:
            await healthy.next()
            largest_backlog = 0
            updates = 3000
            for step in range(1, updates + 1):
                tid = tasks[step % len(tasks)]
                await write(js, bucket, tid, "working", step, padding)
                largest_backlog = max(largest_backlog, len(stalled_sub.backlog))
            for tid in tasks:
                await write(js, bucket, tid, "completed", updates + 1)
            done: set[str] = set()
            async with asyncio.timeout(30):
                while len(done) < len(tasks):
                    params = (await healthy.next())["params"]
                    if params["status"] == "completed":
                        done.add(params["taskId"])
            # The healthy stream is finished while the stalled one has still read nothing.
            assert largest_backlog <= len(tasks)
            # 6 MB of frames cannot fit the ~4 MB of socket buffers: the rest coalesced.
            assert hub.hub.metrics.coalesced_frames.value() >= 500
            assert not stalled_sub.ended

        # When the stalled client reads again, every final state is there.
        received = bytearray()
        finals: set[str] = set()

        async def all_finals_arrived() -> bool:
            received.extend(drain(stalled))
            for line in bytes(received).split(b"\n"):
                if line.startswith(b"data: ") and b'"status":"completed"' in line:
                    finals.add(json.loads(line[6:])["params"]["taskId"])
            return finals == set(tasks)

        await eventually(all_finals_arrived, timeout=30)
    finally:
        stalled.close()
    await eventually(lambda: len(hub.hub.fanout) == 0)


async def test_streams_of_one_task_ride_its_lane_and_a_stalled_one_leaves_it(
    hub: HubHarness, js: Any, bucket: str
) -> None:
    """The express lane over real sockets (hub/push/followers.py): streams following one task
    in place ride it once the general path has written them a state; one that stops
    reading fills its socket buffer and leaves the lane from inside the lane's own write,
    delays nobody, and finds the final state when it reads again. Every stream sees its
    states in order and ends with the last (coalescing may skip some between)."""
    tid = new_task_id()
    await write(js, bucket, tid, "working", 0)
    # Cached first: a listen for a task the watch has not brought yet is answered by the
    # app's path (a store read), not opened in place, and such a stream rides no lane.
    await eventually(lambda: hub.hub.cache.get(tid) is not None)
    stalled = await open_stalled_listen(hub.url, [tid])
    steps = 1_000_000  # the last step, once known
    try:
        async with contextlib.AsyncExitStack() as streams:
            healthy = [
                await streams.enter_async_context(hub.listen([tid], id=f"h{i}")) for i in range(10)
            ]
            for stream in healthy:
                await stream.next()  # the ack
                await stream.next()  # step 0

            async def read_all(stream: Any) -> list[int]:
                seen: list[int] = []
                while not seen or seen[-1] < steps:
                    params = (await stream.next(timeout=30))["params"]
                    seen.append(int(params["statusMessage"].split()[1]))
                return seen

            readers = [asyncio.create_task(read_all(stream)) for stream in healthy]
            subscribers = list(hub.hub.fanout._subscribers)
            stalled_sub = next(s for s in subscribers if s.subscription_id == b'"stalled"')
            await write(js, bucket, tid, "working", 1)  # the general path's chunk
            await eventually(lambda: all(s.lane is not None for s in subscribers))
            padding = "x" * 8000  # the stalled client's buffers fill within some 500 steps
            step = 1
            while stalled_sub.lane is not None:  # until its buffer fills
                assert step < 2000, "the stalled stream never left the lane"
                step += 1
                await write(js, bucket, tid, "working", step, padding)
            assert not stalled_sub.ended
            steps = step + 1
            await write(js, bucket, tid, "completed", steps)
            async with asyncio.timeout(30):
                for seen in await asyncio.gather(*readers):
                    assert seen[-1] == steps and seen == sorted(set(seen))

        received = bytearray()

        async def final_arrived() -> bool:
            received.extend(drain(stalled))
            return b'"status":"completed"' in received

        await eventually(final_arrived, timeout=30)
    finally:
        stalled.close()
    await eventually(lambda: len(hub.hub.fanout) == 0)


@pytest.mark.parametrize(
    ("writer", "asgi_only"),
    [("in_place", False), ("direct", False), ("asgi", True)],
    ids=["in-place", "direct", "asgi"],
)
async def test_a_stream_stalled_past_the_send_timeout_is_dropped(
    nats_url: str, bucket: str, tmp_path: Path, js: Any, writer: str, asgi_only: bool
) -> None:
    harness = await start_hub(
        nats_url, bucket, tmp_path, send_timeout=1.0, keepalive=0.2, asgi_only=asgi_only
    )
    tid = new_task_id()
    await write(js, bucket, tid, "working", 0)
    # Cached first: a listen naming a task the watch has not delivered yet reads it
    # through and runs on the ASGI path, whatever the writer under test.
    await eventually(lambda: harness.hub.cache.get(tid) is not None)
    extra = NOT_IN_PLACE if writer == "direct" else None
    stalled = await open_stalled_listen(harness.url, [tid], extra)
    try:
        await eventually(lambda: len(harness.hub.fanout) == 1)
        assert harness.hub.metrics.streams_opened.value(writer) == 1
        stalled_sub = next(iter(harness.hub.fanout._subscribers))
        async with harness.listen([tid], id="healthy") as healthy:
            await healthy.next()  # the ack
            await healthy.next()  # step 0
            padding = "x" * 200_000
            step = 0

            async def next_step() -> None:
                nonlocal step
                step += 1
                await write(js, bucket, tid, "working", step, padding)
                frame = await healthy.next(timeout=10)  # the healthy stream keeps up
                assert frame["params"]["statusMessage"].startswith(f"step {step} ")

            # Fill the stalled client's buffers until the hub's write blocks (bounded by
            # the socket buffers, not by how fast this loop runs), then wait out the timeout.
            while stalled_sub.stalled_since() is None:
                await next_step()
                assert step < 500, "the stalled stream's writes never blocked"
            await next_step()  # a blocked writer delays nobody
            await eventually(lambda: harness.hub.metrics.streams_closed.value("send_timeout") == 1)
            await eventually(lambda: len(harness.hub.fanout) == 1)  # only the healthy one
            await write(js, bucket, tid, "completed", step + 1)
            assert (await healthy.next(timeout=10))["params"]["status"] == "completed"
    finally:
        stalled.close()
        await harness.stop()
