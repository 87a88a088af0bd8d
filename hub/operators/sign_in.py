"""`/dashboard/session`: the dashboard's sign-in, the one place the token cookie is set.

The page cannot send an `Authorization` header on its stream (`EventSource`), so its
token rides in the `taskhub_token` cookie (hub/admission/auth.py). The hub sets that cookie itself,
after checking the token: `HttpOnly`, so no script on the page (nor one injected into it)
can read the token; `SameSite=Strict` and `Path=/`; `Secure` when the hub is reached over
https; and only for as long as the token is valid. `POST` with `{"token": "<jwt>"}` signs
in (204, or the 401 challenge for a token the hub does not accept), `DELETE` signs out.
Both only from the hub's own pages, by the cookie's own rule (`Origin`, or
`Sec-Fetch-Site: same-origin`), so no other site can sign a browser in as someone else.
"""

from __future__ import annotations

import math
import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from hub.admission.auth import COOKIE_NAME, AuthError, foreign_page
from hub.mcp.endpoint import BodyError, read_body
from hub.mcp.task_reads import json_error
from hub.rpc import jsonrpc
from hub.runtime import Hub

MAX_BODY = 16 * 1024  # a token, with room to spare


async def session(hub: Hub, request: Request) -> Response:
    authenticator = hub.authenticator
    if authenticator is None:
        return json_error(404, jsonrpc.INVALID_REQUEST, "This hub runs open: no sign-in")
    config = hub.config
    problem = foreign_page(request.headers, config.own_origin, frozenset(config.cors_origins))
    if problem is not None:
        return json_error(403, jsonrpc.INVALID_REQUEST, f"Sign-in {problem}")
    secure = request.url.scheme == "https" or (config.public_url or "").startswith("https:")
    if request.method == "DELETE":
        return _with_cookie("", 0, secure)
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        return json_error(415, jsonrpc.INVALID_REQUEST, 'Send {"token": ...} as JSON')
    try:
        body = await read_body(request.scope, request.receive, MAX_BODY, config.body_timeout)
    except BodyError as exc:
        return json_error(exc.status, jsonrpc.INVALID_REQUEST, str(exc))
    try:
        token = msgspec.json.decode(body, type=dict[str, str])["token"]
    except (msgspec.DecodeError, KeyError):
        return json_error(400, jsonrpc.INVALID_REQUEST, 'Send {"token": ...} as JSON')
    try:
        identity = authenticator.authenticate(token)
    except AuthError as exc:
        message = "Unauthorized" + (f": {exc.description}" if exc.description else "")
        challenge = {"www-authenticate": exc.www_authenticate()}
        return json_error(exc.status, jsonrpc.UNAUTHORIZED, message, challenge)
    expires = identity.expires_at
    max_age = None if expires is None else max(0, math.floor(expires - time.time()))
    return _with_cookie(token, max_age, secure)


def _with_cookie(token: str, max_age: int | None, secure: bool) -> Response:
    """204 with the cookie set; a token checked by `authenticate` holds only characters
    a cookie value may (a JWS compact serialisation)."""
    cookie = f"{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict"
    if max_age is not None:
        cookie += f"; Max-Age={max_age}"
    if secure:
        cookie += "; Secure"
    return Response(status_code=204, headers={"set-cookie": cookie, "cache-control": "no-store"})
