"""The frames a peer delivers: the hub's `notifications/tasks` bytes with a fresh stamp.

A peer moves opaque payloads, so the bench hands it the very frame the hub would send
for a bench task (bench/writer.py's shape: a `working` task whose statusMessage is the
publish stamp), and the load generator's byte-wise readers (bench/protocol.py) count it
and take its latency the same way, whatever `id:` or comment lines the peer adds.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from bridge import vocabulary
from bridge.states import format_timestamp
from bridge.wire import DetailedTask, encode

_PREFIX = (
    b'{"jsonrpc":"2.0","method":"notifications/tasks","params":{"_meta":{'
    + msgspec.json.encode(vocabulary.SUBSCRIPTION_ID_KEY)
    + b':"s0"},'
)
_CREATED = format_timestamp(datetime.now(UTC))


def payload(topic: str, stamp: str) -> bytes:
    """One notification (a JSON line) for the task `topic`, carrying `stamp`."""
    task = DetailedTask(
        taskId=topic,
        status="working",
        createdAt=_CREATED,
        lastUpdatedAt=format_timestamp(datetime.now(UTC)),
        ttlMs=None,
        statusMessage=stamp,
    )
    return _PREFIX + encode(task)[1:] + b"}"


def event(data: bytes) -> bytes:
    """`data: <payload>` as one SSE event."""
    return b"data: " + data + b"\n\n"
