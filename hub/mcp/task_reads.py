"""`GET /tasks/{taskId}`: a task's snapshot as plain, cacheable HTTP, for scripts and caches.

The body is the same DetailedTask `tasks/get` answers (the snapshot's bytes, read through
to NATS on a miss), with `ETag` = the revision (the KV stream sequence), 304 for a matching
`If-None-Match`, and `Cache-Control: private, max-age` = the task's `pollIntervalMs` (the
rate it asks to be polled at). Ownership is that of `tasks/get`: a foreign task is a 404
exactly like an unknown one (H46). Credentials: a bearer token, or the dashboard's cookie
under its same-origin rule (hub/admission/auth.py, docs/dashboard.md). Origins as on `/mcp`: a
foreign `Origin` is 403.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from bridge.vocabulary import TASK_NOT_FOUND
from hub.admission.auth import AuthError, Identity
from hub.mcp.endpoint import authenticate
from hub.mcp.handlers import find_task
from hub.rpc import jsonrpc
from hub.runtime import Hub

DEFAULT_MAX_AGE_S = 1  # for a task without pollIntervalMs


def json_error(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    body = msgspec.json.encode({"error": {"code": code, "message": message}})
    return Response(body, status, headers, media_type="application/json")


def identify_reader(
    hub: Hub, headers: Mapping[str, str], extra: dict[str, str] | None = None
) -> Identity | Response:
    """Who makes a read-only GET (this route, the operator stream), or the refusal: a
    foreign `Origin` is 403, bad or missing credentials the RFC 6750 challenge. `extra`
    headers (CORS) go on the challenge."""
    origin = headers.get("origin")
    if origin is not None and not hub.config.origin_allowed(origin):
        return json_error(403, jsonrpc.INVALID_REQUEST, "Origin not allowed")
    try:
        return authenticate(hub, "GET", headers, frozenset(hub.config.cors_origins), read_only=True)
    except AuthError as exc:
        message = "Unauthorized" + (f": {exc.description}" if exc.description else "")
        challenge = {"www-authenticate": exc.www_authenticate(), **(extra or {})}
        return json_error(exc.status, jsonrpc.UNAUTHORIZED, message, challenge)


def operators_only(hub: Hub, headers: Mapping[str, str]) -> Response | None:
    """None when an operator asks (or the hub runs open), else the refusal: what the
    whole fleet does (`/metrics`) is an operator's to see."""
    identity = identify_reader(hub, headers)
    if isinstance(identity, Response):
        return identity
    if hub.authenticator is not None and not identity.operator:
        return json_error(403, jsonrpc.UNAUTHORIZED, "Needs a token with the operator claim")
    return None


async def get_task(hub: Hub, request: Request) -> Response:
    identity = identify_reader(hub, request.headers)
    if isinstance(identity, Response):
        return identity
    try:
        snapshot = await find_task(hub, request.path_params["task_id"], identity.principal)
    except jsonrpc.RpcError as err:  # NATS could not answer a read-through
        return json_error(503, err.code, err.message, {"retry-after": "1"})
    vary = {"vary": "Authorization"}
    if snapshot is None:
        return json_error(404, jsonrpc.INVALID_PARAMS, TASK_NOT_FOUND, vary)
    interval = snapshot.poll_interval_ms
    max_age = DEFAULT_MAX_AGE_S if interval is None else max(0, math.floor(interval / 1000))
    headers = {
        **vary,
        "etag": f'"{snapshot.revision}"',
        "cache-control": f"private, max-age={max_age}",
    }
    if _matches(request.headers.get("if-none-match"), snapshot.revision):
        return Response(status_code=304, headers=headers)
    return Response(snapshot.body, 200, headers, media_type="application/json")


def _matches(if_none_match: str | None, revision: int) -> bool:
    """RFC 9110 §13.1.2: `*`, or any listed tag, weak or strong, equal to the revision's."""
    if if_none_match is None:
        return False
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or any(tag.removeprefix("W/") == f'"{revision}"' for tag in tags)
