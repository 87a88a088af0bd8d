"""The invariants, checked over a finished run's `History`.

Each `Check` counts how many times it was checked and how many checks failed, keeping
the first five failures as examples. None of them has slack for faults: what a fault may
excuse is said in the check (a -32603 answer, a hub that was not ready, an unknown create).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import History
from tests.chaos.workload import ENDINGS, NO_ANSWER, rank

HUB_RSS_LIMIT_MB = 300.0  # every hub's RSS at the end of the run
SOAK_GROWTH_LIMIT_MB = 64.0  # soak: a hub's RSS growth from the 10-minute mark to the end
INVALID_PARAMS, INTERNAL_ERROR = -32602, -32603


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


def check_all(
    history: History,
    final_hubs: list[int],
    consumer_settle: tuple[int, int, float] | None,
    soak: bool,
    run_errors: list[str],
) -> tuple[list[Check], dict[str, int]]:
    """All checks, and counters of what was allowed (not violations)."""
    rel = history.rel
    allowed: Counter[str] = Counter()

    found = Check(
        "create-found",
        "every acked create is found (tasks/get, listen ack) on "
        "every hub that answered /readyz 200 just before",
    )
    for g in history.gets:
        if g.final or not g.ready_before or g.code == NO_ANSWER:
            continue
        if g.task_id not in history.created_at:
            continue
        if g.code == INTERNAL_ERROR:
            allowed["tasks/get -32603 on a ready hub"] += 1
        found.ok(
            g.code != INVALID_PARAMS,
            f"t={rel(g.at)} hub {g.hub} tasks/get {g.task_id} (created t="
            f"{rel(history.created_at[g.task_id])}): {g.code} {g.message}",
        )
    for s in history.sessions:
        if s.granted is None:
            if s.end.startswith(("not a stream", "http")) and str(INTERNAL_ERROR) in s.end:
                allowed["listen answered -32603"] += 1
            if s.end.startswith(("not a stream", "http")) and str(INVALID_PARAMS) in s.end:
                found.ok(
                    not s.ready_before, f"t={rel(s.started)} hub {s.hub} {s.request_id}: {s.end}"
                )
            continue
        for task_id in s.requested:
            if s.ready_before:
                found.ok(
                    task_id in s.granted,
                    f"t={rel(s.started)} hub {s.hub} {s.request_id}: {task_id} not granted",
                )
            elif task_id not in s.granted:
                allowed["not granted by a hub not ready"] += 1

    final = Check(
        "final-state", "tasks/get after the run, on every hub, equals the last acknowledged write"
    )
    expected = {t: acks[-1].task for t, acks in history.acks.items() if acks}
    for g in history.gets:
        if not g.final:
            continue
        want = expected.get(g.task_id)
        final.ok(
            g.code is None and g.task == want,
            f"hub {g.hub} {g.task_id}: got {g.code} {g.task} want {want}",
        )
    answered = {(g.hub, g.task_id) for g in history.gets if g.final}
    for task_id in expected:
        for hub in final_hubs:
            if (hub, task_id) not in answered:
                final.ok(False, f"hub {hub} {task_id}: never read after the run")

    terminal = Check(
        "terminal-seen",
        "every subscriber following a task sees its terminal state, equal to the acknowledged one",
    )
    for follower, ids in history.followed.items():
        seen = history.terminal_seen.get(follower, {})
        for task_id in ids:
            got, want = seen.get(task_id), expected.get(task_id)
            terminal.ok(
                got is not None and got == want,
                f"follower {follower} {task_id}: got {got} want {want}",
            )

    written = Check(
        "never-written",
        "no observed state (frame or tasks/get) that was never written (status + statusMessage)",
    )
    for s in history.sessions:
        for f in s.frames:
            written.ok(
                (f.status, f.message) in history.attempted.get(f.task_id, set()),
                f"t={rel(f.at)} hub {s.hub} {s.request_id}: {f.task_id} {f.status} {f.message!r}",
            )
    for g in history.gets:
        if g.code is None:
            written.ok(
                (g.status, g.message) in history.attempted.get(g.task_id, set()),
                f"t={rel(g.at)} hub {g.hub} get {g.task_id}: {g.status} {g.message!r}",
            )

    after = Check("after-terminal", "no frame for a task after its terminal frame, per stream")
    back = Check("monotonic", "per stream, a task's progress rank never decreases")
    addressed = Check(
        "addressed",
        "every frame carries the stream's subscription id and names a task the stream follows",
    )
    relisten_back = {True: 0, False: 0}
    last_rank: dict[tuple[int, str], int] = {}
    for s in history.sessions:
        done: set[str] = set()
        ranks: dict[str, int] = {}
        for f in s.frames:
            where = f"t={rel(f.at)} hub {s.hub} {s.request_id} {f.task_id}"
            addressed.ok(f.meta_ok and f.task_id in s.requested, f"{where}: meta/task wrong")
            after.ok(f.task_id not in done, f"{where}: {f.status} {f.message!r} after terminal")
            r = rank(f.status, f.message)
            back.ok(
                r >= ranks.get(f.task_id, -1),
                f"{where}: back to {f.message!r} from rank {ranks.get(f.task_id)}",
            )
            ranks[f.task_id] = max(r, ranks.get(f.task_id, -1))
            if f.status in ENDINGS:
                done.add(f.task_id)
            key = (s.follower, f.task_id)
            if r < last_rank.get(key, -1):
                relisten_back[s.ready_before] += 1
            last_rank[key] = max(r, last_rank.get(key, -1))
    # Across streams (a re-listen's snapshot older than a frame an earlier stream had): not an
    # invariant; counted by whether the new stream's hub answered /readyz 200 before it.
    allowed["re-listen older snapshot, hub ready"] = relisten_back[True]
    allowed["re-listen older snapshot, hub not ready"] = relisten_back[False]

    leak = Check(
        "consumers",
        "the bucket stream's consumer count settles to at most the "
        "number of live hubs within 30 s after the run",
    )
    if consumer_settle is not None:
        count, live, waited = consumer_settle
        leak.ok(0 <= count <= live, f"{count} consumers for {live} live hubs after {waited:.0f}s")

    memory = Check(
        "hub-memory",
        f"hub RSS at the end <= {HUB_RSS_LIMIT_MB:.0f} MB"
        + (
            f"; soak: growth from the 10-minute mark <= {SOAK_GROWTH_LIMIT_MB:.0f} MB"
            if soak
            else ""
        ),
    )
    samples = history.resources
    if samples:
        last = samples[-1]
        for name in ("hub0", "hub1"):
            if name in last and last[name]["rss_kb"] is not None:
                mb = last[name]["rss_kb"] / 1024
                memory.ok(mb <= HUB_RSS_LIMIT_MB, f"{name} RSS {mb:.0f} MB at the end")
                if soak:
                    pid = last[name]["pid"]
                    mark = next(
                        (
                            r
                            for r in samples
                            if r["t"] >= 600 and name in r and r[name]["pid"] == pid
                        ),
                        None,
                    )
                    if mark is not None and mark is not last:
                        growth = (last[name]["rss_kb"] - mark[name]["rss_kb"]) / 1024
                        memory.ok(
                            growth <= SOAK_GROWTH_LIMIT_MB,
                            f"{name} grew {growth:.0f} MB from t={mark['t']:.0f}s to the end",
                        )

    orphans = Check(
        "no-orphans",
        "a create whose outcome was unknown is resolved (stored or "
        "not); a stored one is not orphaned (final state checked like any other)",
    )
    for task_id, stored in history.resolved_unknown.items():
        orphans.ok(stored is not None, f"{task_id}: unresolved")
        allowed["unknown create: stored" if stored else "unknown create: not stored"] += 1

    harness = Check(
        "run", "the run finished: every write acknowledged, no harness error, within the deadline"
    )
    for error in [*run_errors, *history.notes]:  # notes: a fault that never settled
        harness.ok(False, error)
    harness.ok(not run_errors and not history.notes, "see the examples above")
    return [
        found,
        final,
        terminal,
        written,
        after,
        back,
        addressed,
        leak,
        memory,
        orphans,
        harness,
    ], dict(allowed)
