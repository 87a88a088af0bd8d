"""The hub's server: uvicorn around one hub process, built and run until a signal stops it.

Shutdown order matters for clients: on SIGTERM or Ctrl-C the hub first ends every
listen stream with its completion result (H63), while uvicorn stops accepting; then the
caller (`taskhub serve`, a worker, `taskhub demo`) drains NATS and stops what it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from hub.app import create_app
from hub.config import Config
from hub.http.connection import hub_protocol
from hub.runtime import Hub

log = logging.getLogger("taskhub")
# Young-generation collections every 5,000 allocations, not CPython's 700, and the older
# generations' every 20 and 100 collections below, not 10 and 10: fewer pauses, each short.
GC_THRESHOLDS = (5000, 20, 100)


class HubServer(uvicorn.Server):
    """uvicorn, but a shutdown signal first tells every listen stream goodbye.

    What it replaces of `uvicorn.Server` is not documented API: tests/test_uvicorn_internals.py
    pins the uvicorn code it was verified against."""

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
        every 100 ms as uvicorn's is: on an idle hub each of those wake-ups is a loop pass
        and a cold start of the code it runs, for nothing
        (docs/scaling.md#costs-the-code-is-shaped-by)."""
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

        With thousands of streams and tasks, every full collection walks them all, and
        delivery stalls meanwhile. Once the snapshot has caught up, freeze what
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
