"""Fixtures of the end-to-end tests: real clients (tests/e2e/npm.py), the NATS proxy."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e import npm
from tests.e2e.mcpdo import Mcpdo
from tests.nats_proxy import NatsProxy


@pytest.fixture(scope="session")
def node() -> str:
    """Node 22, with every pinned npm package installed in tests/e2e/ts (npm.PINNED)."""
    return npm.node()


@pytest.fixture(params=npm.TARGETS)
async def client_url(
    request: pytest.FixtureRequest, nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> AsyncIterator[npm.Target]:
    """The URL a real client is given: the fleet server alone, or the hub in front of it."""
    async with npm.open_target(request.param, nats_url, bucket, server_id, tmp_path) as target:
        yield target


@pytest.fixture
async def mcpdo(node: str) -> AsyncIterator[Mcpdo]:
    """A private mcpdo daemon for one test (tests/e2e/mcpdo.py)."""
    # A short private root: the daemon's unix socket lives in it.
    root = Path(tempfile.mkdtemp(prefix="mcpdo-"))
    client = Mcpdo(node, root)
    try:
        await client.start_daemon()
        yield client
    finally:
        await client.stop_daemon()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def proxy(nats_url: str) -> AsyncIterator[NatsProxy]:
    """A TCP proxy to the session's nats-server that loses what a test tells it to."""
    parts = urlsplit(nats_url)
    assert parts.hostname is not None and parts.port is not None
    proxy = NatsProxy(parts.hostname, parts.port)
    await proxy.start()
    yield proxy
    await proxy.stop()
