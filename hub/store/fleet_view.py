"""The fleet as an operator sees it: per server, its tasks, its last write, the control
messages waiting for it, and whether it looks silent (docs/dashboard.md, `fleet` events).

Task counts come from the cache (hub/store/cache.py keeps them per server). Last writes are the
hub's own clock when it accepted a revision, counted only once the watch has caught up, so
a restart does not pass old history off as fresh writes; before a server's first write the
hub's start stands in. Waiting control messages are the server's subject count in the work
queue `MCP_TASKS_CTL` (one `STREAM.INFO`, every `FLEET_EVERY_S` while an operator stream is
open): a message stays there until the server's consumer acknowledges it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from bridge.wire import CONTROL_STREAM, CONTROL_SUBJECT_PREFIX
from hub.store.cache import TaskCache
from hub.store.snapshot import TaskSnapshot

FLEET_EVERY_S = 2.0
CONTROL_INFO_TIMEOUT_S = 1.0
CONTROL_WAIT_S = 10.0  # control messages waiting longer than this make a server silent


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


class FleetView:
    def __init__(
        self, cache: TaskCache, silent_after: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._cache = cache
        self._silent_after = silent_after
        self._clock = clock
        self._since = clock()  # stands in for the last write of a server not seen writing
        self._last_write: dict[str, float] = {}
        # server → (messages waiting, since when the count has been above zero)
        self._waiting: dict[str, tuple[int, float]] = {}
        self._control_known = False
        self.counting = False  # set once the watch caught up

    def wrote(self, snapshot: TaskSnapshot) -> None:
        """A revision of `snapshot.server`'s was accepted (after catch-up: a real write)."""
        if self.counting:
            self._last_write[snapshot.server] = self._clock()

    def start_counting(self) -> None:
        if not self.counting:
            self.counting = True
            self._since = self._clock()

    async def refresh_control(self, js: Any) -> None:
        """Read the waiting control messages per server; unknown if NATS does not say."""
        try:
            info = await asyncio.wait_for(
                js.stream_info(CONTROL_STREAM, subjects_filter=CONTROL_SUBJECT_PREFIX + ">"),
                CONTROL_INFO_TIMEOUT_S,
            )
        except Exception:  # no leader, a timeout, a reconnect: say "unknown", not zero
            self._control_known = False
            return
        now = self._clock()
        counts = {
            subject.removeprefix(CONTROL_SUBJECT_PREFIX): count
            for subject, count in (info.state.subjects or {}).items()
            if count
        }
        self._waiting = {
            server: (count, self._waiting.get(server, (0, now))[1])
            for server, count in counts.items()
        }
        self._control_known = True

    def servers(self) -> list[dict[str, Any]]:
        """One entry per server with a task in the snapshot or control messages waiting."""
        now = self._clock()
        counts = self._cache.server_counts()
        entries = []
        for server in sorted(counts.keys() | self._waiting.keys()):
            tasks, active = counts.get(server, (0, 0))
            last_write = self._last_write.get(server)
            waiting, waiting_since = self._waiting.get(server, (0, None))
            reason = None
            idle = now - (self._since if last_write is None else last_write)
            if waiting and waiting_since is not None and now - waiting_since > CONTROL_WAIT_S:
                plural = "s" if waiting > 1 else ""
                reason = (
                    f"{waiting} control message{plural} waiting for {now - waiting_since:.0f} s"
                )
            elif active and idle > self._silent_after:
                plural = "s" if active > 1 else ""
                reason = f"no write for {idle:.0f} s with {active} active task{plural}"
            entries.append(
                {
                    "server": server,
                    "tasks": tasks,
                    "active": active,
                    "lastWriteAt": _ms(last_write),
                    "controlWaiting": waiting if self._control_known else None,
                    "waitingSince": _ms(waiting_since) if waiting else None,
                    "silent": reason is not None,
                    "reason": reason,
                }
            )
        return entries
