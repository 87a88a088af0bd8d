"""One bench run's world: a temp dir, a nats-server, and every process it starts.

Everything lives under one temporary directory (NATS store, hub data dirs, one log file
per child) that is removed at the end; every child is stopped by its own PID, servers
and workers alike, even when a scenario fails. Servers are real processes on loopback
ports: `taskhub serve` (as `python -m hub.commands.cli serve`, which is what the console script
runs), the raw ceiling, the origin baseline and the front door's upstream; load
generators and writers are separate processes again, so no two parts of a measurement
share a core by design.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import msgspec
import nats
from nats.aio.client import Client

from bench import profile, protocol
from bench.control import Worker
from bench.peers.setup import PeerSetup
from bench.peers.tree import ProcessTree
from bench.ports import free_port
from bench.processes import Child
from bridge.jetstream import ensure_bucket, ensure_control_stream
from hub.commands.embedded_nats import NatsServerProcess

REPO_ROOT = Path(__file__).resolve().parent.parent
Log = Callable[[str], None]


DEFAULT_SYNC = "2m"  # nats-server's default sync_interval


def bucket_name(scenario: str) -> str:
    """A fresh bucket name per scenario run."""
    return f"bench-{scenario}-{uuid.uuid4().hex[:8]}"


async def server_stats(server: Server) -> dict[str, int]:
    """The origin's (or the front door's upstream's) `/stats`: `POST /mcp` received, ..."""
    status, body = await http_get(server.port, "/stats")
    if status != 200:
        raise RuntimeError(f"{server.name} /stats answered {status}")
    stats: dict[str, int] = msgspec.json.decode(body)
    return stats


class HarnessError(RuntimeError):
    """A process the bench needs did not start or did not become ready."""


async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on a fresh connection; (status, body)."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(protocol.get(port, path))
            responses = protocol.ResponseReader()
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed before a response")
                answers = responses.feed(data)
                if answers:
                    return answers[0]
        finally:
            writer.close()


@dataclass
class Server:
    """A server under test: its process, port, and when it started and became ready."""

    name: str
    child: Child
    port: int
    spawned_at: float
    listening_at: float = 0.0  # first HTTP answer of any status
    ready_at: float = 0.0  # first /readyz 2xx


