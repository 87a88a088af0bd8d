"""bridge/wire.py: the one rule for a NATS message that removes a task; what a stored value's
decoding refuses, and says."""

from __future__ import annotations

import msgspec
import pytest

from bridge import wire
from bridge.wire import DetailedTask, Envelope, InvalidEnvelope, decode_stored, is_removal

TASK_ID = "t" * 20
STAMP = "2026-01-01T00:00:00Z"


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


def stored(server: str = "srv-1", **fields: object) -> bytes:
    task = {"taskId": TASK_ID, "status": "working", "createdAt": STAMP, "lastUpdatedAt": STAMP}
    task |= {"ttlMs": 60_000, **fields}
    return msgspec.json.encode({"owner": "alice", "server": server, "task": task})


def test_a_stored_value_decodes_with_its_expiry() -> None:
    envelope, expires_at = decode_stored(TASK_ID, stored())
    assert isinstance(envelope, Envelope) and isinstance(envelope.task, DetailedTask)
    assert expires_at == 1767225600 + 60  # 2026-01-01T00:00:00Z plus a minute


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"createdAt": "yesterday"}, "createdAt is not an ISO 8601 timestamp: Invalid"),
        ({"createdAt": "2026-01-01T00:00:00"}, "createdAt is not an ISO 8601 timestamp: time"),
        ({"lastUpdatedAt": "later"}, "lastUpdatedAt is not an ISO 8601 timestamp: Invalid"),
        ({"lastUpdatedAt": "2026-01-01T00:00:01"}, "lastUpdatedAt is not an ISO 8601 timestamp"),
        ({"taskId": "short"}, "taskId does not match"),
    ],
)
def test_a_bad_timestamp_or_task_id_is_refused_naming_the_field(
    fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidEnvelope) as refused:
        decode_stored(TASK_ID, stored(**fields))
    assert str(refused.value).startswith(reason)
    if "T00:00" in str(fields):
        assert "has no time zone" in str(refused.value)


def test_server_ids_found_valid_are_remembered_within_a_bound_and_bad_ones_never() -> None:
    for n in range(wire.VALID_SERVERS_KEPT + 10):  # a writer naming a new server each time
        decode_stored(TASK_ID, stored(server=f"srv-{n}"))
        assert len(wire._valid_servers) <= wire.VALID_SERVERS_KEPT
    for _ in range(2):  # refused again, not remembered
        with pytest.raises(InvalidEnvelope, match="server does not match"):
            decode_stored(TASK_ID, stored(server="no spaces"))
    assert "no spaces" not in wire._valid_servers
