"""The invariants, checked over a finished run's `History`: one function per check.

Each returns a `Check`: how many times it was checked, how many checks failed, and the
first five failures as examples. None has slack for faults beyond what it states (a
-32603 answer within a fault window plus `FAULT_GRACE_S`, a hub that was not ready, an
unknown create); what that excuses is counted under "allowed".
tests/test_chaos_invariants.py feeds each check the violation it exists for.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hub.rpc.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from tests.chaos.history import GetAnswer, History, Session
from tests.chaos.workload import ENDINGS, NO_ANSWER, rank

# A -32603 is excused from a fault's start until this long after it settled: a read the hub
# began before that may go on asking NATS for CONFIRM_MISS_S, its last ask waiting up to one
# request timeout (hub/store/source.py, 2 s each).
FAULT_GRACE_S = 5.0
HUB_RSS_CAP_MB = 128.0  # every sample of every hub
# Growth after warm-up: the least-squares slope over the samples from WARMUP_S after a
# process's first sample (the run's start, for the consumer count) to the end, checked only
# when those span MIN_SPAN_S (a soak): a shorter series says too little per hour.
WARMUP_S = 600.0
MIN_SPAN_S = 600.0
# Per hub process. The soak's tasks expire (tests/chaos/run.py SOAK_TTL_MS), so after
# warm-up a hub holds a steady number of them and every cache it keeps is bounded: what is
# left to grow is a leak. 10 MB/h is ~3 KB per task written.
RSS_GROWTH_LIMIT_MB_PER_H = 10.0
FDS_GROWTH_LIMIT_PER_H = 60.0  # per hub process; open streams come and go around it
CONSUMER_GROWTH_LIMIT_PER_H = 6.0  # the bucket stream's consumers

_ERROR_CODE = re.compile(r'"code"\s*:\s*(-?\d+)')


@dataclass
class Check:
    name: str
    description: str
    checks: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def ok(self, condition: bool, example: str) -> None:
        self.checks += 1
        if not condition:
            self.violations += 1
            if len(self.examples) < 5:
                self.examples.append(example)

    def to_json(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "checks": self.checks,
            "violations": self.violations,
            "examples": self.examples,
        }


@dataclass
class Outcome:
    """What the checks look at: the history and how the run ended."""

    history: History
    final_hubs: list[int]  # the hubs alive after the run, each read for final-state
    consumer_settle: tuple[int, int, float] | None  # (consumers, live hubs, seconds waited)
    run_errors: list[str]
    allowed: Counter[str] = field(default_factory=Counter)  # what faults excused


def in_fault_window(history: History, at: float) -> bool:
    """`at` is within a fault: from its start until FAULT_GRACE_S after it settled."""
    for f in history.faults:
        end = max(f.ended, f.settled) or math.inf  # neither: the run ended during the fault
        if f.started <= at <= end + FAULT_GRACE_S:
            return True
    return False


def _is_the_task(history: History, g: GetAnswer) -> bool:
    """A found answer is the task asked for: its id, its creation time, a written state."""
    acks = history.acks.get(g.task_id)
    task = g.task or {}
    return (
        bool(acks)
        and task.get("taskId") == g.task_id
        and task.get("createdAt") == acks[0].task.get("createdAt")
        and (task.get("status"), task.get("statusMessage")) in history.attempted.get(g.task_id, ())
    )


def _listen_error(s: Session) -> int | None:
    """The JSON-RPC error code a listen was answered with instead of a stream, if any."""
    if not s.end.startswith(("not a stream", "http")):
        return None
    match = _ERROR_CODE.search(s.end)
    return None if match is None else int(match.group(1))


def _excused(o: Outcome, code: int, at: float, what: str) -> bool:
    """An error answer from a ready hub: only a -32603 within a fault window is excused."""
    if code == INTERNAL_ERROR and in_fault_window(o.history, at):
        o.allowed[f"{what} -32603 on a ready hub, in a fault window"] += 1
        return True
    return False


def create_found(o: Outcome) -> Check:
    history, rel = o.history, o.history.rel
    check = Check(
        "create-found",
        "every acked create is found on every hub that answered /readyz 200 just before: "
        "tasks/get answers that task (id, createdAt, a written state), a listen grants it; "
        f"-32603 only within a fault window + {FAULT_GRACE_S:g} s; a found answer is the "
        "task asked for on any hub",
    )
    for g in history.gets:
        if g.final or g.code == NO_ANSWER or g.task_id not in history.created_at:
            continue
        where = (
            f"t={rel(g.at)} hub {g.hub} tasks/get {g.task_id} "
            f"(created t={rel(history.created_at[g.task_id])})"
        )
        if g.code is None:
            check.ok(_is_the_task(history, g), f"{where}: answered {g.task}")
        elif not g.ready_before:
            if g.code == INTERNAL_ERROR:
                o.allowed["tasks/get -32603 on a hub not ready"] += 1
        else:
            check.ok(_excused(o, g.code, g.at, "tasks/get"), f"{where}: {g.code} {g.message}")
    for s in history.sessions:
        where = f"t={rel(s.started)} hub {s.hub} listen {s.request_id}"
        if s.granted is None:
            code = _listen_error(s)
            if code is None:
                continue  # no JSON-RPC answer: reset, stalled, hub down
            if not s.ready_before:
                if code == INTERNAL_ERROR:
                    o.allowed["listen -32603 on a hub not ready"] += 1
                continue
            answered = s.ended if s.ended is not None else s.started
            check.ok(_excused(o, code, answered, "listen"), f"{where}: {s.end}")
            continue
        for task_id in s.requested:
            if s.ready_before:
                check.ok(task_id in s.granted, f"{where}: {task_id} not granted")
            elif task_id not in s.granted:
                o.allowed["not granted by a hub not ready"] += 1
    return check


def final_state(o: Outcome) -> Check:
    history = o.history
    check = Check(
        "final-state",
        "tasks/get after the run, on every hub, equals the last acknowledged write "
        "(-32602 for a task past its TTL)",
    )
    expected = {
        t: acks[-1].task
        for t, acks in history.acks.items()
        if acks and t not in history.near_expiry
    }
    for g in history.gets:
        if not g.final:
            continue
        if g.task_id in history.gone:
            check.ok(
                g.code == INVALID_PARAMS,
                f"hub {g.hub} {g.task_id}: past its TTL, got {g.code} {g.task} want -32602",
            )
            continue
        want = expected.get(g.task_id)
        check.ok(
            g.code is None and g.task == want,
            f"hub {g.hub} {g.task_id}: got {g.code} {g.task} want {want}",
        )
    answered = {(g.hub, g.task_id) for g in history.gets if g.final}
    for task_id in expected:
        for hub in o.final_hubs:
            if (hub, task_id) not in answered:
                check.ok(False, f"hub {hub} {task_id}: never read after the run")
    return check


def terminal_seen(o: Outcome) -> Check:
    history = o.history
    check = Check(
        "terminal-seen",
        "every subscriber following a task sees its terminal state, equal to the acknowledged one",
    )
    for follower, ids in history.followed.items():
        seen = history.terminal_seen.get(follower, {})
        for task_id in ids:
            ack = history.last_ack(task_id)
            got, want = seen.get(task_id), None if ack is None else ack.task
            check.ok(
                got is not None and got == want,
                f"follower {follower} {task_id}: got {got} want {want}",
            )
    return check


def never_written(o: Outcome) -> Check:
    history, rel = o.history, o.history.rel
    check = Check(
        "never-written",
        "no observed state (frame or tasks/get) that was never written (status + statusMessage)",
    )
    for s in history.sessions:
        for f in s.frames:
            check.ok(
                (f.status, f.message) in history.attempted.get(f.task_id, set()),
                f"t={rel(f.at)} hub {s.hub} {s.request_id}: {f.task_id} {f.status} {f.message!r}",
            )
    for g in history.gets:
        if g.code is None:
            check.ok(
                (g.status, g.message) in history.attempted.get(g.task_id, set()),
                f"t={rel(g.at)} hub {g.hub} get {g.task_id}: {g.status} {g.message!r}",
            )
    return check


def after_terminal(o: Outcome) -> Check:
    rel = o.history.rel
    check = Check("after-terminal", "no frame for a task after its terminal frame, per stream")
    for s in o.history.sessions:
        done: set[str] = set()
        for f in s.frames:
            check.ok(
                f.task_id not in done,
                f"t={rel(f.at)} hub {s.hub} {s.request_id} {f.task_id}: "
                f"{f.status} {f.message!r} after terminal",
            )
            if f.status in ENDINGS:
                done.add(f.task_id)
    return check


def monotonic(o: Outcome) -> Check:
    rel = o.history.rel
    check = Check("monotonic", "per stream, a task's progress rank never decreases")
    # Across streams (a re-listen's snapshot older than a frame an earlier stream had): not an
    # invariant; counted by whether the new stream's hub answered /readyz 200 before it.
    relisten_back = {True: 0, False: 0}
    earlier: dict[tuple[int, str], int] = {}  # the highest rank a follower's past streams had
    for s in o.history.sessions:
        ranks: dict[str, int] = {}
        for f in s.frames:
            r, before = rank(f.status, f.message), ranks.get(f.task_id, -1)
            check.ok(
                r >= before,
                f"t={rel(f.at)} hub {s.hub} {s.request_id} {f.task_id}: "
                f"back to {f.message!r} from rank {before}",
            )
            if r < earlier.get((s.follower, f.task_id), -1):
                relisten_back[s.ready_before] += 1
            ranks[f.task_id] = max(r, before)
        for task_id, r in ranks.items():
            key = (s.follower, task_id)
            earlier[key] = max(r, earlier.get(key, -1))
    o.allowed["re-listen older snapshot, hub ready"] += relisten_back[True]
    o.allowed["re-listen older snapshot, hub not ready"] += relisten_back[False]
    return check


def addressed(o: Outcome) -> Check:
    rel = o.history.rel
    check = Check(
        "addressed",
        "every frame carries the stream's subscription id and names a task the stream follows",
    )
    for s in o.history.sessions:
        for f in s.frames:
            check.ok(
                f.meta_ok and f.task_id in s.requested,
                f"t={rel(f.at)} hub {s.hub} {s.request_id} {f.task_id}: meta/task wrong",
            )
    return check


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) points, per hour."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return 3600 * sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def _growth(check: Check, what: str, points: list[tuple[float, float]], limit: float) -> None:
    """One check of `points`' growth per hour after warm-up, if they run long enough."""
    if not points:
        return
    mark = points[0][0] + WARMUP_S
    later = [(t, v) for t, v in points if t >= mark]
    if len(later) < 2 or later[-1][0] - later[0][0] < MIN_SPAN_S:
        return
    rate = slope_per_hour(later)
    check.ok(
        rate <= limit,
        f"{what} grew {rate:.1f}/h (bound {limit:g}/h) from t={later[0][0]:.0f}s "
        f"to t={later[-1][0]:.0f}s: {later[0][1]:.0f} → {later[-1][1]:.0f}",
    )


