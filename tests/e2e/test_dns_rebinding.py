"""An open hub answers only the `Host` names it is known by (hub/http/hosts.py): DNS rebinding.

A page at evil.example, its name rebound to 127.0.0.1, sends the hub same-origin requests
with its own name as `Host` and no `Origin`; every path answers it 421 (the legacy door
403: tests/e2e/test_legacy_errors.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.raw_http import discover_request, exchange, port_of, status_of
from tests.helpers import HubHarness, start_served_hub

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def open_hub(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()


def get(target: str, host: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


@pytest.mark.parametrize("target", ["/operator/stream", "/tasks/t-1", "/", "/metrics"])
async def test_a_rebound_name_gets_421_on_every_get(open_hub: HubHarness, target: str) -> None:
    """A page at evil.example, rebound to 127.0.0.1, sends its own name and no Origin."""
    port = port_of(open_hub)
    answer = await exchange(port, get(target, f"evil.example:{port}"))
    assert status_of(answer) == 421
    assert b"taskId" not in answer


@pytest.mark.parametrize("chunked", [False, True], ids=["in-place", "asgi"])
async def test_a_rebound_name_gets_421_on_post(open_hub: HubHarness, chunked: bool) -> None:
    """Whole in one read (the whole-post path), or chunked (uvicorn's parser and the app)."""
    port = port_of(open_hub)
    request = discover_request(chunked=chunked)
    request = request.replace(b"Host: 127.0.0.1", f"Host: evil.example:{port}".encode())
    answer = await exchange(port, request)
    assert status_of(answer) == 421
    assert b'"code":-32600' in answer


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "10.1.2.3"]
)
async def test_addresses_and_localhost_are_answered(open_hub: HubHarness, host: str) -> None:
    port = port_of(open_hub)
    answer = await exchange(port, get("/healthz", host.format(port=port)))
    assert status_of(answer) == 200


async def test_an_allowed_host_is_answered(nats_url: str, bucket: str, tmp_path: Path) -> None:
    harness = await start_served_hub(nats_url, bucket, tmp_path, allowed_hosts=("hub.example",))
    try:
        for host, status in (("hub.example:80", 200), ("other.example", 421)):
            assert status_of(await exchange(port_of(harness), get("/healthz", host))) == status
    finally:
        await harness.stop()


async def test_a_hub_with_authentication_answers_any_name(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    limited = await start_served_hub(nats_url, bucket, tmp_path, jwt_secret="s" * 32)
    try:
        port = port_of(limited)
        assert status_of(await exchange(port, get("/healthz", "hub.internal.example"))) == 200
    finally:
        await limited.stop()


async def test_two_host_fields_are_refused(open_hub: HubHarness) -> None:
    port = port_of(open_hub)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n"
    assert status_of(await exchange(port, request)) == 421
