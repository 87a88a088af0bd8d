"""The operation history of one chaos run: everything the invariants are checked over.

Times are `time.monotonic()`. Recorded: every write attempted and acknowledged (task id,
status, statusMessage, time), every create whose outcome was unknown, every listen session
(hub, ids requested and granted, whether the hub answered /readyz 200 just before, every
frame, how it ended), every tasks/get answer, every fault with start/end, /readyz rounds
over both hubs, and resource samples.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

State = tuple[str, str | None]  # (status, statusMessage)


@dataclass
class Ack:
    at: float
    status: str
    message: str | None
    task: dict[str, Any]  # the stored DetailedTask as a client would see it


@dataclass
class Frame:
    at: float
    task_id: str
    status: str
    message: str | None
    params: dict[str, Any]  # notification params minus _meta
    meta_ok: bool


@dataclass
class Session:
    follower: int
    request_id: str
    hub: int
    ready_before: bool
    started: float
    requested: list[str]
    granted: list[str] | None = None
    frames: list[Frame] = field(default_factory=list)
    ended: float | None = None
    end: str = ""  # why it ended: done, churn, eof, silent, http 503, ...


@dataclass
class GetAnswer:
    at: float
    hub: int
    task_id: str
    ready_before: bool
    final: bool  # the after-the-run read
    code: int | None  # JSON-RPC error code, or None for a result
    status: str | None = None
    message: str | None = None
    task: dict[str, Any] | None = None


@dataclass
class FaultRecord:
    index: int
    kind: str
    target: int
    started: float
    ended: float = 0.0
    settled: float = 0.0  # cluster current and every live hub ready again
    note: str = ""


@dataclass
class History:
    t0: float = field(default_factory=time.monotonic)
    attempted: dict[str, set[State]] = field(default_factory=lambda: defaultdict(set))
    acks: dict[str, list[Ack]] = field(default_factory=lambda: defaultdict(list))
    created_at: dict[str, float] = field(default_factory=dict)  # create acked
    index_of: dict[str, int] = field(default_factory=dict)
    unknown_creates: dict[str, float] = field(default_factory=dict)  # CreateOutcomeUnknown
    resolved_unknown: dict[str, bool | None] = field(default_factory=dict)  # id → stored?
    write_retries: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    nats_client_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sessions: list[Session] = field(default_factory=list)
    activity: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    terminal_seen: dict[int, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    followed: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    gets: list[GetAnswer] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    ready_rounds: list[tuple[float, list[bool | None]]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    consumer_counts: list[tuple[float, int]] = field(default_factory=list)
    hub_restarts: list[tuple[float, int, int]] = field(default_factory=list)  # (t, hub, pid)
    notes: list[str] = field(default_factory=list)
    # At the reads after the run (a soak's tasks have a TTL): tasks well past it, read and
    # expected gone (-32602), and tasks too near it to expect either, not read.
    gone: set[str] = field(default_factory=set)
    near_expiry: set[str] = field(default_factory=set)

    def rel(self, at: float) -> float:
        return round(at - self.t0, 3)

    def attempt(self, task_id: str, status: str, message: str | None) -> None:
        self.attempted[task_id].add((status, message))

    def ack(self, task_id: str, task: dict[str, Any]) -> None:
        self.acks[task_id].append(
            Ack(time.monotonic(), task["status"], task.get("statusMessage"), task)
        )

    def last_ack(self, task_id: str) -> Ack | None:
        acks = self.acks.get(task_id)
        return acks[-1] if acks else None

    def dump(self, path: Path) -> None:
        """The history as JSON (frames without their full params, to stay readable)."""
        rel = self.rel
        data = {
            "writes": {
                task_id: [[rel(a.at), a.status, a.message] for a in acks]
                for task_id, acks in self.acks.items()
            },
            "attempted": {k: sorted(map(list, v), key=str) for k, v in self.attempted.items()},
            "unknown_creates": {k: rel(v) for k, v in self.unknown_creates.items()},
            "resolved_unknown": self.resolved_unknown,
            "write_retries": dict(self.write_retries),
            "nats_client_errors": dict(self.nats_client_errors),
            "sessions": [
                {
                    "follower": s.follower,
                    "request_id": s.request_id,
                    "hub": s.hub,
                    "ready_before": s.ready_before,
                    "started": rel(s.started),
                    "ended": None if s.ended is None else rel(s.ended),
                    "end": s.end,
                    "requested": s.requested,
                    "granted": s.granted,
                    "frames": [[rel(f.at), f.task_id, f.status, f.message] for f in s.frames],
                }
                for s in self.sessions
            ],
            "gets": [
                [rel(g.at), g.hub, g.task_id, g.ready_before, g.final, g.code, g.status, g.message]
                for g in self.gets
            ],
            "faults": [
                {
                    "index": f.index,
                    "kind": f.kind,
                    "target": f.target,
                    "started": rel(f.started),
                    "ended": rel(f.ended),
                    "settled": rel(f.settled),
                    "note": f.note,
                }
                for f in self.faults
            ],
            "ready_rounds": [[rel(t), states] for t, states in self.ready_rounds],
            "resources": self.resources,
            "consumer_counts": [[rel(t), n] for t, n in self.consumer_counts],
            "hub_restarts": [[rel(t), hub, pid] for t, hub, pid in self.hub_restarts],
            "notes": self.notes,
            "gone": sorted(self.gone),
            "near_expiry": sorted(self.near_expiry),
        }
        path.write_text(json.dumps(data))