def _hub_series(history: History, key: str) -> dict[str, list[tuple[float, float]]]:
    """Per hub process ("hub0 pid 123"), the (t, value) samples of `key`."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in history.resources:
        for name, entry in row.items():
            if name.startswith("hub") and entry.get(key) is not None:
                series.setdefault(f"{name} pid {entry['pid']}", []).append((row["t"], entry[key]))
    return series


def consumers(o: Outcome) -> Check:
    check = Check(
        "consumers",
        "the bucket stream's consumer count settles to at most the number of live hubs "
        f"within 30 s after the run; after {WARMUP_S:.0f} s of warm-up it grows "
        f"<= {CONSUMER_GROWTH_LIMIT_PER_H:g}/h (over >= {MIN_SPAN_S:.0f} s of samples)",
    )
    if o.consumer_settle is not None:
        count, live, waited = o.consumer_settle
        check.ok(0 <= count <= live, f"{count} consumers for {live} live hubs after {waited:.0f}s")
    points = [
        (r["t"], r["consumers"]) for r in o.history.resources if r.get("consumers") is not None
    ]
    _growth(check, "the consumer count", points, CONSUMER_GROWTH_LIMIT_PER_H)
    return check


def hub_memory(o: Outcome) -> Check:
    check = Check(
        "hub-memory",
        f"every hub's RSS <= {HUB_RSS_CAP_MB:.0f} MB in every sample; per hub process, after "
        f"{WARMUP_S:.0f} s of warm-up it grows <= {RSS_GROWTH_LIMIT_MB_PER_H:g} MB/h "
        f"(over >= {MIN_SPAN_S:.0f} s of samples)",
    )
    for process, samples in _hub_series(o.history, "rss_kb").items():
        mb = [(t, kb / 1024) for t, kb in samples]
        at, peak = max(mb, key=lambda p: p[1])
        check.ok(peak <= HUB_RSS_CAP_MB, f"{process} RSS {peak:.0f} MB at t={at:.0f}s")
        _growth(check, f"{process} RSS (MB)", mb, RSS_GROWTH_LIMIT_MB_PER_H)
    return check


def hub_fds(o: Outcome) -> Check:
    check = Check(
        "hub-fds",
        f"per hub process, after {WARMUP_S:.0f} s of warm-up its open fds grow "
        f"<= {FDS_GROWTH_LIMIT_PER_H:g}/h (over >= {MIN_SPAN_S:.0f} s of samples)",
    )
    for process, samples in _hub_series(o.history, "fds").items():
        _growth(check, f"{process} open fds", samples, FDS_GROWTH_LIMIT_PER_H)
    return check


def no_orphans(o: Outcome) -> Check:
    check = Check(
        "no-orphans",
        "a create whose outcome was unknown is resolved (stored or "
        "not); a stored one is not orphaned (final state checked like any other)",
    )
    for task_id, stored in o.history.resolved_unknown.items():
        check.ok(stored is not None, f"{task_id}: unresolved")
        o.allowed["unknown create: stored" if stored else "unknown create: not stored"] += 1
    return check


def run_finished(o: Outcome) -> Check:
    check = Check(
        "run", "the run finished: every write acknowledged, no harness error, within the deadline"
    )
    notes = o.history.notes  # a fault that never settled
    for error in [*o.run_errors, *notes]:
        check.ok(False, error)
    check.ok(not o.run_errors and not notes, "see the examples above")
    return check


CHECKS: tuple[Callable[[Outcome], Check], ...] = (
    create_found,
    final_state,
    terminal_seen,
    never_written,
    after_terminal,
    monotonic,
    addressed,
    consumers,
    hub_memory,
    hub_fds,
    no_orphans,
    run_finished,
)


def check_all(
    history: History,
    final_hubs: list[int],
    consumer_settle: tuple[int, int, float] | None,
    run_errors: list[str],
) -> tuple[list[Check], dict[str, int]]:
    """Every check in `CHECKS`, and counters of what was allowed (not violations)."""
    outcome = Outcome(history, final_hubs, consumer_settle, run_errors)
    return [check(outcome) for check in CHECKS], dict(outcome.allowed)
