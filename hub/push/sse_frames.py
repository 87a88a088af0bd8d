"""SSE frames of a listen stream, spliced from bytes encoded once per task revision.

Every function here is pure: the per-stream prefix is built once when the stream
opens, each task's JSON once per revision (hub/store/cache.py), and a notification is the
two joined. No `id:` lines: streams cannot be resumed (H25).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from bridge import vocabulary
from hub.rpc.jsonrpc import line_safe
from hub.store.snapshot import TaskSnapshot

SUBSCRIPTION_ID_KEY = msgspec.json.encode(vocabulary.SUBSCRIPTION_ID_KEY) + b":"
KEEPALIVE_FRAME = b":\n\n"  # H20: a comment line, ignored by every SSE parser
TASK_FRAME_END = b"}\n\n"  # a task's frame: prefix, its body after the "{", this


def event(payload: bytes) -> bytes:
    """One SSE event carrying one JSON-RPC message (JSON never contains a raw newline)."""
    return b"data: " + payload + b"\n\n"


def ack_frame(
    subscription_id: bytes, task_ids: list[str] | None, events: dict[str, Any] | None = None
) -> bytes:
    """`notifications/subscriptions/acknowledged` with the granted subset (H56, H57):
    `taskIds`, and the fleet event filters granted (docs/fleet-events.md)."""
    granted = b"" if task_ids is None else b'"taskIds":' + msgspec.json.encode(task_ids)
    if events:
        granted += (b"," if granted else b"") + line_safe(msgspec.json.encode(events))[1:-1]
    return event(
        b'{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b'},"notifications":{'
        + granted
        + b"}}}"
    )


def notification_prefix(subscription_id: bytes) -> bytes:
    return (
        b'data: {"jsonrpc":"2.0","method":"notifications/tasks","params":{"_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b"},"
    )


def task_frames(prefix: bytes, snapshots: Iterable[TaskSnapshot]) -> bytes:
    """`notifications/tasks` frames = the same DetailedTask bytes `tasks/get` serves (H60);
    a chunk of one state is made from parts instead (`chunk_tail`)."""
    parts: list[bytes] = []
    for snapshot in snapshots:
        parts += (prefix, snapshot.body[1:], TASK_FRAME_END)
    return b"".join(parts)


def chunk_tail(snapshot: TaskSnapshot) -> bytes:
    """A chunk of one state is `chunk_head(len(prefix), len(tail)) + prefix + tail`: the
    HTTP/1.1 chunk of `task_frames(prefix, [snapshot])`, from parts made once per revision
    and prefix length for every stream the fan-out writes it to."""
    return snapshot.body[1:] + TASK_FRAME_END + b"\r\n"


def chunk_head(prefix_length: int, tail_length: int) -> bytes:
    """The chunk's size line (see `chunk_tail`)."""
    return b"%x\r\n" % (prefix_length + tail_length - 2)


def event_frame(subscription_id: bytes, method: bytes, uri: str | None = None) -> bytes:
    """A fleet change event (`notifications/tools/list_changed`, ...) on one stream."""
    params = b"" if uri is None else b',"uri":' + line_safe(msgspec.json.encode(uri))
    return event(
        b'{"jsonrpc":"2.0","method":"'
        + method
        + b'","params":{"_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b"}"
        + params
        + b"}}"
    )


def completion_frame(subscription_id: bytes) -> bytes:
    """The listen request's own result, sent when the hub ends the stream (H63)."""
    return event(
        b'{"jsonrpc":"2.0","id":'
        + subscription_id
        + b',"result":{"resultType":"complete","_meta":{'
        + SUBSCRIPTION_ID_KEY
        + subscription_id
        + b"}}}"
    )
