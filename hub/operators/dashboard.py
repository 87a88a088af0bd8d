"""The dashboard's page and assets (hub/operators/static/, docs/dashboard.md), served as files.

`/` is the page; `/dashboard/<file>` its script, styles and vendored chart library. Every
answer carries a strict Content-Security-Policy (no inline script or style, nothing from
another origin, no framing), so task data the page shows can never run as code.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

STATIC = Path(__file__).parent / "static"
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",  # revalidate (ETag): a new release is picked up at once
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}


def _file(relative: str) -> Response:
    path = (STATIC / relative).resolve()
    media_type = _TYPES.get(path.suffix)
    if media_type is None or not path.is_relative_to(STATIC.resolve()) or not path.is_file():
        return PlainTextResponse("not found\n", 404, headers={"x-content-type-options": "nosniff"})
    return FileResponse(path, media_type=media_type, headers=SECURITY_HEADERS)


async def page(request: Request) -> Response:
    return _file("index.html")


async def asset(request: Request) -> Response:
    return _file(request.path_params["path"])


def routes() -> list[BaseRoute]:
    return [
        Route("/", page, methods=["GET", "HEAD"]),
        Route("/dashboard/{path:path}", asset, methods=["GET", "HEAD"]),
    ]
