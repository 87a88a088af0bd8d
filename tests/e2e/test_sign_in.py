"""`/dashboard/session` (hub/operators/sign_in.py): the hub checks a token and sets its cookie
itself.

Over real HTTP to a served hub with authentication; the browser's side of it (the cookie
is HttpOnly, the page never holds the token) is in test_dashboard_browser.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import HubHarness, mint_token, start_served_hub

SECRET = "s" * 32
PUBLIC_URL = "https://hub.example"  # as a browser reaches it, through a TLS proxy


@pytest.fixture
async def hub(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_served_hub(
        nats_url, bucket, tmp_path, jwt_secret=SECRET, public_url=PUBLIC_URL
    )
    yield harness
    await harness.stop()


def own_page(harness: HubHarness) -> dict[str, str]:
    del harness
    return {"Origin": PUBLIC_URL, "Content-Type": "application/json"}


async def sign_in(harness: HubHarness, token: str, **headers: str) -> tuple[int, str | None]:
    response = await harness.client.post(
        harness.url + "/dashboard/session",
        content=f'{{"token": "{token}"}}',
        headers={**own_page(harness), **headers},
    )
    return response.status_code, response.headers.get("set-cookie")


async def test_a_valid_token_becomes_an_httponly_cookie_for_its_lifetime(
    hub: HubHarness,
) -> None:
    token = mint_token(SECRET, "alice", ttl=600)
    status, cookie = await sign_in(hub, token)
    assert status == 204
    assert cookie is not None
    parts = [part.strip() for part in cookie.split(";")]
    assert parts[0] == f"taskhub_token={token}"
    assert {"Path=/", "HttpOnly", "SameSite=Strict"} <= set(parts)
    max_age = int(next(p for p in parts if p.startswith("Max-Age=")).split("=")[1])
    assert 598 <= max_age <= 600 + 30  # exp plus the hub's leeway
    assert "Secure" in parts  # its public URL is https
    # The cookie then opens the operator stream's GET, from the hub's own page.
    async with hub.client.stream(
        "GET",
        hub.url + "/operator/stream",
        headers={"Cookie": f"taskhub_token={token}", "Origin": PUBLIC_URL},
    ) as response:
        assert response.status_code == 200


async def test_a_token_the_hub_refuses_sets_nothing(hub: HubHarness) -> None:
    expired = mint_token(SECRET, "alice", ttl=-3600)
    forged = mint_token("f" * 32, "alice")
    for token in (expired, forged, "not-a-jwt"):
        status, cookie = await sign_in(hub, token)
        assert status == 401 and cookie is None


async def test_only_the_hubs_own_pages_may_sign_a_browser_in(hub: HubHarness) -> None:
    """Login CSRF: another site's page cannot plant its own token in the user's browser."""
    token = mint_token(SECRET, "mallory")
    status, cookie = await sign_in(hub, token, Origin="https://evil.example")
    assert status == 403 and cookie is None
    response = await hub.client.post(  # no Origin, and no Sec-Fetch-Site: same-origin
        hub.url + "/dashboard/session",
        content=f'{{"token": "{token}"}}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 403 and "set-cookie" not in response.headers
    # A form post (no preflight cross-site) is not a way in either.
    status, cookie = await sign_in(hub, token, **{"Content-Type": "text/plain"})
    assert status == 415 and cookie is None


@pytest.mark.parametrize(
    "body", [b"", b"{", b'{"token": 5}', b"[]", b'{"nothing": "here"}', b"x" * 20_000]
)
async def test_a_malformed_body_is_a_clear_error(hub: HubHarness, body: bytes) -> None:
    response = await hub.client.post(
        hub.url + "/dashboard/session", content=body, headers=own_page(hub)
    )
    assert response.status_code in (400, 413)
    assert "set-cookie" not in response.headers
    assert response.json()["error"]["message"]


async def test_signing_out_expires_the_cookie(hub: HubHarness) -> None:
    response = await hub.client.delete(
        hub.url + "/dashboard/session", headers={"Origin": PUBLIC_URL}
    )
    assert response.status_code == 204, response.text
    assert response.headers["set-cookie"].startswith("taskhub_token=; ")
    assert "Max-Age=0" in response.headers["set-cookie"]


async def test_over_plain_http_the_cookie_is_not_secure(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path, jwt_secret=SECRET)
    try:
        status, _ = await sign_in(
            harness, mint_token(SECRET, "alice"), Origin="null", **{"Sec-Fetch-Site": "same-origin"}
        )
        assert status == 403  # "null" is every sandboxed page's origin: never ours
        response = await harness.client.post(
            harness.url + "/dashboard/session",
            content=f'{{"token": "{mint_token(SECRET, "alice")}"}}',
            headers={"Content-Type": "application/json", "Sec-Fetch-Site": "same-origin"},
        )
        assert response.status_code == 204
        assert "Secure" not in response.headers["set-cookie"]
    finally:
        await harness.stop()


async def test_an_open_hub_has_no_sign_in(nats_url: str, bucket: str, tmp_path: Path) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    try:
        status, cookie = await sign_in(harness, "anything")
        assert status == 404 and cookie is None
    finally:
        await harness.stop()


async def test_the_page_never_sets_the_token_cookie_itself() -> None:
    """The cookie is the hub's to set, HttpOnly (hub/operators/sign_in.py): the page's script has
    no way to write it, nor a token to write it with."""
    script = (
        Path(__file__).parents[2] / "hub" / "operators" / "static" / "dashboard.js"
    ).read_text()
    assert "document.cookie" not in script
