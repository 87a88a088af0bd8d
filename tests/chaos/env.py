"""The processes of a chaos run and their teardown.

A 3-node JetStream cluster whose nodes reach each other through proxies a fault can cut
(`tests.cluster.PartitionableCluster`), two `taskhub serve` hubs
(`tests.cluster.HubProcess`) each reaching every node through its own `TcpProxy`
(hub → proxy → node), one `TcpProxy` in front of each hub for the SSE clients
(client → proxy → hub), two bridges ("srv-0", "srv-1") connected straight to the cluster,
and one httpx client. `close()` stops everything this run started, by PID: paused nodes
get SIGCONT first, then SIGTERM and, after a grace period, SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client as NatsClient

from bridge import TaskBridge
from bridge.wire import kv_stream
from tests.chaos.history import History
from tests.cluster import ClusterNode, HubProcess, PartitionableCluster
from tests.tcp_proxy import TcpProxy

SILENCE_S = 10.0  # a stream silent this long (keep-alives come every 1 s) counts as broken
HUB_ARGS = ("--replicas", "3", "--keepalive", "1", "--log-level", "info")


@dataclass
class Env:
    root: Path
    bucket: str
    history: History
    cluster: PartitionableCluster
    hubs: list[HubProcess] = field(default_factory=list)
    sse_proxies: list[TcpProxy] = field(default_factory=list)
    nats_proxies: list[list[TcpProxy]] = field(default_factory=list)
    bridges: list[TaskBridge] = field(default_factory=list)
    client: httpx.AsyncClient | None = None
    alive: list[bool] = field(default_factory=lambda: [True, True])
    paused: set[int] = field(default_factory=set)  # PIDs of SIGSTOPped nodes
    admin: NatsClient | None = None  # for stream/consumer info

    @property
    def http(self) -> httpx.AsyncClient:
        assert self.client is not None
        return self.client

    @property
    def stream(self) -> str:
        return kv_stream(self.bucket)

    def listen_url(self, hub: int) -> str:
        return f"http://127.0.0.1:{self.sse_proxies[hub].port}/mcp"

    def where_to_look(self) -> str:
        hubs = ", ".join(str(hub.log_file) for hub in self.hubs)
        nodes = ", ".join(str(node.log_file) for node in self.cluster.nodes)
        return f"hub logs: {hubs}; nats logs: {nodes}"

    async def hub_ready(self, hub: int) -> bool:
        return self.alive[hub] and await self.hubs[hub].ready(self.http)

    async def _stream_info(self) -> Any:
        """The bucket stream's info, or None while NATS cannot answer."""
        if self.admin is None:
            return None
        try:
            return await self.admin.jetstream(timeout=2.0).stream_info(self.stream)
        except Exception:
            return None

    async def stream_leader(self) -> ClusterNode | None:
        info = await self._stream_info()
        leader = None if info is None or info.cluster is None else info.cluster.leader
        return None if leader is None else self.cluster.node(leader)

    async def consumer_count(self) -> int | None:
        info = await self._stream_info()
        return None if info is None else int(info.state.consumer_count)

    async def stream_current(self) -> bool:
        """The bucket stream has a leader and every replica is current and online."""
        info = await self._stream_info()
        cluster = None if info is None else info.cluster
        if cluster is None or cluster.leader is None:
            return False
        replicas = cluster.replicas or []
        return len(replicas) == 2 and all(p.current and not p.offline for p in replicas)

    async def settle(self, timeout: float = 60.0) -> bool:
        """Until the stream is fully replicated and every live hub answers /readyz 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [i for i in range(len(self.hubs)) if self.alive[i]]
            ready = await asyncio.gather(*(self.hub_ready(i) for i in live))
            if all(ready) and await self.stream_current():
                return True
            await asyncio.sleep(0.1)
        return False

    async def _nats_error(self, exc: Exception) -> None:
        """The bridges' and admin connection's errors (refused reconnects, EOFs): counted."""
        self.history.nats_client_errors[type(exc).__name__] += 1

    async def open(self, hub_env: dict[str, str]) -> None:
        self.cluster.start()
        await self.cluster.wait_ready()
        self.admin = await nats.connect(
            servers=self.cluster.urls,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            error_cb=self._nats_error,
        )
        for i in range(2):
            proxies = [TcpProxy(node.port, f"hub{i}->{node.name}") for node in self.cluster.nodes]
            for proxy in proxies:
                await proxy.start()
            self.nats_proxies.append(proxies)
            url = ",".join(f"nats://{p.url}" for p in proxies)
            hub = HubProcess(self.root / f"hub{i}", url, self.bucket, *HUB_ARGS, env=hub_env)
            self.hubs.append(hub)
            hub.start()
            sse = TcpProxy(hub.port, f"clients->hub{i}")
            await sse.start()
            self.sse_proxies.append(sse)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=SILENCE_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=50),
        )
        for i in range(2):
            self.bridges.append(
                await TaskBridge.connect(
                    self.cluster.url,
                    f"srv-{i}",
                    bucket=self.bucket,
                    replicas=3,
                    name=f"chaos-bridge-{i}",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                    error_cb=self._nats_error,
                )
            )
        for hub in self.hubs:
            await hub.wait_ready(self.http, timeout=30.0)
            assert hub.process is not None
            self.history.hub_restarts.append(
                (time.monotonic(), self.hubs.index(hub), hub.process.pid)
            )

    async def close(self) -> None:
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.paused.discard(pid)
        for bridge in self.bridges:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(bridge.close(), 5.0)
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.admin.close(), 5.0)
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.aclose()
        for hub in self.hubs:
            with contextlib.suppress(Exception):
                hub.stop(timeout=10.0)
        for proxy in [*self.sse_proxies, *(p for ps in self.nats_proxies for p in ps)]:
            with contextlib.suppress(Exception):
                await proxy.stop()
        for node in self.cluster.nodes:
            with contextlib.suppress(Exception):
                node.stop(timeout=10.0)
        for link in self.cluster.links.values():
            with contextlib.suppress(Exception):
                await link.stop()
