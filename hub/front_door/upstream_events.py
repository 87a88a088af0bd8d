"""List changes of an upstream that does not announce them over NATS: its own listen, held.

A listen stream at an upstream's endpoint may ask for `toolsListChanged`,
`promptsListChanged`, `resourcesListChanged` and `resourceSubscriptions`. A fleet that
announces those on NATS (docs/fleet-events.md) needs nothing more. For any other upstream
the hub holds the upstream's own `subscriptions/listen`, one per upstream, granted filters
and credential, shared by every stream of the hub's that asked for the same with the same
credential, and relays each change it sends to exactly those streams. It is opened with
the first such stream's headers, closed with the last, and opened again (after a pause
that grows to `RETRY_MAX_S`) when the upstream ends it or it breaks. An upstream that
answers the listen with anything but a stream has declined: those streams get nothing
from it. Once a service has announced on NATS, its upstream listens are let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bridge.wire import EVENT_KINDS
from hub.front_door.upstream import Declined, Upstream, UpstreamError
from hub.front_door.upstream_tasks import Caller, own_request_headers
from hub.push.fanout import Fanout
from hub.push.subscriber import Subscriber
from hub.rpc.request import LIST_CHANGED_FILTERS

log = logging.getLogger("taskhub.upstream_events")

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
_KINDS = {method: kind for kind, method in EVENT_KINDS.values()}  # method → kind
Key = tuple[str, tuple[str, ...], tuple[str, ...], str]  # upstream, kinds, URIs, credential


@dataclass
class _Held:
    """One listen of the hub's at an upstream, and the hub's streams it serves."""

    kinds: tuple[str, ...]
    uris: tuple[str, ...]
    subscribers: set[Subscriber] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class UpstreamEvents:
    def __init__(self, fanout: Fanout, announcing: set[str]) -> None:
        self.fanout = fanout
        self.announcing = announcing  # services that announce over NATS (fleet_events.py)
        self._held: dict[Key, _Held] = {}

    def follow(
        self, upstream: Upstream, subscriber: Subscriber, granted: dict[str, Any], caller: Caller
    ) -> Callable[[], None]:
        """Relay the upstream's changes of the `granted` filters to `subscriber` (unless its
        service announces over NATS); returns the function that stops it."""
        label = upstream.spec.label
        kinds = tuple(kind for name, kind in LIST_CHANGED_FILTERS.items() if granted.get(name))
        uris = tuple(sorted(granted.get("resourceSubscriptions", ())))
        if label in self.announcing or not (kinds or uris):
            return _nothing
        key = (label, kinds, uris, caller.credential)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(kinds, uris)
        held.subscribers.add(subscriber)
        if held.task is None:
            held.task = asyncio.create_task(self._hold(upstream, key, held, caller))

        def unfollow() -> None:
            held.subscribers.discard(subscriber)
            if not held.subscribers:
                self._let_go(key, held)

        return unfollow

    def announced(self, service: str) -> None:
        """`service` announces on NATS now: its upstream listens are no longer needed."""
        for key, held in list(self._held.items()):
            if key[0] == service:
                self._let_go(key, held)

    async def stop(self) -> None:
        tasks = [held.task for held in self._held.values() if held.task is not None]
        self._held.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _let_go(self, key: Key, held: _Held) -> None:
        if self._held.get(key) is held:
            del self._held[key]
        if held.task is not None:
            held.task.cancel()

    async def _hold(self, upstream: Upstream, key: Key, held: _Held, caller: Caller) -> None:
        notifications: dict[str, Any] = {
            name: True for name, kind in LIST_CHANGED_FILTERS.items() if kind in held.kinds
        }
        if held.uris:
            notifications["resourceSubscriptions"] = list(held.uris)
        body = msgspec.json.encode(
            {
                "jsonrpc": "2.0",
                "id": "taskhub-listen",
                "method": "subscriptions/listen",
                "params": {"notifications": notifications, "_meta": caller.meta},
            }
        )
        headers = own_request_headers(caller.headers, b"subscriptions/listen", None)
        pause = RETRY_MIN_S
        while held.subscribers:
            try:
                async for message in upstream.messages(body, headers, caller.caller):
                    pause = RETRY_MIN_S  # it answered: the next break starts afresh
                    self._relay(held, message)
            except Declined as exc:
                log.info("upstream %s declines listening for %s: %s", key[0], held.kinds, exc)
                return
            except UpstreamError as exc:
                log.debug("upstream %s listen broke: %s", key[0], exc)
            except Exception as exc:  # a 429 of the caller's slots, among others
                log.debug("upstream %s listen not held: %s", key[0], exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX_S)

    def _relay(self, held: _Held, message: dict[str, Any]) -> None:
        kind = _KINDS.get(message.get("method"))  # type: ignore[arg-type]
        if kind is None:
            return  # its ack, task notifications (none asked), the end
        uri = ""
        if kind == "resource":
            params = message.get("params")
            uri = params.get("uri") if isinstance(params, dict) else None  # type: ignore[assignment]
            if uri not in held.uris:
                return  # not one asked for
        elif kind not in held.kinds:
            return
        self.fanout.deliver_event(list(held.subscribers), kind, uri)


def _nothing() -> None:
    return None
