"""Fixtures of the real-client tests (tests/e2e/npm.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e import npm


@pytest.fixture(params=npm.TARGETS)
async def client_url(
    request: pytest.FixtureRequest, nats_url: str, bucket: str, server_id: str, tmp_path: Path
) -> AsyncIterator[npm.Target]:
    """The URL a real client is given: the fleet server alone, or the hub in front of it."""
    async with npm.open_target(request.param, nats_url, bucket, server_id, tmp_path) as target:
        yield target
