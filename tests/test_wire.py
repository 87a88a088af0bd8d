"""bridge/wire.py: the one rule for a NATS message that removes a task."""

from __future__ import annotations

import pytest

from bridge.wire import is_removal


@pytest.mark.parametrize(
    "headers",
    [
        {"KV-Operation": "DEL"},
        {"KV-Operation": "PURGE"},
        {"Nats-Marker-Reason": "MaxAge"},  # a message TTL ran out
        {"Nats-Marker-Reason": "Purge"},
        {"Nats-Marker-Reason": "Remove"},
        {"Nats-Marker-Reason": "SomeFutureReason"},  # a marker never carries a task
    ],
)
def test_deletes_purges_and_server_markers_remove_the_task(headers: dict[str, str]) -> None:
    assert is_removal(headers)


@pytest.mark.parametrize("headers", [None, {}, {"KV-Operation": "PUT"}, {"Nats-Msg-Id": "x"}])
def test_anything_else_stores_a_value(headers: dict[str, str] | None) -> None:
    assert not is_removal(headers)
