"""A ready hub is never far behind its bucket when its watch's node dies (issue 12).

The hub's watch consumer lives on one NATS node, not necessarily the one the hub is
connected to. When that node is killed, nothing disconnects and nothing arrives: only the
hub's own checks can tell. Before, a ready hub answered up to ~5.4 s stale (two missed
checks of a 2 s call each); now it re-watches, and is not ready meanwhile, within
`WATCH_STALE_BOUND_S` (docs/production.md, "Failure model").
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from bridge import TaskBridge
from bridge.wire import kv_stream
from hub.nats_source import WATCH_STALE_BOUND_S
from tests.cluster import ClusterNode, HubProcess, NatsCluster
from tests.helpers import eventually, headers_for, rpc

pytestmark = pytest.mark.timeout(120)

SLACK_S = 1.0  # a loaded 2-core machine's scheduling, on top of the bound
PLACEMENT_TRIES = 10  # the watch lands on the hub's own node 1 time in 3


async def hub_watching_from_afar(
    cluster: NatsCluster, bucket: str, root: Path, client: httpx.AsyncClient
) -> tuple[HubProcess, ClusterNode]:
    """A hub connected to node n0 whose watch consumer lives on another node."""
    home = cluster.nodes[0]
    for attempt in range(PLACEMENT_TRIES):
        hub = HubProcess(
            root / f"hub{attempt}", home.url, bucket, "--replicas", "3", "--poll-burst", "0"
        )
        hub.start()
        await hub.wait_ready(client)
        placements = await cluster.push_consumers(kv_stream(bucket))
        away = [host for host, reader in placements if reader is home and host is not home]
        if away:
            return hub, away[0]
        hub.stop()
    raise AssertionError(f"the watch stayed on the hub's node {PLACEMENT_TRIES} times")


async def test_a_ready_hub_is_never_more_than_the_bound_behind_when_its_watch_node_dies(
    tmp_path: Path, bucket: str
) -> None:
    cluster = NatsCluster(tmp_path / "nats")
    client = httpx.AsyncClient(timeout=5.0)
    hub: HubProcess | None = None
    bridge: TaskBridge | None = None
    try:
        cluster.start()
        await cluster.wait_ready()
        bridge = await TaskBridge.connect(
            cluster.url,
            "srv",
            bucket=bucket,
            replicas=3,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
        )
        task = await bridge.create(owner="anonymous", status_message="0")
        hub, victim = await hub_watching_from_afar(cluster, bucket, tmp_path, client)
        acked: dict[int, float] = {0: time.monotonic()}  # value → when its write was acked
        stop = asyncio.Event()

        async def write() -> None:
            value = 0
            while not stop.is_set():
                try:
                    await bridge.working(task.task_id, status_message=str(value + 1))
                except Exception:  # an election, a reconnect: try the same value again
                    await asyncio.sleep(0.05)
                    continue
                value += 1
                acked[value] = time.monotonic()
                await asyncio.sleep(0.02)

        samples: list[tuple[float, bool, int]] = []  # (when, ready, value seen)

        async def probe() -> None:
            body = rpc("tasks/get", {"taskId": task.task_id}, id=1)
            while not stop.is_set():
                ready = (await client.get(hub.url + "/readyz")).status_code == 200
                at = time.monotonic()
                answer = await client.post(hub.url + "/mcp", json=body, headers=headers_for(body))
                result = answer.json().get("result")
                if result is not None:  # else -32603 while NATS fails over
                    samples.append((at, ready, int(result["statusMessage"])))
                await asyncio.sleep(0.02)

        running = [asyncio.create_task(write()), asyncio.create_task(probe())]
        await eventually(lambda: len(acked) > 20, timeout=10)
        killed_at = time.monotonic()
        victim.kill()
        await eventually(lambda: time.monotonic() - killed_at > 6.0, timeout=10, interval=0.1)
        stop.set()
        await asyncio.gather(*running)

        def behind(at: float, value: int) -> float:
            """How long the next write had been acked when the hub still showed `value`."""
            nxt = acked.get(value + 1)
            return 0.0 if nxt is None or nxt > at else at - nxt

        worst = max(behind(at, value) for at, ready, value in samples if ready)
        print(f"\nwatch node {victim.name} killed: a ready hub was at most {worst:.2f}s behind")
        assert worst <= WATCH_STALE_BOUND_S + SLACK_S, f"ready while {worst:.2f}s stale"
        # And it caught up: the last acknowledged value is what it serves.
        body = rpc("tasks/get", {"taskId": task.task_id}, id=2)

        async def current() -> bool:
            answer = await client.post(hub.url + "/mcp", json=body, headers=headers_for(body))
            return bool(answer.json()["result"]["statusMessage"] == str(max(acked)))

        await eventually(current, timeout=10)
        await hub.wait_ready(client)
        metrics = (await client.get(hub.url + "/metrics")).text
        rewatches = [line for line in metrics.splitlines() if line.startswith("taskhub_nats_rew")]
        assert rewatches and float(rewatches[0].split()[-1]) >= 1, rewatches
    finally:
        if bridge is not None:
            await bridge.close()
        await client.aclose()
        if hub is not None:
            hub.stop()
        cluster.stop()
