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

from collections.abc import Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

SEEN_ONCE = 16_384


class _Missing:
    pass


MISSING: Final = _Missing()  # what `older` gives for a key it does not hold


class HeadMemo(Generic[K, V]):
    """`new` is the newer generation, for a caller's fast path (`memo.new[key]`). On a
    miss there: `older(key)`, and `keep` what it gave back or what the caller made."""

    __slots__ = ("_old", "_old_bytes", "_seen", "limit", "new", "new_bytes")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.new: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self.new_bytes = 0
        self._old_bytes = 0
        self._seen: set[int] = set()  # hashes of keys met once and not remembered

    def __len__(self) -> int:
        """How many entries are remembered."""
        return len(self.new) + len(self._old)

    def held(self) -> int:
        """The memory the entries hold, as their sizes were given to `keep`."""
        return self.new_bytes + self._old_bytes

    def older(self, key: K) -> V | _Missing:
        """The entry under `key` in the older generation, taken out of it (`keep` it)."""
        return self._old.pop(key, MISSING)

    def keep(self, key: K, value: V, size: int, *, again: bool = False) -> None:
        """Remember `value` under `key`, `size` bytes of memory: at once when `again` (it
        came from `older`), else only if `key` came before."""
        if again:
            self._old_bytes -= size
        else:
            seen, fingerprint = self._seen, hash(key)  # bytes cache their hash: no rehash
            if fingerprint not in seen:
                if len(seen) >= SEEN_ONCE:
                    seen.clear()
                seen.add(fingerprint)
                return
        if self.new_bytes + size > self.limit:
            self._old, self.new = self.new, {}
            self._old_bytes, self.new_bytes = self.new_bytes, 0
        self.new[key] = value
        self.new_bytes += size
