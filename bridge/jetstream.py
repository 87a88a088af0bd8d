"""The JetStream resources of the wire contract: the task bucket and the control stream.

Hub and bridge both call these at start-up, so whichever starts first creates the
resources with the same settings, and the other accepts what exists.
"""

from __future__ import annotations

from typing import Any

from nats.js import api
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

from bridge.wire import CONTROL_STREAM, CONTROL_SUBJECT_PREFIX, kv_stream

# Delete markers left when a message's TTL removes it, so watchers see the expiry.
EXPIRY_MARKER_TTL_S = 300.0
# Control messages are de-duplicated by Nats-Msg-Id within this window.
CONTROL_DUPLICATE_WINDOW_S = 120.0


async def ensure_bucket(js: Any, bucket: str, replicas: int = 1) -> None:
    """Create the task bucket (history 1, per-message TTL) unless it exists."""
    try:
        await js.key_value(bucket)
        return
    except BucketNotFoundError:
        pass
    config = api.KeyValueConfig(
        bucket=bucket,
        history=1,
        replicas=replicas,
        storage=api.StorageType.FILE,
        limit_marker_ttl=EXPIRY_MARKER_TTL_S,
    )
    try:
        await js.create_key_value(config)
    except APIError:
        # Lost a creation race: accept the bucket another process made.
        await js.stream_info(kv_stream(bucket))


async def ensure_hub_bucket(js: Any, name: str, ttl: float, replicas: int = 1) -> Any:
    """Open a bucket of the hubs' own (history 1, entries gone `ttl` seconds after their
    last write), made unless it exists; the KeyValue."""
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        pass
    config = api.KeyValueConfig(
        bucket=name, history=1, ttl=ttl, replicas=replicas, storage=api.StorageType.FILE
    )
    try:
        return await js.create_key_value(config)
    except APIError:
        return await js.key_value(name)  # another process made it first


async def ensure_control_stream(js: Any, replicas: int = 1) -> None:
    """Create the work-queue control stream unless it exists."""
    try:
        await js.stream_info(CONTROL_STREAM)
        return
    except NotFoundError:
        pass
    config = api.StreamConfig(
        name=CONTROL_STREAM,
        subjects=[f"{CONTROL_SUBJECT_PREFIX}>"],
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=CONTROL_DUPLICATE_WINDOW_S,
    )
    try:
        await js.add_stream(config)
    except APIError:
        await js.stream_info(CONTROL_STREAM)
