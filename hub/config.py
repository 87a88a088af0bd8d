"""The hub's one configuration object, built from CLI flags and `TASKHUB_*` variables.

Every option reads `TASKHUB_<NAME>` (upper case, `-` → `_`) as its default, so the
same hub runs from a shell, a container or a unit file. Nothing else reads the
environment.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.wire import DEFAULT_BUCKET

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    nats_url: str | None = None
    bucket: str = DEFAULT_BUCKET
    replicas: int = 1
    data_dir: Path = Path(".taskhub")
    keepalive: float = 15.0
    log_level: str = "info"
    insecure_no_auth: bool = False
    # Hub processes sharing the port, each with its own NATS watch.
    workers: int = 1
    # Larger request bodies get 413 before they are parsed.
    max_body_bytes: int = 1 << 20
    # Listen streams whose client has not read for this long are closed (dead peers).
    send_timeout: float = 30.0
    # Grace given to listen streams to say goodbye on shutdown.
    shutdown_grace: float = 5.0
    # How often expired tasks are swept from memory (reads check expiry themselves).
    expiry_sweep_interval: float = 1.0

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text} is not a boolean")


def add_serve_options(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Declare the `serve` options; each default comes from `TASKHUB_<NAME>` if set."""
    defaults = Config()

    def option(
        name: str, help: str, type: Callable[[str], Any] = str, default: object = None
    ) -> None:
        env_name = "TASKHUB_" + name.upper().replace("-", "_")
        if env_name in env:
            default = env[env_name]  # argparse applies `type` to string defaults
        parser.add_argument(
            f"--{name}", type=type, default=default, help=f"{help} [env {env_name}]"
        )

    option("host", f"address to bind (default {defaults.host})", default=defaults.host)
    option("port", f"port to bind (default {defaults.port})", _port, defaults.port)
    option("nats-url", "NATS server URL; without it an embedded nats-server is started")
    option(
        "bucket", f"KV bucket of task states (default {defaults.bucket})", default=defaults.bucket
    )
    option(
        "replicas",
        "replicas for the bucket and control stream when created (default 1)",
        _positive_int,
        defaults.replicas,
    )
    option(
        "data-dir",
        "embedded NATS store and log directory (default ./.taskhub)",
        Path,
        defaults.data_dir,
    )
    option(
        "keepalive",
        "seconds between SSE keep-alive comments (default 15)",
        _positive_float,
        defaults.keepalive,
    )
    option("log-level", "log level (default info)", str.lower, defaults.log_level)
    option("workers", "hub processes sharing the port, each with its own NATS watch (default 1)",
           _positive_int, defaults.workers)  # fmt: skip
    env_name = "TASKHUB_INSECURE_NO_AUTH"
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=_flag(env.get(env_name, "")),
        help=f"allow binding a non-loopback address without authentication [env {env_name}]",
    )


def config_from_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Parse `serve` options (tests pass argv and env; the CLI passes neither)."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="taskhub serve")
    add_serve_options(parser, env)
    return config_from_namespace(parser.parse_args(argv), parser)


def config_from_namespace(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> Config:
    if ns.log_level not in LOG_LEVELS:
        parser.error(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    config = Config(
        host=ns.host,
        port=ns.port,
        nats_url=ns.nats_url or None,
        bucket=ns.bucket,
        replicas=ns.replicas,
        data_dir=Path(ns.data_dir),
        keepalive=ns.keepalive,
        log_level=ns.log_level,
        insecure_no_auth=ns.insecure_no_auth,
        workers=ns.workers,
    )
    if not config.is_loopback and not config.insecure_no_auth:
        parser.error(
            f"refusing to bind {config.host} without authentication; "
            "bind a loopback address or pass --insecure-no-auth"
        )
    return config
