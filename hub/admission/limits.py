"""Admission limits: poll rate per caller and task, open streams per caller and in total,
forwarded requests per caller, and the bytes of upstream answers held at once.

Pure bookkeeping with time passed in, so every rule is unit-tested without waiting.
Memory stays bounded: the poll buckets are an LRU of fixed size, and a bucket that has
refilled completely is indistinguishable from a new one, so it is forgotten once it is the
least recently used: the buckets held are those of callers polling now, not every
(caller, task) pair since the hub started.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float
    full_at: float  # when it will have refilled: from then on it is as good as new


class PollLimiter:
    """A token bucket per (principal, task): one token per `pollIntervalMs`, `burst` deep.

    Clients SHOULD poll no faster than `pollIntervalMs` (D20); the burst leaves
    room for retries and several tabs before anyone sees a 429.
    """

    def __init__(self, burst: int, default_interval_s: float, max_keys: int = 100_000) -> None:
        self.burst = burst
        self.default_interval_s = default_interval_s
        self.max_keys = max_keys
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def admit(self, principal: str, task_id: str, interval_s: float | None, now: float) -> float:
        """0 if this poll may proceed, else the seconds to wait (for Retry-After)."""
        interval = self.default_interval_s if interval_s is None else interval_s
        if interval <= 0:
            return 0.0
        key = (principal, task_id)
        buckets = self._buckets
        self._forget_refilled(now)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now, now)
            buckets[key] = bucket
            if len(buckets) > self.max_keys:
                buckets.popitem(last=False)
        else:
            buckets.move_to_end(key)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) / interval)
            bucket.stamp = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            bucket.full_at = now + (self.burst - bucket.tokens) * interval
            return 0.0
        return (1 - bucket.tokens) * interval

    def _forget_refilled(self, now: float) -> None:
        """Drop least recently used buckets that have refilled (at most two a call, so a
        poll never pays for a long sweep; the buckets are used in about the order they
        refill, so two keep up)."""
        buckets = self._buckets
        for _ in (1, 2):
            key = next(iter(buckets), None)
            if key is None or buckets[key].full_at > now:
                return
            del buckets[key]


class StreamLimiter:
    """Counts what each caller holds open (listen streams; forwarded requests in flight)
    per principal and in total."""

    def __init__(self, max_total: int, max_per_principal: int, what: str = "open streams") -> None:
        self.max_total = max_total
        self.max_per_principal = max_per_principal
        self.what = what  # named in the refusals
        self.total = 0
        self._by_principal: defaultdict[str, int] = defaultdict(int)

    def acquire(self, principal: str) -> str | None:
        """Take a slot; returns why not (a message for the caller) when full."""
        if self.total >= self.max_total:
            return f"the hub has reached its limit of {self.max_total} {self.what}"
        if self._by_principal[principal] >= self.max_per_principal:
            return f"limit of {self.max_per_principal} {self.what} per caller reached"
        self.total += 1
        self._by_principal[principal] += 1
        return None

    def release(self, principal: str) -> None:
        self.total -= 1
        self._by_principal[principal] -= 1
        if self._by_principal[principal] <= 0:
            del self._by_principal[principal]

    def open_for(self, principal: str) -> int:
        return self._by_principal.get(principal, 0)


class ByteBudget:
    """Bytes held in memory for upstream answers, over all requests, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold `size` more bytes; False (nothing held) when that would pass the limit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


def retry_after(seconds: float) -> str:
    """A Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
