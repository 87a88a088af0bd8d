"""`--workers N`: N hub processes share one listening socket, each with its own NATS watch.

The parent binds the port, starts the workers (spawned, so each builds its own event
loop, cache and NATS connection), restarts one that dies, and on SIGTERM/SIGINT passes
the signal on so every worker closes its listen streams gracefully before exiting.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.process import BaseProcess
from types import FrameType

from hub.commands.embedded_nats import die_with_parent
from hub.config import Config

log = logging.getLogger("taskhub.workers")

RESTART_BACKOFF_S = 1.0


def _worker(config: Config, nats_url: str, sock: socket.socket) -> None:
    die_with_parent()
    from hub.commands.server import configure_logging, run_server  # the child's own imports

    configure_logging(config)
    raise SystemExit(run_server(config, nats_url, sock))


def run_workers(config: Config, nats_url: str) -> int:
    sock = socket.create_server((config.host, config.port), reuse_port=False, backlog=2048)
    sock.set_inheritable(True)
    context = multiprocessing.get_context("spawn")
    stopping = False

    def start() -> BaseProcess:
        process = context.Process(target=_worker, args=(config, nats_url, sock), daemon=False)
        process.start()
        return process

    def on_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    workers = [start() for _ in range(config.workers)]
    log.info("started %d hub workers on %s:%d", len(workers), config.host, config.port)
    try:
        while not stopping:
            for index, process in enumerate(workers):
                if not process.is_alive() and not stopping:
                    log.error("worker %s exited with %s; restarting", process.pid, process.exitcode)
                    time.sleep(RESTART_BACKOFF_S)
                    workers[index] = start()
            time.sleep(0.2)
        for process in workers:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)  # each closes its streams gracefully
        for process in workers:
            process.join(config.shutdown_grace + 10)
        # A worker stopped by our SIGTERM before it could install its handlers is fine too.
        clean = (0, -signal.SIGTERM)
        return 0 if all(p.exitcode in clean for p in workers) else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
