"""Real processes for fault tests: a 3-node NATS JetStream cluster and `taskhub serve` hubs.

Every node keeps its store, client port and cluster port across restarts, so a test can
`kill -9` or stop any node (or all of them) and start it again as the same cluster member.
Only the processes started here are ever signalled, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import httpx
import nats
from nats.js import api

from hub.commands.embedded_nats import NatsServerProcess, die_with_parent
from tests.helpers import eventually, free_port
from tests.tcp_proxy import TcpProxy

CLUSTER_NAME = "taskhub-faults"


class ClusterNode(NatsServerProcess):
    """One cluster member: `NatsServerProcess` plus its name, cluster port and routes."""

    def __init__(
        self,
        data_dir: Path,
        name: str,
        cluster_port: int,
        routes: list[int],
        *,
        advertise: bool = True,
        cluster_advertise: int | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            monitor=True,
            extra_args=[
                "--server_name",
                name,
                "--cluster_name",
                CLUSTER_NAME,
                "--cluster",
                f"nats://127.0.0.1:{cluster_port}",
                "--routes",
                ",".join(f"nats://127.0.0.1:{port}" for port in routes),
                # Without advertising, clients keep to the URLs they were given (a proxy).
                *([] if advertise else ["--no_advertise"]),
                # Routed through proxies: what gossip tells the other nodes to dial.
                *(
                    []
                    if cluster_advertise is None
                    else ["--cluster_advertise", f"127.0.0.1:{cluster_advertise}"]
                ),
            ],
        )
        self.name = name
        self.cluster_port = cluster_port

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def subscribed_subjects(self) -> set[str]:
        """Every subject some client connected to this node subscribes to (`/connz`)."""
        assert self.monitor_url is not None, "start the node first"
        async with httpx.AsyncClient(timeout=2.0) as client:
            connz = (await client.get(self.monitor_url + "/connz?subs=1&limit=1024")).json()
        return {
            subject
            for conn in connz.get("connections") or []
            for subject in conn.get("subscriptions_list") or []
        }


class NatsCluster:
    """Three (by default) JetStream nodes on loopback, routed to each other."""

    def __init__(self, root: Path, size: int = 3, *, advertise: bool = True) -> None:
        cluster_ports = [free_port() for _ in range(size)]
        self.nodes = [
            ClusterNode(
                root / f"n{i}",
                f"n{i}",
                cluster_ports[i],
                [port for j, port in enumerate(cluster_ports) if j != i],
                advertise=advertise,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """All client URLs, comma-separated (`taskhub serve --nats-url`, the bridge)."""
        return ",".join(self.urls)

    def node(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        # Started from the loop's own thread on purpose: the nodes get PDEATHSIG, which
        # Linux ties to the thread that forked them, not to the process.
        for node in self.nodes:
            if not node.running:
                node.start()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until JetStream has a meta leader and every running node can hold a replica."""
        replicas = sum(node.running for node in self.nodes)
        nc = await nats.connect(
            servers=[node.url for node in self.nodes if node.running],
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.1,
        )
        probe = f"PROBE_{os.getpid()}_{time.monotonic_ns()}"
        try:
            js = nc.jetstream(timeout=1.0)

            async def placed() -> bool:
                try:
                    await js.account_info()
                    config = api.StreamConfig(
                        name=probe,
                        subjects=[f"probe.{probe}"],
                        storage=api.StorageType.MEMORY,
                        num_replicas=replicas,
                    )
                    await js.add_stream(config)
                except Exception:  # no meta leader yet, or too few peers known
                    return False
                return True

            await eventually(placed, timeout=timeout, interval=0.1)
            with contextlib.suppress(Exception):
                await js.delete_stream(probe)
        finally:
            await nc.close()

    async def stream_leader(self, stream: str) -> ClusterNode:
        nc = await nats.connect(servers=[node.url for node in self.nodes if node.running])
        try:
            info = await nc.jetstream(timeout=2.0).stream_info(stream)
        finally:
            await nc.close()
        assert info.cluster is not None and info.cluster.leader is not None, info
        return self.node(info.cluster.leader)

    async def meta_leader(self) -> ClusterNode:
        """The node leading JetStream's meta group (it makes consumers), from `/jsz`."""
        node = next(node for node in self.nodes if node.running)
        assert node.monitor_url is not None
        async with httpx.AsyncClient(timeout=2.0) as client:
            jsz = (await client.get(node.monitor_url + "/jsz")).json()
        return self.node(jsz["meta_cluster"]["leader"])

    async def move_stream_leader(self, stream: str, to: ClusterNode) -> None:
        """Ask the stream's leader to step down in favour of `to`, until `to` leads."""
        nc = await nats.connect(servers=[node.url for node in self.nodes if node.running])
        try:
            request = json.dumps({"placement": {"preferred": to.name}}).encode()

            async def moved() -> bool:
                if (await self.stream_leader(stream)) is to:
                    return True
                with contextlib.suppress(Exception):
                    await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request, 2.0)
                return False

            await eventually(moved, timeout=20, interval=0.5)
        finally:
            await nc.close()

    async def push_consumers(self, stream: str) -> list[tuple[ClusterNode, ClusterNode]]:
        """Per push consumer of `stream`: (node hosting it, node its subscriber is on)."""
        nc = await nats.connect(servers=self.urls)
        try:
            consumers = await nc.jetstream(timeout=2.0).consumers_info(stream)
        finally:
            await nc.close()
        subjects = {node.name: await node.subscribed_subjects() for node in self.nodes}
        placements = []
        for consumer in consumers:
            deliver = consumer.config.deliver_subject
            if consumer.cluster is None or consumer.cluster.leader is None or deliver is None:
                continue
            reader = next((name for name, subs in subjects.items() if deliver in subs), None)
            if reader is not None:  # else a consumer left behind by a gone connection
                placements.append((self.node(consumer.cluster.leader), self.node(reader)))
        return placements


