"""`taskhub demo`: a first look in one command. An embedded NATS, an open hub on loopback and
a simulated fleet (hub/commands/demo_fleet.py) in this process, until SIGTERM or Ctrl-C.

The hub is `taskhub serve`'s own server (hub.cli `run_server`), subclassed only to own the
fleet: it starts once the hub listens and stops first on a signal, because it is a client
of the hub; then the hub stops as `serve` does (streams told goodbye), then NATS. A
temporary store is removed at exit; `--data-dir` keeps it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import shutil
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import uvicorn

from hub.commands.demo_fleet import SERVERS, Fleet, Pace
from hub.commands.embedded_nats import NatsServerError, NatsServerProcess
from hub.commands.server import HubServer, configure_logging, run_server
from hub.config import Config
from hub.options import add_option
from hub.runtime import Hub
from hub.settings import SYNC_ALWAYS

log = logging.getLogger("taskhub.demo")
FLEET_STOP_S = 5.0  # its bridges give an in-flight control message this long, at most
SHUTDOWN_GRACE_S = 2.0  # open streams get this long to say goodbye: a demo stops briskly
# Below the fleet's silence (40 s), so its silent server is flagged for its missing writes too.
SILENT_AFTER_S = 15.0


class DemoServer(HubServer):
    """The hub's server, plus the fleet's one owner: started after start-up, stopped
    before shutdown."""

    def __init__(
        self, config: uvicorn.Config, hub: Hub, *, nats_url: str, pace: Pace | None = None
    ) -> None:
        super().__init__(config, hub)
        self.nats_url, self.pace = nats_url, pace
        self.fleet: asyncio.Task[None] | None = None
        self._stopper: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        url = f"http://{host}:{port}"
        fleet = Fleet(self.nats_url, url, self.hub.config.bucket, self.pace)
        self.fleet = asyncio.create_task(fleet.run(), name="demo-fleet")
        self.fleet.add_done_callback(_report_failure)
        print(banner(url), flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.loop is None or self._stopper is not None or self.fleet is None:
            super().handle_exit(sig, frame)  # a second signal: on with the hub's own stop
            return
        self.loop.call_soon_threadsafe(self._begin_stop, sig, frame)

    def _begin_stop(self, sig: int, frame: FrameType | None) -> None:
        if self._stopper is None:
            self._stopper = asyncio.create_task(self._stop_fleet_then_hub(sig, frame))

    async def _stop_fleet_then_hub(self, sig: int, frame: FrameType | None) -> None:
        await self.stop_fleet()
        super().handle_exit(sig, frame)

    async def stop_fleet(self) -> None:
        """Cancel the fleet and wait for it (bounded); idempotent."""
        if self.fleet is None or self.fleet.done():
            return
        self.fleet.cancel()
        await asyncio.wait({self.fleet}, timeout=FLEET_STOP_S)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.stop_fleet()  # also when uvicorn stops for a reason of its own
        await super().shutdown(sockets)


def _report_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the demo fleet stopped: %r", task.exception())


def banner(url: str) -> str:
    return "\n".join(
        [
            f"taskhub demo: an open hub with a simulated fleet ({', '.join(SERVERS)})",
            f"  dashboard:  {url}/",
            f"  terminal:   taskhub tail --url {url}",
            "  Ctrl-C stops it.",
        ]
    )


def add_demo_options(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_option(parser, env, "port", int, 8080, "port")
    add_option(parser, env, "host", str, "127.0.0.1", "loopback address to bind")
    add_option(
        parser, env, "data-dir", Path, None, "keep the NATS store here (default: a temporary one)"
    )


def config_for(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    config = Config(
        host=args.host,
        port=args.port,
        log_level="warning",
        shutdown_grace=SHUTDOWN_GRACE_S,
        silent_after=SILENT_AFTER_S,
    )
    if not config.is_loopback:
        parser.error(f"the demo hub is open to anyone: bind a loopback address, not {args.host}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not a TCP port")
    return config


def demo(config: Config, data_dir: Path | None, pace: Pace | None = None) -> int:
    configure_logging(config)
    root = data_dir if data_dir is not None else Path(tempfile.mkdtemp(prefix="taskhub-demo-"))
    try:
        # fsync before every ack, as `serve` by default: the demo's pace does not need less.
        embedded = NatsServerProcess(root / "nats", sync=SYNC_ALWAYS, monitor=True)
        try:
            nats_url = embedded.start()
        except NatsServerError as exc:
            log.error("%s", exc)
            return 1
        try:
            config = dataclasses.replace(
                config, nats_url=nats_url, nats_monitor_url=embedded.monitor_url, data_dir=root
            )
            factory = functools.partial(DemoServer, nats_url=nats_url, pace=pace)
            return run_server(config, nats_url, factory=factory)
        finally:
            embedded.stop()
    finally:
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
