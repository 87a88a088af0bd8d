"""Wiring: the ASGI application and its lifespan.

`/mcp` goes straight to its endpoint (hub/mcp/endpoint.py), before any Starlette layer, so
the JSON-RPC fast path pays for no framework; Starlette serves the health, readiness and
metrics routes, `GET /tasks/{taskId}`, the operator stream and the dashboard
(docs/dashboard.md), and runs the lifespan that starts and stops the hub.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from hub.config import Config
from hub.front_door.forward_call import Forwarding
from hub.front_door.upstream import Upstream
from hub.front_door.upstream_pool import Pool
from hub.http.hosts import HostRule
from hub.legacy.endpoint import LegacyEndpoint
from hub.legacy.sessions import Sessions
from hub.mcp.endpoint import JSON, McpEndpoint, Reply, respond
from hub.mcp.task_reads import get_task, operators_only
from hub.operators import dashboard
from hub.operators.sign_in import session
from hub.operators.stream import OperatorStream
from hub.push.listen_stream import ListenStream
from hub.rpc import jsonrpc
from hub.runtime import Hub

log = logging.getLogger("taskhub.http")
Endpoint = McpEndpoint | LegacyEndpoint


# An open hub's answer to a `Host` it does not serve (hub/http/hosts.py).
MISDIRECTED = Reply(
    421,
    jsonrpc.encode_error(
        None,
        jsonrpc.invalid_request(
            "Host not served: an open hub answers addresses, localhost, its public URL's "
            "host and --allowed-host names"
        ),
    ),
    [JSON],
    "421",
)


class HubApp:
    """MCP endpoints straight to their `McpEndpoint`; the few other routes and the lifespan
    to Starlette. `/mcp` always, and `/servers/NAME/mcp` for each named upstream. An open
    hub first checks every request's `Host` (`hosts`)."""

    def __init__(
        self,
        hub: Hub,
        endpoints: dict[str, Endpoint],
        rest: Starlette,
        hosts: HostRule | None = None,
    ) -> None:
        self.hub = hub
        self.endpoints = endpoints
        self.rest = rest
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            endpoint = self.endpoints.get(scope["path"])
            host = _host(scope)
            if self.hosts is not None and not self.hosts.allows(host):
                # The legacy door refuses it as the SDK server it stands in for does.
                refused = (
                    endpoint.misdirected(host)
                    if isinstance(endpoint, LegacyEndpoint)
                    else MISDIRECTED
                )
                self.hub.metrics.requests.inc(1, "-", refused.outcome)
                await respond(scope, send, refused.status, refused.body, refused.headers)
                return
            if endpoint is not None:
                await endpoint(scope, receive, send)  # every method: non-POST gets 405 there
                return
        await self.rest(scope, receive, send)

    def answer_now(
        self, path: str, headers: Mapping[str, str], body: bytes, scope: Scope
    ) -> Reply | ListenStream | Forwarding | None:
        """For the hub's connections (hub/http/connection.py): a whole `POST` request, its
        headers by lower-case name, answered without an ASGI task when it needs no I/O
        (a listen stream then runs on the connection by itself), or a forward the
        connection runs itself; None otherwise."""
        endpoint = self.endpoints.get(path)
        if isinstance(endpoint, LegacyEndpoint):
            return None  # the legacy door always takes the ASGI path, its Host check too
        if self.hosts is not None and not self.hosts.allows(headers.get("host")):
            self.hub.metrics.requests.inc(1, "-", "421")
            return MISDIRECTED
        if endpoint is None:
            return None
        return endpoint.answer_now(headers, body, scope)


def create_app(config: Config, nats_url: str, hub: Hub | None = None) -> HubApp:
    """The hub as an ASGI app; `hub` may be passed in to share it with the caller."""
    hub = hub or Hub(config, nats_url)
    sessions = Sessions(hub, config.bucket, config.replicas)
    endpoints: dict[str, Endpoint] = {
        "/mcp": McpEndpoint(hub),
        "/legacy/mcp": LegacyEndpoint(hub, sessions, None, "/mcp"),
    }
    pool = None  # only a front door needs the HTTP client
    if config.upstreams:
        pool = Pool(
            config.upstream_timeout,
            max_per_caller=config.max_forwards_per_caller,
            buffer_bytes=config.max_upstream_buffer_bytes,
        )
        for spec in config.upstreams:
            upstream = Upstream(spec, pool, hub.metrics)
            hub.upstream_tasks.upstreams[spec.label] = upstream
            endpoints[spec.path] = McpEndpoint(hub, upstream)
            endpoints[spec.legacy_path] = LegacyEndpoint(hub, sessions, upstream, spec.path)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        await sessions.start()
        log.info("hub serving bucket %r", config.bucket)
        for spec in config.upstreams:
            log.info("front door: %s forwards to %s", spec.path, spec.url)
        try:
            yield
        finally:
            await hub.stop()
            if pool is not None:
                await pool.close()

    async def healthz(request: HttpRequest) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: HttpRequest) -> Response:
        if hub.ready:
            return PlainTextResponse("ready\n")
        return PlainTextResponse("not ready\n", status_code=503)

    async def task(request: HttpRequest) -> Response:
        return await get_task(hub, request)

    async def metrics(request: HttpRequest) -> Response:
        if not config.public_metrics:
            refusal = operators_only(hub, request.headers)
            if refusal is not None:
                return refusal
        return Response(hub.metrics.render(), media_type="text/plain; version=0.0.4")

    async def sign_in(request: HttpRequest) -> Response:
        return await session(hub, request)

    rest = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/tasks/{task_id}", task, methods=["GET"]),
            Route("/operator/stream", OperatorStream(hub)),
            Route("/dashboard/session", sign_in, methods=["POST", "DELETE"]),
            *dashboard.routes(),
        ],
        lifespan=lifespan,
    )
    hosts = None if config.auth_enabled else HostRule(config.host_names)
    return HubApp(hub, endpoints, rest, hosts)


def _host(scope: Scope) -> str | None:
    """The request's `Host`; two of them (RFC 9112 §3.2: a 400) name none allowed."""
    hosts = [value for name, value in scope["headers"] if name == b"host"]
    if len(hosts) > 1:
        return ""
    return hosts[0].decode("latin-1") if hosts else None