class PartitionableCluster(NatsCluster):
    """A cluster whose nodes reach each other only through proxies that a test can cut.

    Node i dials node j through the proxy `links[i, j]`; a pair is cut when both of its
    links are. Each node advertises a cluster address where nothing listens, so the
    addresses the nodes learn of each other by gossip lead nowhere and a cut cannot be
    bypassed. Cuts reset (connections closed, new ones refused) or are silent (bytes
    stop); `heal()` ends every cut. Make it with `await PartitionableCluster.create(root)`
    and stop it with `await cluster.close()`.
    """

    def __init__(
        self, root: Path, links: dict[tuple[int, int], TcpProxy], ports: list[int], size: int
    ) -> None:
        nowhere = free_port()  # bound by nothing: gossiped routes fail to connect
        self.links = links
        self.nodes = [
            ClusterNode(
                root / f"n{i}",
                f"n{i}",
                ports[i],
                [links[i, j].port for j in range(size) if j != i],
                advertise=False,
                cluster_advertise=nowhere,
            )
            for i in range(size)
        ]

    @classmethod
    async def create(cls, root: Path, size: int = 3) -> PartitionableCluster:
        ports = [free_port() for _ in range(size)]
        links = {
            (i, j): TcpProxy(ports[j], f"n{i}->n{j}")
            for i in range(size)
            for j in range(size)
            if i != j
        }
        for proxy in links.values():
            await proxy.start()
        return cls(root, links, ports, size)

    def _index(self, node: ClusterNode) -> int:
        return self.nodes.index(node)

    def cut(self, a: ClusterNode, b: ClusterNode, *, silent: bool = False) -> None:
        """Cut the pair a–b both ways; each still reaches the others."""
        i, j = self._index(a), self._index(b)
        self.links[i, j].cut(silent=silent)
        self.links[j, i].cut(silent=silent)

    def isolate(self, node: ClusterNode, *, silent: bool = False) -> None:
        """Cut `node` off from every other node (its clients still reach it)."""
        for other in self.nodes:
            if other is not node:
                self.cut(node, other, silent=silent)

    def heal(self) -> None:
        for proxy in self.links.values():
            proxy.heal()

    async def close(self) -> None:
        self.kill()
        for proxy in self.links.values():
            await proxy.stop()


def taskhub_command() -> list[str]:
    script = shutil.which("taskhub")
    return [script] if script else [sys.executable, "-m", "hub.commands.cli"]


class HubProcess:
    """`taskhub serve` as a real child process; its output goes to `data_dir/hub.log`."""

    def __init__(
        self,
        data_dir: Path,
        nats_url: str,
        bucket: str,
        *args: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            "serve",
            *("--port", str(self.port), "--nats-url", nats_url, "--bucket", bucket),
            *("--data-dir", str(data_dir), *args),
        ]
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "hub.log"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_file.open("ab")
        self.process = subprocess.Popen(
            [*taskhub_command(), *self.args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )

    async def ready(self, client: httpx.AsyncClient) -> bool:
        try:
            return (await client.get(self.url + "/readyz", timeout=2.0)).status_code == 200
        except httpx.TransportError:
            return False

    async def wait_ready(self, client: httpx.AsyncClient, timeout: float = 20.0) -> None:
        async def up() -> bool:
            if self.process is None or self.process.poll() is not None:
                raise AssertionError(f"hub exited; see {self.log_file}")
            return await self.ready(client)

        await eventually(up, timeout=timeout, interval=0.05)

    def kill(self) -> None:
        """`kill -9`, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


async def wait_all_ready(
    hubs: list[HubProcess], client: httpx.AsyncClient, timeout: float = 30.0
) -> None:
    async def all_ready() -> bool:
        return all(await asyncio.gather(*(hub.ready(client) for hub in hubs)))

    await eventually(all_ready, timeout=timeout, interval=0.05)
