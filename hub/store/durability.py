"""What an acknowledged write survives: the bucket's and control stream's replicas and the
NATS sync policy, reported once at start as metrics and a log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

from nats.js import JetStreamContext

from bridge.wire import CONTROL_STREAM
from hub.metrics import Metrics

log = logging.getLogger("taskhub.nats")


def read_sync_policy(monitor_url: str, timeout: float) -> str | None:
    """The server's JetStream sync policy from its monitoring `/varz`: "always", an
    interval such as "120s", or None when it cannot be read (blocking; run in a thread)."""
    try:
        with urllib.request.urlopen(f"{monitor_url.rstrip('/')}/varz", timeout=timeout) as r:
            config = json.loads(r.read())["jetstream"]["config"]
    except Exception as exc:
        log.warning("cannot read the NATS sync policy from %s/varz: %s", monitor_url, exc)
        return None
    if config.get("sync_always"):
        return "always"
    interval_ns = config.get("sync_interval")
    if not isinstance(interval_ns, int) or interval_ns <= 0:
        return None
    return f"{interval_ns / 1e9:g}s"


async def report_durability(
    js: JetStreamContext,
    stream: str,
    metrics: Metrics,
    monitor_url: str | None,
    timeout: float,
) -> None:
    """Metrics and one log line: what an acknowledged write survives.

    Replicas come from STREAM.INFO; the sync policy from the server's monitoring, when
    a URL for it is known (the embedded server's always is). A task acknowledged as
    created on one replica without an fsync can be lost to one power cut: warn then.
    """
    bucket = await js.stream_info(stream)
    control = await js.stream_info(CONTROL_STREAM)
    bucket_replicas = bucket.config.num_replicas or 1
    control_replicas = control.config.num_replicas or 1
    sync = None
    if monitor_url is not None:
        sync = await asyncio.to_thread(read_sync_policy, monitor_url, timeout)
    metrics.bucket_replicas.set(bucket_replicas)
    metrics.control_replicas.set(control_replicas)
    metrics.nats_sync_always.set(-1 if sync is None else int(sync == "always"))
    if sync is not None:
        shown = sync
    elif monitor_url is None:
        shown = "unknown (no --nats-monitor-url)"
    else:
        shown = f"unknown ({monitor_url}/varz unreadable)"
    line = (
        f"durability: bucket {stream} R{bucket_replicas}, control stream "
        f"{CONTROL_STREAM} R{control_replicas}, NATS sync {shown}"
    )
    if min(bucket_replicas, control_replicas) == 1 and sync != "always":
        log.warning(
            "%s: an acknowledged task write can be lost to one power cut (use R3, or "
            "sync_interval: always)",
            line,
        )
    else:
        log.info("%s", line)
