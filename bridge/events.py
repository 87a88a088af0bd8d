"""Fleet change events: a server tells every client listening at the hub that its tools,
prompts or resources changed, or that one resource was updated.

A stateless fleet cannot hold `subscriptions/listen` streams coherently; the hub can. A
server publishes the event once on NATS (`mcp.events.<service>.<kind>`, docs/fleet-events.md)
and the hub delivers the matching notification on every stream that asked for it at that
service's endpoint (`/servers/<service>/mcp`; `default` for the bare `--upstream URL`).
Events are signals, not state: they are not stored, and a stream that was not open misses
nothing it needs (it lists afresh when it opens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from bridge.wire import SERVICE_RE, ResourceUpdated, event_subject

DEFAULT_SERVICE = "default"


class FleetEvents:
    """Publishes one service's change events on a NATS connection (not owned)."""

    def __init__(self, nc: Any, service: str = DEFAULT_SERVICE) -> None:
        if not SERVICE_RE.fullmatch(service):
            raise ValueError(f"service {service!r}: 1-64 of A-Z a-z 0-9 _ -")
        self._nc = nc
        self.service = service

    async def tools_changed(self) -> None:
        await self._publish("tools.list_changed", b"{}")

    async def prompts_changed(self) -> None:
        await self._publish("prompts.list_changed", b"{}")

    async def resources_changed(self) -> None:
        await self._publish("resources.list_changed", b"{}")

    async def resource_updated(self, uri: str, principals: Sequence[str] | None = None) -> None:
        """`notifications/resources/updated {uri}`; `principals` limits who hears of it."""
        event = (
            ResourceUpdated(uri) if principals is None else ResourceUpdated(uri, list(principals))
        )
        await self._publish("resources.updated", msgspec.json.encode(event))

    async def _publish(self, kind: str, data: bytes) -> None:
        await self._nc.publish(event_subject(self.service, kind), data)
        await self._nc.flush()  # on the wire before the caller goes on
