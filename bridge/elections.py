"""JetStream leader elections: where they are announced, and an ask raced against one.

When the node leading a stream or a consumer dies or is cut off, a request to it waits
out its whole timeout; JetStream announces the leader the others elect on an advisory
subject. Whoever listens there (the hub's re-watch, the bridge's control consumer) drops
the ask in flight when the announcement comes first and asks the new leader at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

# A newly elected stream leader is announced on this subject, the stream's name following;
# a consumer's on the next, followed by `<stream>.<consumer>`.
STREAM_LEADER_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED."
CONSUMER_LEADER_ELECTED = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED."

T = TypeVar("T")


class LeaderElected(Exception):
    """A new leader was announced before the answer came: ask it instead."""


async def unless_elected(ask: Awaitable[T], elected: asyncio.Event) -> T:
    """`ask`'s answer, unless `elected` is set first: then the ask is dropped (cancelled
    and awaited, its outcome ignored) and LeaderElected raised. The caller clears
    `elected` before it asks. Cancelled meanwhile, it drops the ask too."""
    asking = asyncio.ensure_future(ask)
    waiting = asyncio.ensure_future(elected.wait())
    try:
        await asyncio.wait({asking, waiting}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        asking.cancel()
        asking.add_done_callback(retrieved)  # it may have failed meanwhile
        raise
    finally:
        waiting.cancel()
    if not asking.done():
        asking.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asking
        raise LeaderElected
    return asking.result()


def retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a dropped task's outcome seen (a closed connection's error is expected)."""
    if not task.cancelled():
        task.exception()
