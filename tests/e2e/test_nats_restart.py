"""The hub across NATS crashes: not ready while blind, then resynced, nothing missed.

Each test runs its own nats-server so it can `kill -9` and restart it (same port, same
store) without disturbing the rest of the suite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from bridge.jetstream import ensure_bucket
from bridge.wire import kv_stream, kv_subject
from hub.commands.embedded_nats import NatsServerProcess
from tests.helpers import HubHarness, envelope, eventually, new_task_id, start_hub


@pytest.fixture
async def own_nats(tmp_path: Path) -> AsyncIterator[NatsServerProcess]:
    server = NatsServerProcess(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


async def write(url: str, bucket: str, task_id: str, data: bytes) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_bucket(js, bucket)
        await js.publish(kv_subject(bucket, task_id), data)
    finally:
        await nc.close()


async def consumers(url: str, bucket: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(kv_stream(bucket))).state.consumer_count)
    finally:
        await nc.close()


async def ready(hub: HubHarness) -> bool:
    return (await hub.client.get(hub.url + "/readyz")).status_code == 200


async def test_kill_and_restart_nats_resyncs_streams_and_cache(
    own_nats: NatsServerProcess, bucket: str, tmp_path: Path
) -> None:
    url = own_nats.url
    a = new_task_id()
    await write(url, bucket, a, envelope(a, statusMessage="before"))
    hub = await start_hub(url, bucket, tmp_path / "hub")
    try:
        await eventually(lambda: ready(hub))
        async with hub.listen([a]) as stream:
            await stream.next()
            assert (await stream.next())["params"]["statusMessage"] == "before"

            own_nats.kill()
            await eventually(lambda: not hub.hub.ready)
            assert (await hub.client.get(hub.url + "/readyz")).status_code == 503
            # Blind, the hub still answers from its snapshot.
            assert (await hub.get_task(a)).json()["result"]["statusMessage"] == "before"

            own_nats.start()
            b = new_task_id()
            await write(url, bucket, a, envelope(a, "completed"))
            await write(url, bucket, b, envelope(b))
            final = await stream.until(lambda m: m["params"]["status"] == "completed", timeout=20)
            assert final["params"]["taskId"] == a
        await eventually(lambda: ready(hub), timeout=20)
        assert (await hub.get_task(b)).json()["result"]["taskId"] == b
        assert hub.hub.metrics.rewatches.value() >= 1
    finally:
        await hub.stop()


async def test_a_reconnect_storm_leaves_one_watch_consumer(
    own_nats: NatsServerProcess, bucket: str, tmp_path: Path
) -> None:
    url = own_nats.url
    hub = await start_hub(url, bucket, tmp_path / "hub")
    try:
        await eventually(lambda: ready(hub))
        ids = []
        for round_ in range(4):
            own_nats.kill()
            await eventually(lambda: not hub.hub.ready)
            own_nats.start()
            tid = new_task_id()
            ids.append(tid)
            await write(url, bucket, tid, envelope(tid, statusMessage=f"round {round_}"))
            await eventually(lambda: ready(hub), timeout=20)
        await eventually(lambda: all(hub.hub.cache.get(t) for t in ids), timeout=20)

        async def one_consumer() -> bool:
            return await consumers(url, bucket) == 1

        # Consumers of lost connections are deleted or expire (INACTIVE_CONSUMER_S).
        await eventually(one_consumer, timeout=30, interval=0.5)
    finally:
        await hub.stop()


async def test_a_frozen_nats_server_turns_readyz_503_within_the_ping_bound(
    own_nats: NatsServerProcess, bucket: str, tmp_path: Path
) -> None:
    """Issue 12: SIGSTOP the hub's server. With nats-py's defaults (a PING every 120 s)
    only the watch check noticed, after two failed 2 s calls (~6 s); PINGs every second,
    two unanswered, drop the connection within about three."""
    import os
    import signal
    import time

    hub = await start_hub(own_nats.url, bucket, tmp_path / "hub")
    assert own_nats.process is not None
    pid = own_nats.process.pid
    try:
        await eventually(lambda: ready(hub))
        frozen = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            await eventually(lambda: not_ready(hub), timeout=15)
            noticed = time.monotonic() - frozen
        finally:
            os.kill(pid, signal.SIGCONT)
        # (pings + 1) intervals, with room for a loaded machine.
        assert noticed < 5.0, f"/readyz stayed 200 for {noticed:.1f}s of a frozen server"
        await eventually(lambda: ready(hub), timeout=15)  # back once the server is
    finally:
        await hub.stop()


async def not_ready(hub: HubHarness) -> bool:
    return (await hub.client.get(hub.url + "/readyz")).status_code == 503


async def test_a_bucket_made_anew_while_the_hub_runs_is_read_anew(
    js: object, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    """Told apart by its creation time, even when the new stream has as many messages as
    the old one (its sequence alone would say "resume")."""
    old = [new_task_id() for _ in range(5)]
    for tid in old:
        await write(nats_url, bucket, tid, envelope(tid))
    harness = await start_hub(nats_url, bucket, tmp_path)
    try:
        await harness.hub.source.wait_caught_up(10)
        await js.delete_key_value(bucket)  # type: ignore[attr-defined]
        new = [new_task_id() for _ in range(5)]
        for tid in new:
            await write(nats_url, bucket, tid, envelope(tid))
        cache = harness.hub.cache
        await eventually(lambda: sorted(cache.task_ids()) == sorted(new), timeout=20)
        assert (await harness.get_task(old[0])).json()["error"]["code"] == -32602
    finally:
        await harness.stop()
