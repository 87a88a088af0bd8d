"""Fleet change events from NATS to listen streams (docs/fleet-events.md).

Servers publish `mcp.events.<service>.<kind>` on core NATS (bridge/events.py, or any
client). The hub subscribes to all of them on its main NATS connection, checks each (a
well-formed subject, a known kind, a valid payload; anything else is dropped and counted)
and hands it to the fan-out, which delivers it on the streams opened at that service's
endpoint. After a reconnect, every followed event is sent once (`Fanout.resend_events`):
events are not stored, so one published during the gap would otherwise be lost.

Which callers may follow which resource URIs is the resource rule: a callable
`(principal, service, uri) -> bool`, by default every caller every URI (an update says only
"read it again"; reading goes through the upstream's own authorisation). `--resource-rule
MODULE:NAME` names another; a server can also narrow one update to `principals`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from msgspec import UNSET

from bridge.wire import (
    EVENT_KINDS,
    EVENT_SUBJECT_PREFIX,
    SERVICE_RE,
    InvalidEnvelope,
    decode_resource_updated,
)
from hub.metrics import Metrics
from hub.push.fanout import Fanout

log = logging.getLogger("taskhub.events")


ANNOUNCING_KEPT = 1024  # services remembered as announcing; NATS may name any


class EventSource:
    """The hub's subscription to every service's change events."""

    def __init__(self, fanout: Fanout, metrics: Metrics) -> None:
        self.fanout = fanout
        self.metrics = metrics
        self._sub: Any = None
        # Services that announce over NATS: the hub need not hold their upstream's own
        # listen for list changes (hub/front_door/upstream_events.py).
        self.announcing: set[str] = set()
        self.on_announcing: Callable[[str], None] | None = None

    async def start(self, nc: Any) -> None:
        self._sub = await nc.subscribe(EVENT_SUBJECT_PREFIX + ">", cb=self._on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may be gone already
                log.debug("unsubscribing events: %s", exc)

    def reconnected(self) -> None:
        self.fanout.resend_events()

    async def _on_msg(self, msg: Any) -> None:
        self.receive(msg.subject, msg.data)

    def receive(self, subject: str, data: bytes) -> None:
        """One event off NATS: delivered, or dropped and counted by reason."""
        service, _, kind = subject[len(EVENT_SUBJECT_PREFIX) :].partition(".")
        if not SERVICE_RE.fullmatch(service) or kind not in EVENT_KINDS:
            self.metrics.events_rejected.inc(1, "subject")
            return
        uri, principals = "", None
        if kind == "resources.updated":
            try:
                event = decode_resource_updated(data)
            except InvalidEnvelope as exc:
                log.debug("dropped %s: %s", subject, exc)
                self.metrics.events_rejected.inc(1, "payload")
                return
            uri = event.uri
            principals = None if event.principals is UNSET else event.principals
        short = EVENT_KINDS[kind][0]
        self.metrics.events_received.inc(1, short)
        if service not in self.announcing and len(self.announcing) < ANNOUNCING_KEPT:
            self.announcing.add(service)
            if self.on_announcing is not None:
                self.on_announcing(service)
        self.fanout.publish_event(service, short, uri, principals)
