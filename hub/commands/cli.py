"""`taskhub serve`, `taskhub tail` and `taskhub demo`: the command line.

`serve` runs the hub (hub/commands/server.py), with an embedded nats-server unless given a
NATS URL, in one process or `--workers N`; on SIGTERM or Ctrl-C it ends every listen stream
with its completion result (H63), then stops the embedded server and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

from hub.commands import demo
from hub.commands.embedded_nats import NatsServerError, NatsServerProcess
from hub.commands.server import configure_logging, run_server
from hub.commands.workers import run_workers
from hub.config import Config
from hub.operators import tail
from hub.options import add_serve_options, config_from_namespace

log = logging.getLogger("taskhub")


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
    demo.add_demo_options(demo_parser, os.environ)
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
