"""hub/http/cors.py: preflight and response headers for allow-listed origins, nothing for others."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from hub.http.cors import is_preflight, preflight_headers, response_headers
from hub.settings import normalize_origin

DASHBOARD = "https://dash.example"
ALLOWED = frozenset({DASHBOARD, "http://localhost:5173"})


def test_preflight_from_an_allowed_origin() -> None:
    assert preflight_headers(DASHBOARD, ALLOWED) == {
        "access-control-allow-origin": DASHBOARD,
        "access-control-allow-methods": "POST",
        "access-control-allow-headers": (
            "Authorization, Content-Type, MCP-Protocol-Version, Mcp-Method, Mcp-Name, Accept"
        ),
        "access-control-allow-credentials": "true",
        "access-control-max-age": "600",
        "vary": "Origin",
    }


def test_preflight_max_age_is_configurable() -> None:
    assert preflight_headers(DASHBOARD, ALLOWED, max_age_s=60)["access-control-max-age"] == "60"


def test_response_to_an_allowed_origin() -> None:
    assert response_headers("http://localhost:5173", ALLOWED) == {
        "access-control-allow-origin": "http://localhost:5173",
        "access-control-allow-credentials": "true",
        "access-control-expose-headers": "WWW-Authenticate, Retry-After",
        "vary": "Origin",
    }


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        pytest.param(None, ALLOWED, id="no-origin"),
        pytest.param("https://evil.example", ALLOWED, id="foreign"),
        pytest.param("https://dash.example:8443", ALLOWED, id="other-port"),
        pytest.param("http://dash.example", ALLOWED, id="other-scheme"),
        pytest.param("https://DASH.example", ALLOWED, id="not-serialized-like-a-browser"),
        pytest.param("https://dash.example.evil", ALLOWED, id="suffix"),
        pytest.param("null", ALLOWED | {"null"}, id="null-even-if-listed"),
        pytest.param("https://evil.example", frozenset({"*"}), id="no-wildcards"),
        pytest.param(DASHBOARD, frozenset(), id="empty-list"),
    ],
)
def test_other_origins_get_no_cors_headers(origin: str | None, allowed: frozenset[str]) -> None:
    assert preflight_headers(origin, allowed) == {}
    assert response_headers(origin, allowed) == {}


@given(st.none() | st.text(), st.frozensets(st.text(max_size=30), max_size=4))
def test_allow_origin_is_the_request_origin_never_a_wildcard(
    origin: str | None, allowed: frozenset[str]
) -> None:
    for headers in (preflight_headers(origin, allowed), response_headers(origin, allowed)):
        if headers:
            assert origin in allowed and origin != "null"
            assert headers["access-control-allow-origin"] == origin
            assert headers["access-control-allow-credentials"] == "true"
            assert headers["vary"] == "Origin"


@pytest.mark.parametrize(
    ("method", "headers", "expected"),
    [
        pytest.param(
            "OPTIONS",
            {"origin": DASHBOARD, "access-control-request-method": "POST"},
            True,
            id="preflight",
        ),
        pytest.param(
            "OPTIONS",
            Headers(headers={"Origin": DASHBOARD, "Access-Control-Request-Method": "POST"}),
            True,
            id="starlette-headers",
        ),
        pytest.param("OPTIONS", {"origin": DASHBOARD}, False, id="plain-options"),
        pytest.param("OPTIONS", {"access-control-request-method": "POST"}, False, id="no-origin"),
        pytest.param(
            "POST",
            {"origin": DASHBOARD, "access-control-request-method": "POST"},
            False,
            id="post",
        ),
    ],
)
def test_is_preflight(method: str, headers: dict[str, str] | Headers, expected: bool) -> None:
    assert is_preflight(method, headers) is expected


@pytest.mark.parametrize(
    ("text", "origin"),
    [
        pytest.param("https://dash.example", "https://dash.example", id="plain"),
        pytest.param(" https://Dash.Example/ ", "https://dash.example", id="case-slash-space"),
        pytest.param("HTTPS://dash.example", "https://dash.example", id="scheme-case"),
        pytest.param("https://dash.example:443", "https://dash.example", id="default-https"),
        pytest.param("http://dash.example:80", "http://dash.example", id="default-http"),
        pytest.param("http://localhost:5173", "http://localhost:5173", id="port"),
        pytest.param("https://dash.example:80", "https://dash.example:80", id="http-port-https"),
        pytest.param("http://127.0.0.1:8080", "http://127.0.0.1:8080", id="ipv4"),
        pytest.param("http://[::1]:3000", "http://[::1]:3000", id="ipv6"),
        pytest.param("http://[::1]", "http://[::1]", id="ipv6-no-port"),
        pytest.param("https://xn--bcher-kva.example", "https://xn--bcher-kva.example", id="idn"),
    ],
)
def test_normalize_origin(text: str, origin: str) -> None:
    assert normalize_origin(text) == origin


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("dash.example", id="no-scheme"),
        pytest.param("ftp://dash.example", id="ftp"),
        pytest.param("https://", id="no-host"),
        pytest.param("https://dash.example/app", id="path"),
        pytest.param("https://dash.example?x=1", id="query"),
        pytest.param("https://dash.example#top", id="fragment"),
        pytest.param("https://user@dash.example", id="userinfo"),
        pytest.param("https://user:pw@dash.example", id="password"),
        pytest.param("https://dash.example:99999", id="port-range"),
        pytest.param("https://dash.example:http", id="port-text"),
        pytest.param("https://bücher.example", id="unicode-idn"),
        pytest.param("null", id="null"),
        pytest.param("*", id="wildcard"),
        pytest.param("", id="empty"),
    ],
)
def test_normalize_origin_refuses_non_origins(text: str) -> None:
    with pytest.raises(ValueError, match="is not an http"):
        normalize_origin(text)
