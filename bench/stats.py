"""Small statistics shared by the orchestrator and the load generators: medians, percentiles.

Percentiles use the nearest-rank rule on the sorted samples, so a p99.9 of a thousand
samples is the largest one, never an interpolated value that no client saw.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

Metrics = dict[str, float]  # one scenario's figures by name


def medians(runs: list[Metrics]) -> Metrics:
    """The median of each figure over the repetitions."""
    return {key: median([run[key] for run in runs if key in run]) for key in runs[0]}


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q ≤ 100) of already sorted samples; 0 if none."""
    if not sorted_samples:
        return 0.0
    # Rounded first: 99.9 / 100 * 1000 is 999.0000000000001 in floating point.
    rank = max(1, math.ceil(round(q * len(sorted_samples) / 100, 9)))
    return float(sorted_samples[rank - 1])


def latency_summary(samples_ns: list[int], prefix: str = "") -> dict[str, float]:
    """p50/p99/p99.9 and count of nanosecond samples, in milliseconds."""
    ordered = sorted(samples_ns)
    return {
        f"{prefix}p50_ms": percentile(ordered, 50) / 1e6,
        f"{prefix}p99_ms": percentile(ordered, 99) / 1e6,
        f"{prefix}p999_ms": percentile(ordered, 99.9) / 1e6,
        f"{prefix}samples": float(len(ordered)),
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0
