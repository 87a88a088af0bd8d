"""Prometheus metrics, rendered in the text exposition format for `GET /metrics`.

A handful of counters and gauges does not justify a client library: these are plain
objects created with the hub, incremented on hot paths without locks (one event loop).
"""

from __future__ import annotations

from collections.abc import Callable


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    pairs = ",".join(
        f'{name}="{value.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for name, value in zip(names, values, strict=True)
    )
    return "{" + pairs + "}"


class Counter:
    kind = "counter"

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = labels
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def samples(self) -> list[str]:
        return [
            f"{self.name}{_labels(self.label_names, key)} {value:g}"
            for key, value in sorted(self.values.items())
        ]


class Gauge:
    kind = "gauge"

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help
        self._value = 0.0
        self._read: Callable[[], float] | None = None

    def track(self, read: Callable[[], float]) -> None:
        """Read the value at scrape time instead of keeping it up to date."""
        self._read = read

    def set(self, value: float) -> None:
        self._value = value

    def value(self) -> float:
        return self._read() if self._read is not None else self._value

    def samples(self) -> list[str]:
        return [f"{self.name} {self.value():g}"]


class LabelledGauge(Counter):
    """A gauge per label value, set as things change (`taskhub_upstream_up{upstream}`)."""

    kind = "gauge"

    def set(self, value: float, *labels: str) -> None:
        self.values[labels] = value


class Metrics:
    def __init__(self) -> None:
        self.requests = Counter(
            "taskhub_requests_total",
            "POST /mcp messages by method and outcome",
            ("method", "outcome"),
        )
        self.notifications_sent = Counter(
            "taskhub_notifications_sent_total",
            "notifications written to listen streams (task states and fleet events)",
        )
        self.coalesced_frames = Counter(
            "taskhub_coalesced_frames_total",
            "unsent task snapshots replaced by a newer revision for a slow stream",
        )
        self.events_received = Counter(
            "taskhub_fleet_events_total",
            "fleet change events received from NATS, by kind",
            ("kind",),
        )
        self.events_rejected = Counter(
            "taskhub_fleet_events_rejected_total",
            "fleet change events dropped (bad subject or payload), by reason",
            ("reason",),
        )
        self.kv_updates = Counter(
            "taskhub_kv_updates_total", "task revisions accepted into the snapshot cache"
        )
        self.kv_rejected = Counter(
            "taskhub_kv_rejected_total", "KV values refused by the reader rules", ("reason",)
        )
        self.read_through = Counter(
            "taskhub_read_through_total", "cache misses read from the KV leader", ("found",)
        )
        self.stale_reads = Counter(
            "taskhub_stale_reads_total",
            "read-through misses answered from behind the hub's view, asked again",
        )
        self.rewatches = Counter(
            "taskhub_nats_rewatches_total", "bucket watches resumed after a NATS reconnect"
        )
        self.streams_closed = Counter(
            "taskhub_streams_closed_total", "listen streams ended, by reason", ("reason",)
        )
        # Which way the work went (hub/http/connection.py): operators see the fast paths are on.
        self.answered_in_place = Counter(
            "taskhub_answered_in_place_total",
            "POST /mcp requests answered by the connection, without an ASGI task",
        )
        self.streams_opened = Counter(
            "taskhub_streams_opened_total",
            "listen streams opened, by writer (in_place: the connection's own, no task; "
            "direct: a task with direct socket writes; asgi: ASGI send)",
            ("writer",),
        )
        # The front door (hub/front_door/upstream.py).
        self.upstream_requests = Counter(
            "taskhub_upstream_requests_total",
            "requests forwarded to an upstream MCP server, by upstream and outcome",
            ("upstream", "outcome"),
        )
        self.upstream_faults = Counter(
            "taskhub_upstream_faults_total",
            "forwards that got no usable answer, by upstream and fault",
            ("upstream", "fault"),
        )
        self.upstream_up = LabelledGauge(
            "taskhub_upstream_up",
            "1 when the upstream's last answer was usable, 0 when it failed, -1 before any",
            ("upstream",),
        )
        self.limited = Counter("taskhub_limited_total", "requests refused by a limit", ("limit",))
        self.open_streams = Gauge(
            "taskhub_open_streams", "open subscriptions/listen and operator streams"
        )
        self.operator_streams = Gauge("taskhub_operator_streams", "open operator streams")
        self.cached_tasks = Gauge("taskhub_cached_tasks", "tasks in the snapshot cache")
        self.ready = Gauge("taskhub_ready", "1 when NATS is connected and the cache caught up")
        # Durability the hub can observe (hub/store/source.py, read at start-up).
        self.bucket_replicas = Gauge(
            "taskhub_bucket_replicas", "replicas of the task bucket's stream (0 before known)"
        )
        self.control_replicas = Gauge(
            "taskhub_control_replicas", "replicas of the control stream (0 before known)"
        )
        self.nats_sync_always = Gauge(
            "taskhub_nats_sync_always",
            "1 when NATS fsyncs every write before its ack, 0 when it syncs on an interval, "
            "-1 when unknown",
        )
        self.nats_sync_always.set(-1)
        # The checkpoint (--checkpoint): alert on its age, time() minus this.
        self.checkpoint_written = Gauge(
            "taskhub_checkpoint_written_seconds",
            "Unix time the last checkpoint was written (0: none since start)",
        )
        self.checkpoint_failures = Counter(
            "taskhub_checkpoint_failures_total", "checkpoints that failed to be written"
        )

    def render(self) -> bytes:
        lines: list[str] = []
        for metric in vars(self).values():
            if isinstance(metric, Counter | Gauge):
                lines.append(f"# HELP {metric.name} {metric.help}")
                lines.append(f"# TYPE {metric.name} {metric.kind}")
                lines.extend(metric.samples())
        return ("\n".join(lines) + "\n").encode()
