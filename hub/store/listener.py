"""The seam from the store side to the push side: who hears of the snapshot's changes.

The cache (hub/store/cache.py) tells its listener of every accepted revision, removal and
refused value; the NATS source (hub/store/source.py) brackets each batch of changes it
applies and says when the watch restarted after a reconnect. The hub (hub/runtime.py) is
the listener: it hands each change to the fan-out and whoever else waits for it.
"""

from __future__ import annotations

from typing import Protocol

from hub.store.snapshot import Rejected, TaskSnapshot


class Listener(Protocol):
    def changed(self, snapshot: TaskSnapshot) -> None:
        """A newer revision of a task was accepted."""

    def removed(self, snapshot: TaskSnapshot) -> None:
        """A task is gone (deleted, purged or expired); `snapshot` is its last state."""

    def rejected(self, reason: Rejected) -> None:
        """A value read from NATS broke the reader rules and was refused."""

    def hold(self) -> None:
        """A batch of changes begins: deliver them when it ends, together."""

    def release(self) -> None:
        """The batch has ended."""

    def reconnected(self) -> None:
        """The watch restarted after NATS reconnected: what is not stored (fleet events)
        may have been missed."""


class Nobody:
    """A listener that hears nothing: a cache on its own (a first read's worker, a test)."""

    def changed(self, snapshot: TaskSnapshot) -> None:
        pass

    def removed(self, snapshot: TaskSnapshot) -> None:
        pass

    def rejected(self, reason: Rejected) -> None:
        pass

    def hold(self) -> None:
        pass

    def release(self) -> None:
        pass

    def reconnected(self) -> None:
        pass


NOBODY = Nobody()
