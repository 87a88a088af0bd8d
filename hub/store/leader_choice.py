"""Which NATS server the hub reads through, and the bucket stream's leader behind it.

A NATS server cut off from the others still answers its clients' PINGs, so nats-py never
leaves it on its own, while every JetStream request through it times out or is answered
by a leader that has lost its quorum. `LeaderChoice.leader_info` asks for the stream's info
until a leader that has its quorum answers: again at once when JetStream announces a new
leader (an ask in flight is dropped: after a node died it would time out), else every
REWATCH_PAUSE_S; and after SWITCH_SERVER_S with no such leader it reconnects to another of
the given servers. `here` names the server the connection is on now, for the watch's own
connection: its deliveries then take the path the hub's requests just proved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api

from bridge.elections import LeaderElected, unless_elected
from bridge.store_reads import leads_with_quorum

log = logging.getLogger("taskhub.nats")

# How often a re-watch asks for a leader with its quorum, between such announcements.
REWATCH_PAUSE_S = 0.5
# How long a re-watch asks through one NATS server before it tries another: past
# JetStream's shortest election (4 s), so a server cut off from the others is left.
SWITCH_SERVER_S = 5.0


class LeaderChoice:
    """Attached to the hub's connection once it is made (`attach`); `on_elected` is the
    callback of JetStream's leader-elected advisory for the stream, `reconnected` is
    called on each reconnect."""

    def __init__(self, servers: list[str], stream: str) -> None:
        self.servers = servers
        self.stream = stream
        self.nc: NatsClient | None = None
        self.js: Any = None
        self.closing = False
        self._elected = asyncio.Event()  # a new bucket stream leader was announced
        self._leaving: tuple[str, int] | None = None  # a server we reconnect away from; draws
        self._reconnects: set[asyncio.Task[None]] = set()

    def attach(self, nc: NatsClient, js: Any) -> None:
        self.nc, self.js = nc, js

    async def on_elected(self, msg: Msg) -> None:
        """JetStream's advisory: the bucket stream has a new leader."""
        log.info("bucket stream leader elected: %s", msg.data[:200].decode(errors="replace"))
        self._elected.set()

    async def leader_info(self) -> api.StreamInfo:
        """The bucket stream's info from a leader that has its quorum."""
        asking_since = time.monotonic()
        while True:
            if time.monotonic() - asking_since > SWITCH_SERVER_S:
                asking_since = time.monotonic()
                await self._switch_server()
            self._elected.clear()
            try:
                info: api.StreamInfo = await unless_elected(
                    self.js.stream_info(self.stream), self._elected
                )
            except LeaderElected:
                continue
            except Exception as exc:  # no leader yet, a timeout, a reconnect
                log.debug("bucket stream info failed during a re-watch: %s", exc)
            else:
                if leads_with_quorum(info):
                    return info
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REWATCH_PAUSE_S):
                    await self._elected.wait()

    def here(self) -> list[str]:
        """The server the hub's connection is on (all of them while it is on none)."""
        nc = self.nc
        if nc is None or nc.connected_url is None or not nc.is_connected:
            return self.servers
        return [nc.connected_url.geturl()]

    def reconnected(self) -> None:
        """After a reconnect: if nats-py drew the server we are leaving again, draw once
        more (at most once per other server)."""
        nc, leaving = self.nc, self._leaving
        here = nc.connected_url.netloc if nc is not None and nc.connected_url else None
        if leaving is not None and here == leaving[0] and leaving[1] < len(self.servers):
            self._leaving = (leaving[0], leaving[1] + 1)
            asyncio.get_running_loop().call_later(0.05, self._reconnect_again)
        else:
            self._leaving = None

    async def _switch_server(self) -> None:
        """Our NATS server has shown no leader with its quorum for SWITCH_SERVER_S: it may
        be cut off from the others, answering PINGs all the while. Reconnect to another
        of the given servers (nats-py takes the next in its pool)."""
        nc = self.nc
        if nc is None or len(self.servers) < 2 or not nc.is_connected:
            return
        log.warning(
            "no bucket stream leader with its quorum through %s for %.0f s; "
            "reconnecting to another NATS server",
            nc.connected_url.netloc if nc.connected_url else "?",
            SWITCH_SERVER_S,
        )
        self._leaving = (nc.connected_url.netloc if nc.connected_url else "", 1)
        await nc.force_reconnect()

    def _reconnect_again(self) -> None:
        if self.nc is not None and not self.closing:
            task = asyncio.ensure_future(self.nc.force_reconnect())
            self._reconnects.add(task)
            task.add_done_callback(self._reconnects.discard)
