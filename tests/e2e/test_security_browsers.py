"""Security end to end, what browsers may do: the token cookie and its CSRF rules, CORS for
allow-listed origins, and the Origin allow-list (H4) that turns every other page away."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.test_security_auth import (
    DASHBOARD,
    PUBLIC_URL,
    Secured,
    assert_auth_error,
    bearer,
    challenge,
    token,
)
from tests.e2e.test_security_auth import secured as secured  # the module's hub, a fixture
from tests.helpers import listening, new_task_id, rpc, start_hub


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


# --- browsers: the token cookie and its CSRF rules ------------------------------------------


def cookie(value: str | None = None) -> dict[str, str]:
    return {"Cookie": f"taskhub_token={value or token('alice')}"}


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Origin": PUBLIC_URL}, id="same-origin"),
        pytest.param({"Origin": DASHBOARD}, id="cors-origin"),
        pytest.param({"Sec-Fetch-Site": "same-origin"}, id="no-origin-but-same-site"),
        pytest.param(
            {"Origin": PUBLIC_URL, "Content-Type": "application/json; charset=utf-8"},
            id="json-with-charset",
        ),
    ],
)
async def test_the_token_cookie_works_for_same_origin_json_posts(
    secured: Secured, headers: dict[str, str]
) -> None:
    tid = await secured.task("alice")
    response = await secured.call(rpc("tasks/get", {"taskId": tid}, id=5), **cookie(), **headers)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["taskId"] == tid  # the cookie's principal: alice


async def test_a_listen_stream_accepts_the_cookie(secured: Secured) -> None:
    tid = await secured.task("alice")
    async with listening(secured.harness, [tid], **cookie(), Origin=PUBLIC_URL) as (_, stream):
        assert (await stream.next())["params"]["notifications"] == {"taskIds": [tid]}


COOKIE_REFUSALS = {
    "foreign-loopback-origin": ({"Origin": "http://localhost:5173"},
                                "cookie sent from a foreign origin"),
    "text-plain": ({"Origin": PUBLIC_URL, "Content-Type": "text/plain"},
                   "cookie needs Content-Type: application/json"),
    "form": ({"Origin": PUBLIC_URL, "Content-Type": "application/x-www-form-urlencoded"},
             "cookie needs Content-Type: application/json"),
    "no-origin": ({}, "cookie needs Origin or Sec-Fetch-Site: same-origin"),
    "cross-site-fetch": ({"Sec-Fetch-Site": "cross-site"},
                         "cookie needs Origin or Sec-Fetch-Site: same-origin"),
    "two-cookies": ({"Origin": PUBLIC_URL, "Cookie": f"taskhub_token={token()}; "
                     f"taskhub_token={token('bob')}"}, "more than one token cookie"),
}  # fmt: skip


@pytest.mark.parametrize(("headers", "description"), COOKIE_REFUSALS.values(),
                         ids=list(COOKIE_REFUSALS))  # fmt: skip
async def test_the_token_cookie_is_refused_where_a_page_could_forge_it(
    secured: Secured, headers: dict[str, str], description: str
) -> None:
    tid = await secured.task("alice")
    body = rpc("tasks/get", {"taskId": tid}, id=5)
    response = await secured.call(body, **{**cookie(), **headers})
    assert_auth_error(response, 400, challenge("invalid_request", description))


async def test_a_foreign_origin_never_gets_as_far_as_the_cookie(secured: Secured) -> None:
    tid = await secured.task("alice")
    body = rpc("tasks/get", {"taskId": tid}, id=5)
    response = await secured.call(body, **cookie(), Origin="https://evil.test")
    assert response.status_code == 403
    assert "id" not in response.json() and cors_headers(response) == {}


# --- CORS ------------------------------------------------------------------------------------

CORS_RESPONSE = {
    "access-control-allow-origin": DASHBOARD,
    "access-control-allow-credentials": "true",
    "access-control-expose-headers": "WWW-Authenticate, Retry-After",
}


async def test_an_allow_listed_origin_gets_cors_headers_on_every_answer(secured: Secured) -> None:
    tid = await secured.task("alice")
    origin = {"Origin": DASHBOARD}
    answers = {
        "ok": await secured.call(rpc("tasks/get", {"taskId": tid}), **bearer(), **origin),
        "not found": await secured.call(
            rpc("tasks/get", {"taskId": new_task_id()}), **bearer(), **origin
        ),
        "unauthorized": await secured.call(rpc("server/discover"), **origin),
        "bad request": await secured.call(
            rpc("server/discover"), **bearer(), **origin, **{"Mcp-Method": "tasks/get"}
        ),
    }
    for name, response in answers.items():
        assert cors_headers(response) == CORS_RESPONSE, name
        assert response.headers["vary"] == "Origin", name


async def test_a_listen_stream_for_an_allow_listed_origin_carries_cors_headers(
    secured: Secured,
) -> None:
    tid = await secured.task("alice")
    async with listening(secured.harness, [tid], **bearer(), Origin=DASHBOARD) as (response, s):
        assert response.headers["content-type"] == "text/event-stream"
        assert cors_headers(response) == CORS_RESPONSE
        assert (await s.next())["params"]["notifications"] == {"taskIds": [tid]}


async def test_a_preflight_from_an_allow_listed_origin_is_answered(secured: Secured) -> None:
    request_headers = "authorization, content-type, mcp-protocol-version, mcp-method, mcp-name"
    response = await secured.harness.client.options(
        secured.harness.url + "/mcp",
        headers={
            "Origin": DASHBOARD,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": request_headers,
        },
    )
    assert response.status_code == 204 and response.content == b""
    allowed = cors_headers(response)
    assert allowed["access-control-allow-origin"] == DASHBOARD
    assert allowed["access-control-allow-credentials"] == "true"
    assert allowed["access-control-allow-methods"] == "POST"
    granted = {h.strip().lower() for h in allowed["access-control-allow-headers"].split(",")}
    assert {h.strip() for h in request_headers.split(",")} <= granted
    assert int(allowed["access-control-max-age"]) > 0


@pytest.mark.parametrize("origin", ["https://evil.test", "http://localhost:3000", "null"])
async def test_other_origins_get_no_cors_grant(secured: Secured, origin: str) -> None:
    client, url = secured.harness.client, secured.harness.url + "/mcp"
    preflight = await client.options(
        url, headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
    )
    assert preflight.status_code == 403 and cors_headers(preflight) == {}
    response = await secured.call(rpc("server/discover"), **bearer(), Origin=origin)
    assert cors_headers(response) == {}
    if origin == "http://localhost:3000":  # loopback pages may call, without CORS (H4)
        assert response.status_code == 200
    else:
        assert response.status_code == 403
        assert response.json() == {
            "jsonrpc": "2.0",
            "error": {"code": -32600, "message": "Origin not allowed"},
        }


async def test_a_plain_options_request_is_405(secured: Secured) -> None:
    response = await secured.harness.client.options(secured.harness.url + "/mcp")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


# --- the Origin allow-list (H4) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        (None, 200),  # not a browser
        (PUBLIC_URL, 200),  # our own pages
        (DASHBOARD, 200),  # CORS origins may call, of course
        ("http://localhost:3000", 200),  # loopback pages, by default
        ("http://127.0.0.1", 200),
        ("http://[::1]:8080", 200),
        ("https://evil.test", 403),
        ("http://10.0.0.1:8080", 403),
        ("http://localhost.evil.test", 403),
        ("null", 403),
    ],
)
async def test_default_origin_allow_list(secured: Secured, origin: str | None, status: int) -> None:
    headers = {} if origin is None else {"Origin": origin}
    response = await secured.call(rpc("server/discover"), **bearer(), **headers)
    assert response.status_code == status
    if status == 403:
        assert "id" not in response.json()


async def test_a_configured_origin_allow_list_admits_only_those_origins(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_hub(
        nats_url,
        bucket,
        tmp_path,
        allowed_origins=("https://app.test",),
        cors_origins=(DASHBOARD,),
        public_url=PUBLIC_URL,
    )
    try:
        expected = {
            None: 200,
            "https://app.test": 200,
            PUBLIC_URL: 200,
            DASHBOARD: 200,
            "http://localhost:3000": 403,  # loopback is no longer implied
            "http://127.0.0.1:8080": 403,
            "https://app.test:8443": 403,  # another origin on the same host
            "http://app.test": 403,
            "https://evil.test": 403,
            "null": 403,
        }
        for origin, status in expected.items():
            headers = {} if origin is None else {"Origin": origin}
            response = await harness.call(rpc("server/discover", id="o"), **headers)
            assert response.status_code == status, origin
            body = response.json()
            assert ("id" in body) == (status == 200), origin
    finally:
        await harness.stop()
