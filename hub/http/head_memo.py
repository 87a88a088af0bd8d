"""What request heads turned into, remembered for the next request with the same head.

A client sends the same head with each request, so the hub reads a head once and keeps
what it made of it (hub/http/whole_post.py: the parse; hub/front_door/forwarding.py: the
head sent upstream). Two rules keep that bounded and worth its memory:

- Only heads that come again are remembered. The first time, only the head's hash is
  kept (about 64 bytes, at most `SEEN_ONCE` of them, then forgotten all at once): a task
  polled once, or a client whose every head is new (a trace id in each request, or a
  hostile one), leaves no parse behind.
- Two generations of at most `limit` bytes each, as the caller estimates what an entry
  holds in memory (not its head's length), so a working set just over one generation
  does not miss on every read: an entry found in the older one moves to the newer; when
  the newer fills, it becomes the older and the oldest are forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

SEEN_ONCE = 16_384


class Missing:
    pass


MISSING: Final = Missing()  # what `recall` gives for a key it does not hold


def estimate(head_bytes: int, fields: int) -> int:
    """What remembering a head and what it turned into holds in memory, in a few
    operations (it runs on every miss): the head and its fields about three times over,
    with about 256 bytes of objects around each field. tests/test_whole_post.py and
    tests/test_forwarding.py check it against tracemalloc."""
    return 3 * head_bytes + 256 * fields + 512


class HeadMemo(Generic[K, V]):
    """`new` is the newer generation, for a caller's fast path (`memo.new[key]`). On a
    miss there: `recall(key)`, else `keep` what the caller made. `size(key, value)` is
    what an entry holds in memory (`estimate`)."""

    __slots__ = ("_old", "_old_bytes", "_seen", "_size", "limit", "new", "new_bytes")

    def __init__(self, limit: int, size: Callable[[K, V], int]) -> None:
        self.limit = limit
        self._size = size
        self.new: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self.new_bytes = 0
        self._old_bytes = 0
        self._seen: set[int] = set()  # hashes of keys met once and not remembered

    def __len__(self) -> int:
        """How many entries are remembered."""
        return len(self.new) + len(self._old)

    def held(self) -> int:
        """The memory the entries hold, as `size` counts it."""
        return self.new_bytes + self._old_bytes

    def recall(self, key: K) -> V | Missing:
        """The entry under `key` in the older generation, moved to the newer; else MISSING."""
        value = self._old.pop(key, MISSING)
        if not isinstance(value, Missing):
            size = self._size(key, value)
            self._old_bytes -= size
            self._put(key, value, size)
        return value

    def keep(self, key: K, value: V) -> None:
        """Remember `value` under `key` if `key` came before (else only its hash)."""
        seen, fingerprint = self._seen, hash(key)  # a bytes key's hash is cached: no rehash
        if fingerprint not in seen:
            if len(seen) >= SEEN_ONCE:
                seen.clear()
            seen.add(fingerprint)
            return
        self._put(key, value, self._size(key, value))

    def _put(self, key: K, value: V, size: int) -> None:
        if self.new_bytes + size > self.limit:
            self._old, self.new = self.new, {}
            self._old_bytes, self.new_bytes = self.new_bytes, 0
        self.new[key] = value
        self.new_bytes += size
