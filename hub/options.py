"""The hub's options as flags and `TASKHUB_*` variables, read into a `Config`.

Every option `--some-name` fills the field `some_name` of `hub.config.Config` and reads
`TASKHUB_SOME_NAME` as its default, so the same hub runs from a shell, a container or a
unit file. `add_option` is how every command (serve, demo, tail) declares one. Nothing
else reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bridge.events import DEFAULT_SERVICE
from bridge.wire import SERVICE_RE
from hub.config import LOG_LEVELS, Config
from hub.settings import (
    Network,
    UpstreamSpec,
    host_name,
    load_resource_rule,
    normalize_origin,
    parse_operator_claim,
    parse_sync,
    parse_trusted_proxies,
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number")
    return value


def _origins(text: str) -> tuple[str, ...]:
    try:
        return tuple(normalize_origin(item) for item in text.split(",") if item.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_names(text: str) -> tuple[str, ...]:
    names = tuple(item.strip().lower() for item in text.split(",") if item.strip())
    for name in names:
        if host_name(name) != name:
            raise argparse.ArgumentTypeError(f"{name!r} is not a host name (give no port)")
    return names


def _networks(text: str) -> tuple[Network, ...]:
    try:
        return parse_trusted_proxies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_upstreams(text: str) -> tuple[UpstreamSpec, ...]:
    """`[NAME=]URL[,[NAME=]URL...]`: a bare URL is served at /mcp, NAME=URL at
    /servers/NAME/mcp."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name: str | None = None
        head, sep, rest = item.partition("=")
        if sep and "/" not in head and ":" not in head:
            if not SERVICE_RE.fullmatch(head) or head == DEFAULT_SERVICE:
                raise argparse.ArgumentTypeError(
                    f"upstream name {head!r}: 1-64 letters, digits, '_' and '-' "
                    f"(not {DEFAULT_SERVICE!r}, the bare upstream's service)"
                )
            name, item = head, rest
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise argparse.ArgumentTypeError(f"upstream URL {item!r} is not an http(s) URL")
        specs.append(UpstreamSpec(name, item))
    return tuple(specs)


def _check_upstreams(specs: Sequence[UpstreamSpec]) -> str | None:
    """Why these upstreams cannot be served together, or None."""
    paths = [spec.path for spec in specs]
    for path in paths:
        if paths.count(path) > 1:
            return f"--upstream: two upstreams would be served at {path}"
    return None