class Harness:
    def __init__(
        self, log: Log, profile_dir: Path | None = None, *, install_peers: bool = True
    ) -> None:
        self.log = log
        self.profile_dir = profile_dir
        self._profiled: set[str] = set()
        self.root = Path(tempfile.mkdtemp(prefix="taskhub-bench-"))
        # nats-server's own default sync policy, named: an fsync every two minutes. The
        # writes scenario also runs one with "always" (sync_server), taskhub's embedded
        # default and deploy/'s policy.
        self.nats = NatsServerProcess(self.root / "nats", sync=DEFAULT_SYNC)
        self.extra_nats: list[NatsServerProcess] = []
        self.nats_url = ""
        self.nc: Client | None = None
        self.servers: list[Server] = []
        self.workers: list[Worker] = []
        self.trees: list[ProcessTree] = []  # peer servers (nginx, Pushpin) and their children
        self.peers = PeerSetup(log, install_peers)
        self._count = 0
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.env.pop("TASKHUB_NATS_URL", None)  # children get explicit options only
        # Children keep their bytecode, as an installed hub has it (pip compiles at install):
        # under PYTHONDONTWRITEBYTECODE every start would compile the project's modules from
        # an editable install again, ~0.1 s of each cold start that no deployment pays.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    async def __aenter__(self) -> Self:
        self.nats_url = await asyncio.to_thread(self.nats.start)
        self.nc = await nats.connect(self.nats_url)
        self.log(f"nats-server at {self.nats_url}, work dir {self.root}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for worker in self.workers:
                await worker.close()
            for server in self.servers:
                await server.child.stop()
            for tree in self.trees:
                await tree.stop()
            if self.nc is not None and not self.nc.is_closed:
                await self.nc.close()
        finally:
            for nats_server in self.extra_nats:
                await asyncio.to_thread(nats_server.stop)
            await asyncio.to_thread(self.nats.stop)
            shutil.rmtree(self.root, ignore_errors=True)

    def _log_file(self, name: str) -> Path:
        self._count += 1
        return self.root / f"{self._count:03d}-{name}.log"

    async def bucket(self, name: str) -> str:
        """Create a bucket (and the control stream) as the hub and bridge would."""
        assert self.nc is not None
        js = self.nc.jetstream(timeout=10)
        await ensure_bucket(js, name)
        await ensure_control_stream(js)
        return name

    # -- servers under test -------------------------------------------------------------

    async def start_hub(
        self,
        bucket: str,
        *,
        max_streams: int,
        wait: bool = True,
        upstreams: Sequence[str] = (),
        checkpoint: Path | None = None,
        checkpoint_every: float | None = None,
    ) -> Server:
        """`taskhub serve`; each of `upstreams` (`[NAME=]URL`) becomes an `--upstream`."""

        def args(port: int) -> list[str]:
            return [
                "-m", "hub.commands.cli", "serve",
                "--nats-url", self.nats_url,
                "--bucket", bucket,
                "--port", str(port),
                "--data-dir", str(self.root / f"hub-{port}"),
                "--max-streams", str(max_streams),
                "--poll-burst", "0",  # poll pacing off: the bench polls one task many times
                "--log-level", "warning",
                *(arg for upstream in upstreams for arg in ("--upstream", upstream)),
                *(("--checkpoint", str(checkpoint)) if checkpoint is not None else ()),
                *(
                    ("--checkpoint-every", str(checkpoint_every))
                    if checkpoint_every is not None else ()
                ),
            ]  # fmt: skip

        return await self._start_server("hub", args, wait)

    async def start_raw(self, bucket: str) -> Server:
        def args(port: int) -> list[str]:
            return ["-m", "bench.raw_ceiling", *self._watch_args(bucket), "--port", str(port)]

        return await self._start_server("raw", args, True)

    async def start_origin(self, bucket: str) -> Server:
        if importlib.util.find_spec("mcp") is None:
            raise HarnessError("the origin baseline needs the mcp SDK: pip install -e '.[dev]'")

        def args(port: int) -> list[str]:
            return ["-m", "bench.origin", *self._watch_args(bucket), "--port", str(port)]

        return await self._start_server("origin", args, True)

    async def start_upstream(self, *, json_response: bool = False) -> Server:
        """The front door's upstream (bench/upstream.py): an SDK server with an `echo` tool."""
        if importlib.util.find_spec("mcp") is None:
            raise HarnessError(
                "the front door's upstream needs the mcp SDK: pip install -e '.[dev]'"
            )
        mode = ["--json-response"] if json_response else []

        def args(port: int) -> list[str]:
            return ["-m", "bench.upstream", "--port", str(port), *mode]

        return await self._start_server(
            "upstream-json" if json_response else "upstream", args, True
        )

    async def start_own_store(self, *, poll_interval_ms: int) -> Server:
        """`examples/own_store` with the bench's pacing of its tasks (bench/own_store_upstream.py):
        a poll-only upstream that keeps its tasks and writes nothing to NATS."""

        def args(port: int) -> list[str]:
            return [
                "-m", "bench.own_store_upstream",
                "--port", str(port),
                "--poll-interval-ms", str(poll_interval_ms),
            ]  # fmt: skip

        return await self._start_server("own-store", args, True)

    async def start_module(self, name: str, module: str) -> Server:
        """`python -m <module> --port N`, ready at its first `/readyz` 200 (a peer's helper)."""

        def args(port: int) -> list[str]:
            return ["-m", module, "--port", str(port)]

        return await self._start_server(name, args, True)

    def _watch_args(self, bucket: str) -> list[str]:
        return ["--nats-url", self.nats_url, "--bucket", bucket]

    async def _start_server(
        self, name: str, args: Callable[[int], list[str]], wait: bool, attempts: int = 3
    ) -> Server:
        """Start a server on a free port; another port if that one was taken meanwhile."""
        for attempt in range(attempts):
            port = free_port()
            spawned = time.perf_counter()
            child = await Child.start(
                name,
                [sys.executable, *args(port)],
                self._log_file(name),
                cwd=REPO_ROOT,
                env=self.env,
            )
            server = Server(name, child, port, spawned)
            self.servers.append(server)
            if not wait:
                return server
            try:
                await self.wait_ready(server)
                return server
            except HarnessError:
                lost_race = "address already in use" in child.log_tail().lower()
                await self.stop(server)
                if not lost_race or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    async def wait_ready(self, server: Server, timeout: float = 120.0) -> None:
        """Poll /readyz until 2xx (own_store answers 204); note when the port first
        answered at all."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if not server.child.alive:
                raise HarnessError(f"{server.name} exited:\n{server.child.log_tail()}")
            try:
                status, _ = await http_get(server.port, "/readyz", timeout=2.0)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.005)
                continue
            now = time.perf_counter()
            server.listening_at = server.listening_at or now
            if 200 <= status < 300:
                server.ready_at = now
                return
            await asyncio.sleep(0.005)
        raise HarnessError(f"{server.name} not ready in {timeout}s:\n{server.child.log_tail()}")

    async def stop(self, server: Server, grace: float = 10.0) -> None:
        await server.child.stop(grace)
        if server in self.servers:
            self.servers.remove(server)

    # -- profiles -----------------------------------------------------------------------

    async def record(self, server: Server, label: str, seconds: float) -> profile.Recording | None:
        """Sample the hub for `seconds` with py-spy, once per label, if --profile asked."""
        if self.profile_dir is None or server.name != "hub" or label in self._profiled:
            return None
        if not profile.available():
            self.log("--profile: py-spy is not installed (pip install py-spy); not profiling")
            self.profile_dir = None
            return None
        self._profiled.add(label)
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        output = self.profile_dir / f"{label}.txt"
        return await profile.Recording.start(server.child.pid, output, seconds, self.env)

    async def report_profile(self, recording: profile.Recording | None, now: bool = False) -> None:
        """Summarise a recording once py-spy has written it (`now`: stop it first)."""
        if recording is not None:
            summary = await recording.finish(now=now)
            head = "\n".join(summary.splitlines()[:14])
            self.log(f"profile {recording.output.stem} ({recording.output}):\n{head}")

    # -- workers ------------------------------------------------------------------------

    async def loadgen(self) -> Worker:
        return await self._worker("loadgen", ["-m", "bench.loadgen"])

    async def writer(self, bucket: str, nats_url: str | None = None) -> Worker:
        url = nats_url or self.nats_url
        args = ["-m", "bench.writer", "--nats-url", url, "--bucket", bucket]
        return await self._worker("writer", args)

    async def sync_server(self, sync: str) -> NatsServerProcess:
        """Another nats-server (stopped with the harness) with JetStream's `sync_interval`."""
        server = NatsServerProcess(self.root / f"nats-sync-{len(self.extra_nats)}", sync=sync)
        self.extra_nats.append(server)
        url = await asyncio.to_thread(server.start)
        self.log(f"nats-server (sync_interval {sync}) at {url}")
        return server

    async def worker(self, name: str, args: list[str]) -> Worker:
        """Any worker module, e.g. `["-m", "bench.peers.publisher", "--kind", "nchan"]`."""
        return await self._worker(name, args)

    async def _worker(self, name: str, args: list[str]) -> Worker:
        worker = await Worker.start(name, args, self._log_file(name), REPO_ROOT, self.env)
        self.workers.append(worker)
        return worker

    async def close_worker(self, worker: Worker) -> None:
        await worker.close()
        if worker in self.workers:
            self.workers.remove(worker)
