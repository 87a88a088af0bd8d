"""Shared fixtures: one real nats-server per test session, a bucket per test.

Every test that touches NATS gets its own bucket name and server id, so tests never
see each other's tasks even though they share the server.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from bridge.jetstream import ensure_bucket, ensure_control_stream
from hub.commands.embedded_nats import NatsServerProcess
from tests.helpers import HubHarness, start_hub


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServerProcess]:
    server = NatsServerProcess(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServerProcess) -> str:
    return nats_server.url


@pytest.fixture
def bucket() -> str:
    """A fresh bucket name, so each test starts with no tasks."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def server_id() -> str:
    return f"srv-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[nats.NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


@pytest.fixture
async def js(nc: nats.NATS, bucket: str) -> object:
    """A JetStream context with this test's bucket and the control stream in place."""
    ctx = nc.jetstream()
    await ensure_bucket(ctx, bucket)
    await ensure_control_stream(ctx)
    return ctx


@pytest.fixture
async def hub(nats_url: str, bucket: str, tmp_path: Path) -> AsyncIterator[HubHarness]:
    """A hub on this test's bucket, served over real HTTP on a loopback port."""
    harness = await start_hub(nats_url, bucket, tmp_path)
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()


@pytest.fixture(params=[False, True], ids=["direct", "asgi"])
def asgi_only(request: pytest.FixtureRequest) -> bool:
    """Both ways a hub can be served (tests/helpers.py `start_hub`)."""
    return bool(request.param)


@pytest.fixture
async def hub_on_both(
    nats_url: str, bucket: str, tmp_path: Path, asgi_only: bool
) -> AsyncIterator[HubHarness]:
    """`hub`, once with the hub's connection protocol and once on plain uvicorn; each
    test then checks it really took the path its id names."""
    harness = await start_hub(nats_url, bucket, tmp_path, asgi_only=asgi_only)
    await harness.hub.source.wait_caught_up(10)
    yield harness
    await harness.stop()
    assert_took_path(harness, asgi_only)


def assert_took_path(harness: HubHarness, asgi_only: bool) -> None:
    """Direct: every stream wrote straight to its socket. ASGI: nothing bypassed the
    ASGI app. (Answers in place are counted in tests/e2e/test_connection.py.)"""
    metrics = harness.hub.metrics
    if asgi_only:
        assert metrics.answered_in_place.value() == 0
        assert metrics.streams_opened.value("direct") == 0
    else:
        assert metrics.streams_opened.value("asgi") == 0