def _sync(text: str) -> str:
    try:
        return parse_sync(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _http_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL")
    return text.rstrip("/")


def _operator_claim(text: str) -> str:
    try:
        parse_operator_claim(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text} is not a boolean")


# (flag, type, help); the default is the Config field's.
_OPTIONS: list[tuple[str, Callable[[str], Any], str]] = [
    ("host", str, "address to bind"),
    ("port", _port, "port to bind"),
    ("nats-url", str, "NATS URL(s), comma-separated; none = run an embedded nats-server"),
    ("bucket", str, "KV bucket of task states"),
    ("replicas", _positive_int, "replicas for the bucket and control stream when created"),
    ("data-dir", Path, "embedded NATS: store, log and URL file under <dir>/nats"),
    (
        "checkpoint",
        Path,
        "file the snapshot is saved to while running and at shutdown and read from at "
        "start, so a restart reads from NATS only what changed since",
    ),
    (
        "checkpoint-every",
        _non_negative_float,
        "seconds between checkpoints while running (0: only at shutdown); at least 20 times "
        "as long as the last one took",
    ),
    (
        "nats-sync",
        _sync,
        "embedded NATS: JetStream sync_interval, `always` (fsync before every ack) or a "
        "duration such as `2m` (an acknowledged write may be lost to a power cut until then)",
    ),
    (
        "nats-monitor-url",
        _http_url,
        "external NATS: monitoring URL (`http://host:8222`) whose /varz shows the sync policy",
    ),
    ("keepalive", _positive_float, "seconds between SSE keep-alive comments"),
    ("log-level", str.lower, "debug, info, warning, error or critical"),
    ("workers", _positive_int, "hub processes sharing the port, each with its own watch"),
    ("jwt-secret", str, "HS256 secret (32+ bytes): turns on bearer auth"),
    ("jwt-public-key-file", Path, "RS256/ES256 public key (PEM) or JWKS file: bearer auth"),
    ("jwt-issuer", str, "required `iss` of tokens"),
    ("jwt-audience", str, "required `aud` of tokens"),
    ("jwt-leeway", _positive_float, "clock leeway in seconds for exp/nbf"),
    (
        "operator-claim",
        _operator_claim,
        "CLAIM=VALUE a token carries to see every task on the operator stream",
    ),
    (
        "silent-after",
        _positive_float,
        "seconds without a write after which a server with active tasks is called silent",
    ),
    ("public-url", str, "the hub's URL as browsers see it (cookie same-origin rule)"),
    ("allowed-origin", _origins, "comma-separated origins allowed to call the hub"),
    ("cors-origin", _origins, "comma-separated origins that get CORS access"),
    (
        "allowed-host",
        _host_names,
        "comma-separated Host names an open hub answers besides addresses, localhost and "
        "the public URL's host (DNS rebinding: others get 421, 403 at the legacy door)",
    ),
    (
        "max-head-bytes",
        _positive_int,
        "a request head larger than this gets 431 and the connection closes",
    ),
    ("max-field-bytes", _positive_int, "a larger header field (name and value) gets 431"),
    ("max-fields", _positive_int, "more header fields in one request get 431"),
    ("max-target-bytes", _positive_int, "a longer request target (path and query) gets 414"),
    ("max-body-bytes", _positive_int, "larger request bodies get 413"),
    ("max-task-ids", _positive_int, "taskIds per subscriptions/listen"),
    ("max-streams", _positive_int, "open listen and operator streams in total"),
    (
        "max-streams-per-principal",
        _positive_int,
        "open listen and operator streams per caller (auth on)",
    ),
    ("poll-burst", _non_negative_int, "tasks/get burst per caller and task (0 = no limit)"),
    ("default-poll-interval", _positive_float, "poll pacing (s) for tasks without one"),
    (
        "header-timeout",
        _positive_float,
        "seconds a client may take to send a request head, from connecting or the last response",
    ),
    ("body-timeout", _positive_float, "seconds a client may take to send a request body"),
    (
        "update-wait",
        _non_negative_float,
        "seconds tasks/update waits for the owning server to take the answers, so the "
        "caller's next tasks/get shows them (0 = ack once stored)",
    ),
    (
        "upstream-timeout",
        _positive_float,
        "seconds an upstream may take to connect and answer (an SSE answer: to start)",
    ),
    (
        "max-forwards-per-caller",
        _positive_int,
        "requests one caller (principal, or client address without auth) may have in flight "
        "through the front door; more get 429",
    ),
    (
        "max-upstream-buffer-bytes",
        _positive_int,
        "bytes of upstream answers the hub holds at once, over all requests; past it 503",
    ),
    (
        "upstream-task-retention",
        _positive_float,
        "seconds an upstream's own task is kept after it was last observed, unless its "
        "TTL ends sooner",
    ),
    (
        "max-upstream-tasks",
        _positive_int,
        "upstream-kept tasks the hub remembers; past it the least recently observed goes",
    ),
    (
        "trusted-proxy",
        _networks,
        "comma-separated addresses or networks of proxies in front of the hub, whose "
        "X-Forwarded-*, Forwarded and X-Real-IP are kept (from anyone else they are replaced)",
    ),
    (
        "send-timeout",
        _positive_float,
        "seconds a listen stream may stay blocked on a write before it is dropped",
    ),
    (
        "resource-rule",
        str,
        "MODULE:NAME of a callable (principal, service, uri) -> bool: who may follow which "
        "resource URIs (default: everyone)",
    ),
    ("nats-ping-interval", _positive_float, "seconds between PINGs to the NATS server"),
    (
        "nats-max-pings",
        _positive_int,
        "unanswered PINGs after which the NATS connection counts as lost (/readyz 503)",
    ),
    ("nats-user", str, "NATS user"),
    ("nats-password", str, "NATS password"),
    ("nats-token", str, "NATS token"),
    ("nats-nkey-seed", Path, "NATS NKey seed file"),
    ("nats-creds", Path, "NATS .creds file"),
    ("nats-tls-ca", Path, "CA file to verify the NATS server"),
    ("nats-tls-cert", Path, "client certificate for NATS"),
    ("nats-tls-key", Path, "client key for NATS"),
]
_FIELD = {
    "allowed-origin": "allowed_origins",
    "cors-origin": "cors_origins",
    "allowed-host": "allowed_hosts",
    "trusted-proxy": "trusted_proxies",
}


def _field(flag: str) -> str:
    return _FIELD.get(flag, flag.replace("-", "_"))


def add_option(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    flag: str,
    kind: Callable[[str], Any],
    default: Any,
    help: str,
    dest: str | None = None,
) -> None:
    """Declare `--flag`, whose default comes from `TASKHUB_<FLAG>` if set: how every
    command (serve, demo, tail) reads its options."""
    env_name = "TASKHUB_" + flag.upper().replace("-", "_")
    if env_name in env:
        default = env[env_name]  # argparse applies `type` to string defaults
    secret = any(word in flag for word in ("secret", "password", "token"))
    shown = "" if default in (None, ()) or secret else default
    parser.add_argument(
        f"--{flag}",
        dest=dest or flag.replace("-", "_"),
        type=kind,
        default=default,
        help=f"{help}{f' (default {shown})' if shown != '' else ''} [env {env_name}]",
    )


def add_serve_options(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Declare the `serve` options; each default comes from `TASKHUB_<NAME>` if set."""
    defaults = Config()
    for flag, kind, help in _OPTIONS:
        default = getattr(defaults, _field(flag))
        add_option(parser, env, flag, kind, default, help, dest=_field(flag))
    env_name = "TASKHUB_UPSTREAM"
    parser.add_argument(
        "--upstream",
        dest="upstreams",
        type=parse_upstreams,
        action="append",
        default=None,
        metavar="[NAME=]URL",
        help="an MCP server to be the front door of: URL at /mcp, NAME=URL at "
        f"/servers/NAME/mcp; repeatable, or comma-separated [env {env_name}]",
    )
    parser.set_defaults(upstream_env=env.get(env_name, ""))
    env_name = "TASKHUB_PUBLIC_METRICS"
    parser.add_argument(
        "--public-metrics",
        action="store_true",
        default=_flag(env.get(env_name, "")),
        help="serve /metrics without a token when authentication is on (for a scraper on "
        f"a private network; otherwise it needs a token with the operator claim) [env {env_name}]",
    )
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
    values = {
        f.name: getattr(ns, f.name) for f in dataclasses.fields(Config) if hasattr(ns, f.name)
    }
    values = {k: (None if v == "" else v) for k, v in values.items()}
    try:  # flags replace the environment's list; each flag may itself list several
        upstreams = values.pop("upstreams", None)
        if upstreams is None:
            upstreams = [parse_upstreams(getattr(ns, "upstream_env", "") or "")]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"TASKHUB_UPSTREAM: {exc}")
    values["upstreams"] = tuple(spec for group in upstreams for spec in group)
    problem = _check_upstreams(values["upstreams"])
    if problem is not None:
        parser.error(problem)
    try:
        load_resource_rule(values.get("resource_rule"))
    except ValueError as exc:
        parser.error(f"--resource-rule: {exc}")
    if values.get("log_level") not in LOG_LEVELS:
        parser.error(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    config = Config(**values)
    if config.public_url is not None:
        try:
            normalize_origin(config.public_url)
        except ValueError as exc:
            parser.error(f"--public-url: {exc}")
    if config.checkpoint is not None:
        if config.checkpoint.is_dir():
            parser.error(f"--checkpoint: {config.checkpoint} is a directory, not a file")
        if not config.checkpoint.absolute().parent.is_dir():
            parser.error(f"--checkpoint: directory {config.checkpoint.parent} does not exist")
    if (config.jwt_issuer or config.jwt_audience) and not config.auth_enabled:
        parser.error("--jwt-issuer/--jwt-audience need --jwt-secret or --jwt-public-key-file")
    if not config.is_loopback and not config.auth_enabled and not config.insecure_no_auth:
        parser.error(
            f"refusing to bind {config.host} without authentication; configure --jwt-secret "
            "or --jwt-public-key-file, bind a loopback address, or pass --insecure-no-auth"
        )
    return config
