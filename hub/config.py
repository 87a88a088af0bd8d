"""The hub's one configuration object: every option's value, default and meaning.

hub/options.py reads it from flags and `TASKHUB_*` variables (`--some-name` fills the
field `some_name`); the fields' defaults are the options' defaults.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bridge.wire import DEFAULT_BUCKET
from hub.settings import (
    SYNC_ALWAYS,
    AuthSettings,
    HeadLimits,
    Network,
    UpstreamSpec,
    normalize_origin,
    parse_operator_claim,
    rest_for,
)

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    nats_url: str | None = None
    bucket: str = DEFAULT_BUCKET
    replicas: int = 1
    data_dir: Path = Path(".taskhub")
    # The snapshot kept here across restarts (hub/store/checkpoint_file.py); None = read the bucket.
    checkpoint: Path | None = None
    # ... written this often while running too (0: only at shutdown), and no more often
    # than 20 times as long as the last write took.
    checkpoint_every: float = 60.0
    # Embedded NATS: JetStream's sync_interval ("always" = fsync before every ack).
    nats_sync: str = SYNC_ALWAYS
    # An external NATS server's monitoring endpoint, whose /varz shows its sync policy.
    nats_monitor_url: str | None = None
    keepalive: float = 15.0
    log_level: str = "info"
    workers: int = 1
    insecure_no_auth: bool = False
    # Authentication (H5); no key = open hub, principal "anonymous".
    jwt_secret: str | None = None
    jwt_public_key_file: Path | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_leeway: float = 30.0
    # Who sees every task on the operator stream (docs/dashboard.md): CLAIM=VALUE.
    operator_claim: str = "scope=taskhub:operator"
    # With authentication on, /metrics needs an operator's token unless this is set.
    public_metrics: bool = False
    # The operator stream calls a server silent after this long without a write.
    silent_after: float = 60.0
    # Browsers: the hub's own origin (cookie CSRF rule) and the origins allowed to call it.
    public_url: str | None = None
    allowed_origins: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    # An open hub answers only these `Host` names besides addresses, localhost, the
    # public URL's host and the bound host (hub/http/hosts.py).
    allowed_hosts: tuple[str, ...] = ()
    # Limits (invariants 4 and 5). A request head (hub/http/head_limits.py): past a limit 414
    # or 431, and the connection closes.
    max_head_bytes: int = 32 * 1024
    max_field_bytes: int = 8 * 1024
    max_fields: int = 100
    max_target_bytes: int = 8 * 1024
    max_body_bytes: int = 1 << 20
    max_task_ids: int = 1000
    max_streams: int = 10_000
    max_streams_per_principal: int = 100
    poll_burst: int = 20
    default_poll_interval: float = 1.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    # NATS credentials and TLS, for hub and embedded-less deployments.
    nats_user: str | None = None
    nats_password: str | None = None
    nats_token: str | None = None
    nats_nkey_seed: Path | None = None
    nats_creds: Path | None = None
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # NATS failure detection: a PING this often, the connection dropped after this many
    # unanswered (hub/store/source.py; /readyz is 503 while disconnected).
    nats_ping_interval: float = 1.0
    nats_max_pings: int = 2
    # Listen streams whose client has not read for this long are closed (dead peers).
    send_timeout: float = 30.0
    # tasks/update: how long the ack waits for the owner to take the answers (D24).
    update_wait: float = 2.0
    # Grace given to listen streams to say goodbye on shutdown.
    shutdown_grace: float = 5.0
    # How often expired tasks are swept from memory (reads check expiry themselves).
    expiry_sweep_interval: float = 1.0
    # The front door (hub/front_door/upstream.py): MCP servers whose other methods the hub forwards.
    upstreams: tuple[UpstreamSpec, ...] = ()
    upstream_timeout: float = 30.0
    # ... each caller (principal, or client address) with at most this many requests in
    # flight, and answers read whole holding at most this many bytes at once (429, 503).
    max_forwards_per_caller: int = 100
    max_upstream_buffer_bytes: int = 256 << 20
    # Tasks an upstream keeps itself (hub/front_door/upstream_tasks.py): kept until their TTL, else
    # this long after they were last observed, and at most this many.
    upstream_task_retention: float = 86_400.0
    max_upstream_tasks: int = 100_000
    # Peers whose X-Forwarded-*, Forwarded and X-Real-IP the hub keeps
    # (hub/front_door/forwarding.py).
    trusted_proxies: tuple[Network, ...] = ()
    # Who may follow which resource URIs on a listen stream (hub/push/fleet_events.py).
    resource_rule: str | None = None

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def auth(self) -> AuthSettings:
        return AuthSettings(
            jwt_secret=self.jwt_secret,
            jwt_public_key_file=self.jwt_public_key_file,
            jwt_issuer=self.jwt_issuer,
            jwt_audience=self.jwt_audience,
            leeway_s=self.jwt_leeway,
            operator_claim=parse_operator_claim(self.operator_claim),
        )

    @property
    def head_limits(self) -> HeadLimits:
        return HeadLimits(
            target=self.max_target_bytes,
            field=self.max_field_bytes,
            fields=self.max_fields,
            head=self.max_head_bytes,
            rest=rest_for(self.max_body_bytes),
        )

    @property
    def host_names(self) -> tuple[str, ...]:
        """The names an open hub answers for besides IP addresses (hub/http/hosts.py)."""
        names = ["localhost", self.host, *self.allowed_hosts]
        if self.public_url is not None:
            names.append(urlsplit(self.public_url).hostname or "")
        return tuple(f"[{name}]" if ":" in name else name for name in names if name)

    @property
    def auth_enabled(self) -> bool:
        return self.jwt_secret is not None or self.jwt_public_key_file is not None

    @property
    def own_origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return normalize_origin(self.public_url or f"http://{host}:{self.port}")

    def origin_allowed(self, origin: str) -> bool:
        """H4: which pages may call the hub; by default our own and loopback pages."""
        if origin in self.allowed_origins or origin in self.cors_origins:
            return True
        if origin == self.own_origin:
            return True
        if self.allowed_origins:
            return False
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.hostname in LOOPBACK_HOSTS

    def nats_options(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect`: failure detection, credentials and TLS."""
        return connect_options(self.nats_plain_options())

    def nats_plain_options(self) -> dict[str, Any]:
        """`nats_options` as JSON carries them, TLS as its files (`connect_options` makes
        the context): what the first read's worker process is given
        (hub/store/first_read/worker.py)."""
        options: dict[str, Any] = {
            # A frozen or unreachable server is noticed after about (pings + 1) intervals,
            # not nats-py's 2 x 120 s: the connection drops and /readyz turns 503.
            "ping_interval": self.nats_ping_interval,
            "max_outstanding_pings": self.nats_max_pings,
        }
        if self.nats_user is not None:
            options["user"] = self.nats_user
            options["password"] = self.nats_password
        if self.nats_token is not None:
            options["token"] = self.nats_token
        if self.nats_nkey_seed is not None:
            options["nkeys_seed"] = str(self.nats_nkey_seed)
        if self.nats_creds is not None:
            options["user_credentials"] = str(self.nats_creds)
        if self.nats_tls_ca or self.nats_tls_cert:
            options["tls"] = {
                name: None if path is None else str(path)
                for name, path in (
                    ("ca", self.nats_tls_ca),
                    ("cert", self.nats_tls_cert),
                    ("key", self.nats_tls_key),
                )
            }
        return options


def connect_options(plain: dict[str, Any]) -> dict[str, Any]:
    """`Config.nats_plain_options` for `nats.connect`: TLS files made into a context."""
    tls = plain.get("tls")
    if tls is None:
        return plain
    context = ssl.create_default_context(cafile=tls["ca"])
    if tls["cert"] is not None:
        context.load_cert_chain(tls["cert"], tls["key"])
    return {**plain, "tls": context}
