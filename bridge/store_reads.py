"""Reads of one key that are believed only from the stream's elected leader.

A read of a replicated bucket asks its stream leader (`STREAM.MSG.GET`, not a direct get
that a lagging follower could answer). But a leader cut off from the other replicas keeps
answering, from a store frozen at the cut, until it notices it lost its quorum (about ten
seconds), while the majority has elected another leader and goes on writing. Its answers
would be old states and false "not found"s.

So a read asks two things at once, the key's last message and the stream's state filtered
to the key, and believes the answer only when that state shows

- a leader that heard from a quorum of its replicas within `LEADER_CONTACT_S`, less than
  JetStream's shortest election timeout (4 s): no other leader can have been elected since,
  so nothing newer was acknowledged anywhere; and
- a last stream sequence at least as new as the newest this process has seen (`StoreView`:
  its own acknowledged writes, earlier answers, the hub's watch).

Otherwise it asks again, backing off, until its deadline, then raises `StoreUnavailable`:
the caller answers the retryable -32603, never a false -32602. Every read costs the same
two requests, found or not (H46's timing class). The hub's read-through and a fleet
server's own reads (`TaskBridge.get`) both read this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js import api
from nats.js.errors import NotFoundError

# How recently the leader must have heard from each replica of a quorum. JetStream's leader
# hears from a follower at least every ~2 s when idle; its followers wait at least 4 s
# without a leader before they elect another.
LEADER_CONTACT_S = 3.0
# How long a read keeps asking for an answer it can believe.
CONFIRM_S = 2.0
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.05, 0.5


class StoreUnavailable(RuntimeError):
    """The store gave no answer this process can believe; the client may retry (H70)."""


@dataclass
class StoreView:
    """The newest stream sequence this process has seen of one stream."""

    seen: int = 0

    def saw(self, seq: int | None) -> None:
        if seq is not None and seq > self.seen:
            self.seen = seq


def leads_with_quorum(info: api.StreamInfo, contact_s: float = LEADER_CONTACT_S) -> bool:
    """Whether the stream's answering leader heard from a quorum within `contact_s`.

    A stream of one replica has no election to lose. A replica never heard from shows no
    `active` time; an `offline` one counts as not heard.
    """
    cluster = info.cluster
    replicas = (cluster.replicas or []) if cluster is not None else []
    if not replicas:
        return True
    bound_ns = contact_s * 1e9
    heard = sum(1 for r in replicas if not r.offline and r.active and r.active <= bound_ns)
    return 1 + heard > (1 + len(replicas)) // 2


def believable(info: api.StreamInfo, view: StoreView) -> bool:
    """An answer from the elected leader, as new as what this process has seen."""
    return info.state.last_seq >= view.seen and leads_with_quorum(info)


async def read_last(
    js: Any,
    stream: str,
    subject: str,
    view: StoreView,
    *,
    deadline_s: float = CONFIRM_S,
    doubted: Callable[[], None] | None = None,
) -> Any:
    """The subject's last raw message, or None if there is none; raises StoreUnavailable
    once `deadline_s` has passed without an answer to believe. `doubted` is called for
    each answer not believed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    pause = _FIRST_PAUSE_S
    while True:
        try:
            raw, info = await asyncio.gather(
                _last_message(js, stream, subject),
                js.stream_info(stream, subjects_filter=subject),
            )
        except Exception as exc:  # no leader for a moment, a timeout, a reconnect
            failure = f"task store unavailable: {type(exc).__name__}"
            cause: Exception | None = exc
        else:
            if believable(info, view):
                view.saw(info.state.last_seq)
                return raw
            if doubted is not None:
                doubted()
            failure = "task store answered from behind this process's view; retry"
            cause = None
        if loop.time() + pause > deadline:
            raise StoreUnavailable(failure) from cause
        await asyncio.sleep(pause)
        pause = min(2 * pause, _MAX_PAUSE_S)


async def _last_message(js: Any, stream: str, subject: str) -> Any:
    try:
        return await js.get_msg(stream, subject=subject, direct=False)
    except NotFoundError:
        return None
