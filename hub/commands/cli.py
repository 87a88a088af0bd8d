"""`taskhub serve`: run the hub, with an embedded nats-server unless given a NATS URL.

Shutdown order matters for clients: on SIGTERM or Ctrl-C the hub first ends every
listen stream with its completion result (H63), while uvicorn stops accepting; then
NATS is drained and the embedded server stopped; the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

import uvicorn

from hub.app import create_app
from hub.commands.embedded_nats import NatsServerError, NatsServerProcess
from hub.commands.workers import run_workers
from hub.config import Config, add_serve_options, config_from_namespace
from hub.http.connection import hub_protocol
from hub.runtime import Hub

log = logging.getLogger("taskhub")
# Young-generation collections every 5,000 allocations instead of 700 (bench/: fewer,
# still sub-millisecond pauses); older generations as often as before relative to it.
GC_THRESHOLDS = (5000, 20, 100)


class HubServer(uvicorn.Server):
    """uvicorn, but a shutdown signal first tells every listen stream goodbye."""

    _stop_asked: asyncio.Event | None = None  # `should_exit` set: main_loop wakes at once

    def __init__(self, config: uvicorn.Config, hub: Hub) -> None:
        super().__init__(config)
        self.hub = hub
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tune_gc: asyncio.Task[None] | None = None

    @property  # uvicorn's is a plain attribute
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._stop_asked is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop_asked.set)  # from a signal, too

    async def main_loop(self) -> None:
        """uvicorn's, woken once a second for its date header or at once by a stop, not
        every 100 ms: an idle hub woke ten times a second for nothing, each a loop pass
        and a cold start of the code it ran."""
        self._stop_asked = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # every tick is on_tick's once-a-second one
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._stop_asked.wait()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            await super().serve(sockets)
        finally:
            if self._tune_gc is not None:
                self._tune_gc.cancel()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._tune_gc = asyncio.create_task(self._freeze_when_caught_up())

    async def _freeze_when_caught_up(self) -> None:
        """Long-lived objects (the snapshot, the app) leave the collector's scans.

        With thousands of streams and tasks, every full collection walks them all: tens
        of milliseconds of stalled delivery. Once the snapshot has caught up, freeze what
        exists, and collect the young generation less often (each request and frame
        allocates a few dozen short-lived objects).
        """
        await self.hub.source.wait_caught_up()
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        log.debug("garbage collector tuned: %d objects frozen", gc.get_freeze_count())

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, minus re-raising the signal at the end: a clean stop exits 0."""
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.loop is not None:
            # Signal handlers may interrupt the loop anywhere; hand over safely.
            self.loop.call_soon_threadsafe(self.hub.begin_shutdown)
        super().handle_exit(sig, frame)


# Makes the uvicorn server around a hub; `taskhub demo` passes a subclass that runs its fleet.
ServerFactory = Callable[[uvicorn.Config, Hub], HubServer]


def build_server(config: Config, nats_url: str, factory: ServerFactory = HubServer) -> HubServer:
    hub = Hub(config, nats_url)
    app = create_app(config, nats_url, hub)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(config.shutdown_grace) + 1,
        http=hub_protocol(config.header_timeout, app.answer_now, config.head_limits),
        proxy_headers=False,  # nothing reads the client address; skip the middleware
        # Beyond the stream limit, plain requests still get room before uvicorn's 503.
        limit_concurrency=config.max_streams + 1024,
    )
    return factory(uv_config, hub)


def run_server(
    config: Config,
    nats_url: str,
    sock: socket.socket | None = None,
    factory: ServerFactory = HubServer,
) -> int:
    """One hub process until a signal stops it; 0 after a clean stop."""
    server = build_server(config, nats_url, factory)
    server.run(sockets=None if sock is None else [sock])
    # uvicorn returns without `started` when the lifespan start-up failed.
    return 0 if server.started else 1


def configure_logging(config: Config) -> None:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx2 (the demo fleet's and `taskhub tail`'s client) logs every request at INFO.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, logging.getLogger().level))


def serve(config: Config) -> int:
    configure_logging(config)
    if not config.auth_enabled:
        where = "" if config.is_loopback else f" on non-loopback {config.host} (--insecure-no-auth)"
        log.warning("authentication is off%s: every caller is principal 'anonymous'", where)
    embedded: NatsServerProcess | None = None
    nats_url = config.nats_url
    if nats_url is None:
        # Monitoring on loopback, so the hub reads the sync policy as it would elsewhere.
        embedded = NatsServerProcess(config.data_dir / "nats", sync=config.nats_sync, monitor=True)
        try:
            nats_url = embedded.start()
        except NatsServerError as exc:
            log.error("%s", exc)
            return 1
        config = dataclasses.replace(config, nats_monitor_url=embedded.monitor_url)
        # Where servers on this machine find the embedded NATS (README quick start).
        (embedded.data_dir / "url").write_text(nats_url + "\n")
        log.info(
            "embedded nats-server at %s (sync_interval %s, log %s)",
            nats_url,
            config.nats_sync,
            embedded.log_file,
        )
    try:
        if config.workers > 1:
            return run_workers(config, nats_url)
        return run_server(config, nats_url)
    finally:
        if embedded is not None:
            embedded.stop()


def main(argv: Sequence[str] | None = None) -> int:
    from hub.commands import demo
    from hub.operators import tail

    parser = argparse.ArgumentParser(prog="taskhub", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the hub")
    add_serve_options(serve_parser, os.environ)
    tail_parser = commands.add_parser(
        "tail",
        help="follow tasks live in a terminal",
        description="Follow a hub's operator stream: a live table on a terminal, a line per "
        "change on a pipe, JSON lines with --json (docs/dashboard.md).",
    )
    tail.add_tail_options(tail_parser, os.environ)
    demo_parser = commands.add_parser(
        "demo",
        help="a hub with a simulated fleet, for a first look",
        description="Run an embedded NATS, an open hub on loopback and a simulated fleet of "
        "three servers, until Ctrl-C (docs/dashboard.md).",
    )
    demo.add_demo_options(demo_parser)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(config_from_namespace(args, serve_parser))
    if args.command == "tail":
        return tail.tail(tail.options_from_namespace(args))
    if args.command == "demo":
        return demo.demo(demo.config_for(args, demo_parser), args.data_dir)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
