"""The head an upstream gets is the head the hub checked, cleaned (hub/front_door/forwarding.py).

Trailers never become headers; the hub states who the client is (`X-Forwarded-*`) unless
a trusted proxy did; fields the `Connection` header names stay on their side; the hub's
token cookie neither goes upstream nor comes back from one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hub.settings import UpstreamSpec, parse_trusted_proxies
from tests.e2e.raw_http import (
    Received,
    call,
    echoing,
    exchange,
    hub_in_front,
    json_reply,
    kept_alive,
    port_of,
    post_head,
    result,
    status_of,
    tool_call,
)
from tests.helpers import headers_for, mint_token

pytestmark = pytest.mark.timeout(90)


async def test_trailers_never_reach_the_upstream_as_headers(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """alice's request, chunked, with trailers forging a second Authorization and
    Mcp-Method: the upstream sees the one head the hub authenticated."""
    secret = "s" * 32
    token = mint_token(secret, "alice")
    async with kept_alive(echoing) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec, jwt_secret=secret) as front:
            body = tool_call()
            encoded = json.dumps(body).encode()
            head = post_head(
                *(f"{name}: {value}" for name, value in headers_for(body).items()),
                "Content-Type: application/json",
                f"Authorization: Bearer {token}",
                "Transfer-Encoding: chunked",
            )
            trailers = b"Authorization: Bearer forged\r\nMcp-Method: tasks/cancel\r\n"
            chunked = b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(encoded), encoded, trailers)
            answer = await exchange(port_of(front), head + chunked)
            assert status_of(answer) == 200
    (seen,) = upstream.received
    assert seen.values("authorization") == [f"Bearer {token}"]
    assert seen.values("mcp-method") == ["tools/call"]


SPOOFS = {
    "X-Forwarded-For": "10.9.9.9",
    "X-Forwarded-Host": "bank.example",
    "X-Forwarded-Proto": "https",
    "Forwarded": "for=10.9.9.9",
    "X-Real-IP": "10.9.9.9",
}


async def test_forwarding_headers_are_the_hubs_own(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """What a client says of itself is replaced, not appended to: code upstream that reads
    the first value (Starlette's `headers.get`) sees the hub's, not the spoof."""
    async with kept_alive(echoing) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec) as front:
            await call(front.url + "/mcp", **SPOOFS)
    (seen,) = upstream.received
    assert seen.values("x-forwarded-for") == ["127.0.0.1"]
    assert seen.values("x-forwarded-host") == [f"127.0.0.1:{port_of(front)}"]
    assert seen.values("x-forwarded-proto") == ["http"]
    assert seen.values("forwarded") == [] and seen.values("x-real-ip") == []


async def test_a_trusted_proxys_forwarding_headers_are_kept_and_extended(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with kept_alive(echoing) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        trusted = parse_trusted_proxies("127.0.0.0/8")
        async with hub_in_front(nats_url, bucket, tmp_path, spec, trusted_proxies=trusted) as front:
            await call(front.url + "/mcp", **SPOOFS)
    (seen,) = upstream.received
    assert seen.values("x-forwarded-for") == ["10.9.9.9, 127.0.0.1"]
    assert seen.values("x-forwarded-host") == ["bank.example"]
    assert seen.values("x-forwarded-proto") == ["https"]
    assert seen.values("forwarded") == ["for=10.9.9.9"]
    assert seen.values("x-real-ip") == ["10.9.9.9"]


async def test_connection_named_fields_and_the_hubs_cookie_stay_on_their_side(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Fields the `Connection` header names are hop-by-hop both ways (RFC 9110 §7.6.1);
    the token cookie goes neither up nor, planted by an upstream, down."""

    async def answer(request: Received) -> bytes:
        return json_reply(
            result(request),
            "Connection: X-Upstream-Secret",
            "X-Upstream-Secret: hop",
            "Set-Cookie: taskhub_token=planted; Path=/; HttpOnly",
            "Set-Cookie: session=fine; Path=/",
        )

    async with kept_alive(answer) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec) as front:
            response = await call(
                front.url + "/mcp",
                Connection="keep-alive, X-Client-Secret",
                **{"X-Client-Secret": "hop", "Cookie": "taskhub_token=t0k; theme=dark"},
            )
    assert response.status_code == 200
    assert "x-upstream-secret" not in response.headers
    assert response.headers.get_list("set-cookie") == ["session=fine; Path=/"]
    (seen,) = upstream.received
    assert seen.values("x-client-secret") == []
    assert seen.values("cookie") == ["theme=dark"]
