"""Each chaos invariant reports the violation it exists for (tests/chaos/invariants.py).

A small clean history passes every check, each with something to check. Each case adds
one violation to it and expects its check (and only the checks it names) to report it
with an example; a guard fails when a check is added without a case. No NATS, no
processes: histories are built by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.chaos.history import Ack, FaultRecord, Frame, GetAnswer, History, Session
from tests.chaos.invariants import (
    FAULT_GRACE_S,
    HUB_RSS_CAP_MB,
    RSS_GROWTH_LIMIT_MB_PER_H,
    Check,
    check_all,
)

A, B, C = "task-a", "task-b", "task-c"
CREATED_AT = "2026-01-01T00:00:00Z"
STATES = [("working", "created"), ("working", "progress 1"), ("completed", "final 0")]
FAULT = FaultRecord(0, "node-pause", 0, started=10.0, ended=14.0, settled=16.0)
WINDOW_END = FAULT.settled + FAULT_GRACE_S
MB = 1024  # rss_kb per MB


@dataclass
class Run:
    history: History
    final_hubs: list[int] = field(default_factory=lambda: [0, 1])
    consumer_settle: tuple[int, int, float] | None = (2, 2, 0.5)
    run_errors: list[str] = field(default_factory=list)

    def checks(self) -> tuple[dict[str, Check], dict[str, int]]:
        checks, allowed = check_all(
            self.history, self.final_hubs, self.consumer_settle, self.run_errors
        )
        return {c.name: c for c in checks}, allowed


def task(task_id: str, status: str, message: str, created_at: str = CREATED_AT) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "status": status,
        "createdAt": created_at,
        "lastUpdatedAt": f"{status} {message}",
        "ttlMs": None,
        "statusMessage": message,
    }


def frame(at: float, task_id: str, status: str, message: str, meta_ok: bool = True) -> Frame:
    return Frame(at, task_id, status, message, task(task_id, status, message), meta_ok)


def get(at: float, hub: int, body: dict[str, Any], ready: bool = True) -> GetAnswer:
    """A found answer to a tasks/get of A."""
    return GetAnswer(at, hub, A, ready, False, None, body["status"], body["statusMessage"], body)


def error(at: float, hub: int, code: int, ready: bool = True) -> GetAnswer:
    return GetAnswer(at, hub, A, ready, False, code, message="an error")


def listen_error(at: float, code: int, ready: bool = True) -> Session:
    body = f'{{"jsonrpc":"2.0","id":"f1.1","error":{{"code":{code},"message":"x"}}}}'
    return Session(1, "f1.1", 1, ready, at - 2.0, [A], ended=at, end=f"http 500: {body}")


def samples(
    until: float = 1800.0,
    rss_mb: Callable[[float], float] = lambda t: 55.0,
    fds: Callable[[float], int] = lambda t: 20,
    consumers: Callable[[float], int] = lambda t: 2,
    pid: Callable[[float], int] = lambda t: 100,
) -> list[dict[str, Any]]:
    """Resource rows every 10 s, as tests/chaos/resources.py records them; hub1 is flat."""
    rows: list[dict[str, Any]] = []
    for step in range(int(until) // 10 + 1):
        t = 10.0 * step
        rows.append(
            {
                "t": t,
                "hub0": {"pid": pid(t), "rss_kb": int(rss_mb(t) * MB), "fds": fds(t)},
                "hub1": {"pid": 101, "rss_kb": 56 * MB, "fds": 21},
                "n0": {"pid": 200, "rss_kb": 24 * MB, "fds": 30},
                "consumers": consumers(t),
            }
        )
    return rows


def clean() -> Run:
    """Tasks A and B written and acked; follower 0 follows A on hub 0 to its end; both
    hubs find A after its create and read A and B after the run; one fault; an unknown
    create found not stored; half an hour of flat resource samples."""
    h = History(t0=0.0)
    for task_id in (A, B):
        for i, (status, message) in enumerate(STATES):
            h.attempt(task_id, status, message)
            h.acks[task_id].append(Ack(1.0 + i, status, message, task(task_id, status, message)))
        h.created_at[task_id] = 1.0
    h.followed[0] = {A}
    session = Session(0, "f0.1", 0, True, 1.5, [A], granted=[A], ended=4.5, end="done")
    session.frames = [
        frame(2.0 + i, A, status, message) for i, (status, message) in enumerate(STATES)
    ]
    h.sessions.append(session)
    h.terminal_seen[0][A] = task(A, *STATES[-1])
    h.gets += [get(2.0, hub, task(A, *STATES[0])) for hub in (0, 1)]
    h.gets += [
        GetAnswer(30.0, hub, t, True, True, None, *STATES[-1], task(t, *STATES[-1]))
        for hub in (0, 1)
        for t in (A, B)
    ]
    # D had a TTL that ended before the run did: both hubs answer -32602 after it.
    D = "task-d"
    h.acks[D].append(Ack(1.0, "completed", "final 0", task(D, "completed", "final 0")))
    h.attempt(D, "completed", "final 0")
    h.gone.add(D)
    h.gets += [GetAnswer(30.0, hub, D, True, True, -32602, message="not found") for hub in (0, 1)]
    h.faults.append(FaultRecord(**vars(FAULT)))
    h.unknown_creates[C] = 3.0
    h.resolved_unknown[C] = False
    h.resources = samples()
    return Run(h)


def final_get(run: Run, hub: int, task_id: str) -> GetAnswer:
    return next(g for g in run.history.gets if g.final and g.hub == hub and g.task_id == task_id)


# -- the violations: (check, the checks expected to report it, how) ------------------------

Case = tuple[str, set[str], Callable[[Run], None]]
CASES: dict[str, Case] = {
    "get -32602 on a ready hub": (
        "create-found",
        set(),
        lambda r: r.history.gets.append(error(3.0, 1, -32602)),
    ),
    "get -32603 on a ready hub outside a fault": (
        "create-found",
        set(),
        lambda r: r.history.gets.append(error(WINDOW_END + 0.5, 1, -32603)),
    ),
    "get -32602 on a ready hub during a fault": (
        "create-found",
        set(),
        lambda r: r.history.gets.append(error(12.0, 1, -32602)),
    ),
    "get answers another task": (
        "create-found",
        set(),
        lambda r: r.history.gets.append(get(3.0, 1, task(B, *STATES[0]))),
    ),
    "get on a hub not ready answers another task": (
        "create-found",
        set(),
        lambda r: r.history.gets.append(get(3.0, 1, task(B, *STATES[0]), ready=False)),
    ),
    "get answers a task of that id created at another time": (
        "create-found",
        set(),
        lambda r: r.history.gets.append(get(3.0, 1, task(A, *STATES[0], "2026-01-02T00:00:00Z"))),
    ),
    "get answers a state never written": (
        "create-found",
        {"never-written"},
        lambda r: r.history.gets.append(get(3.0, 1, task(A, "working", "progress 9"))),
    ),
    "listen on a ready hub not granting a task": (
        "create-found",
        set(),
        lambda r: r.history.sessions.append(
            Session(1, "f1.1", 1, True, 3.0, [A], granted=[], end="not every task granted")
        ),
    ),
    "listen -32603 on a ready hub outside a fault": (
        "create-found",
        set(),
        lambda r: r.history.sessions.append(listen_error(WINDOW_END + 0.5, -32603)),
    ),
    "listen -32602 on a ready hub": (
        "create-found",
        set(),
        lambda r: r.history.sessions.append(listen_error(12.0, -32602)),
    ),
    "final read returns an older state": (
        "final-state",
        set(),
        lambda r: setattr(final_get(r, 1, A), "task", task(A, *STATES[1])),
    ),
    "a task past its TTL still answered after the run": (
        "final-state",
        set(),
        lambda r: r.history.gone.add(A),
    ),
    "a live hub not read after the run": (
        "final-state",
        set(),
        lambda r: r.history.gets.remove(final_get(r, 1, B)),
    ),
    "terminal state not seen": (
        "terminal-seen",
        set(),
        lambda r: r.history.terminal_seen[0].pop(A),
    ),
    "terminal state seen differs from the acked one": (
        "terminal-seen",
        set(),
        lambda r: r.history.terminal_seen[0].update({A: task(A, "completed", "final 0", "x")}),
    ),
    "frame with a state never written": (
        "never-written",
        set(),
        lambda r: r.history.sessions[0].frames.insert(2, frame(3.5, A, "working", "progress 9")),
    ),
    "frame after the terminal frame": (
        "after-terminal",
        set(),
        lambda r: r.history.sessions[0].frames.append(frame(4.2, A, *STATES[-1])),
    ),
    "frame back to an earlier state": (
        "monotonic",
        set(),
        lambda r: r.history.sessions[0].frames.insert(2, frame(3.5, A, *STATES[0])),
    ),
    "frame without the stream's subscription id": (
        "addressed",
        set(),
        lambda r: r.history.sessions[0].frames.insert(2, frame(3.5, A, *STATES[1], False)),
    ),
    "frame for a task the stream does not follow": (
        "addressed",
        set(),
        lambda r: r.history.sessions[0].frames.insert(2, frame(3.5, B, *STATES[1])),
    ),
    "more consumers than live hubs after the run": (
        "consumers",
        set(),
        lambda r: setattr(r, "consumer_settle", (3, 2, 30.0)),
    ),
    "consumer count growing after warm-up": (
        "consumers",
        set(),
        lambda r: setattr(r.history, "resources", samples(consumers=lambda t: 2 + int(t // 300))),
    ),
    "hub RSS over the cap": (
        "hub-memory",
        set(),
        lambda r: setattr(
            r.history, "resources", samples(rss_mb=lambda t: HUB_RSS_CAP_MB + 1 if t == 900 else 55)
        ),
    ),
    "hub RSS growing after warm-up": (
        "hub-memory",
        set(),
        lambda r: setattr(
            r.history,
            "resources",
            samples(rss_mb=lambda t: 55 + 1.5 * RSS_GROWTH_LIMIT_MB_PER_H * t / 3600),
        ),
    ),
    "hub fds growing after warm-up": (
        "hub-fds",
        set(),
        lambda r: setattr(r.history, "resources", samples(fds=lambda t: 20 + int(t // 30))),
    ),
    "unknown create not resolved": (
        "no-orphans",
        set(),
        lambda r: r.history.resolved_unknown.update({C: None}),
    ),
    "a harness error": (
        "run",
        set(),
        lambda r: r.run_errors.append("hard deadline of 140s exceeded"),
    ),
    "a fault that never settled": (
        "run",
        set(),
        lambda r: r.history.notes.append("fault #0 node-pause: no settle in 60 s"),
    ),
}


def test_the_clean_history_passes_every_check_and_exercises_each() -> None:
    checks, allowed = clean().checks()
    assert {name: c.violations for name, c in checks.items() if c.violations} == {}
    assert [name for name, c in checks.items() if c.checks == 0] == []
    assert allowed["unknown create: not stored"] == 1


def test_every_check_has_a_self_test() -> None:
    checks, _ = clean().checks()
    assert set(checks) == {name for name, _, _ in CASES.values()}


@pytest.mark.parametrize("case", list(CASES))
def test_each_check_reports_the_violation_it_exists_for(case: str) -> None:
    name, also, add_violation = CASES[case]
    run = clean()
    add_violation(run)
    checks, _ = run.checks()
    reported = {n for n, c in checks.items() if c.violations}
    assert reported == {name, *also}
    assert checks[name].examples, f"{name} reported no example"
    assert all(example.strip() for example in checks[name].examples)


def test_a_task_near_its_ttls_end_is_neither_read_nor_expected_after_the_run() -> None:
    run = clean()
    run.history.near_expiry.add(B)
    for hub in (0, 1):
        run.history.gets.remove(final_get(run, hub, B))
    checks, _ = run.checks()
    assert checks["final-state"].violations == 0


def test_an_older_snapshot_on_a_re_listen_is_counted_not_a_violation() -> None:
    """Across streams a task may go back (the new stream's hub is behind); within one, not."""
    run = clean()
    relisten = Session(0, "f0.2", 1, True, 5.0, [A], granted=[A], ended=6.0, end="done")
    relisten.frames = [frame(5.5, A, *STATES[1])]
    run.history.sessions.append(relisten)
    checks, allowed = run.checks()
    assert checks["monotonic"].violations == 0
    assert allowed["re-listen older snapshot, hub ready"] == 1

    run = clean()
    CASES["frame back to an earlier state"][2](run)
    checks, allowed = run.checks()
    assert checks["monotonic"].violations == 1
    assert allowed["re-listen older snapshot, hub ready"] == 0


# -- what is excused, and what is not ------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "excused"),
    [
        (FAULT.started - 0.5, False),
        (FAULT.started + 0.1, True),
        (FAULT.settled + FAULT_GRACE_S - 0.1, True),
        (FAULT.settled + FAULT_GRACE_S + 0.1, False),
    ],
)
def test_internal_error_on_a_ready_hub_is_excused_only_in_a_fault_window(
    at: float, excused: bool
) -> None:
    run = clean()
    run.history.gets.append(error(at, 1, -32603))
    run.history.sessions.append(listen_error(at, -32603))
    checks, allowed = run.checks()
    assert checks["create-found"].violations == (0 if excused else 2)
    assert allowed.get("tasks/get -32603 on a ready hub, in a fault window", 0) == int(excused)
    assert allowed.get("listen -32603 on a ready hub, in a fault window", 0) == int(excused)


def test_errors_from_a_hub_not_ready_are_allowed_and_counted() -> None:
    run = clean()
    run.history.gets += [error(40.0, 1, -32603, ready=False), error(40.0, 1, -32602, ready=False)]
    run.history.sessions.append(listen_error(40.0, -32603, ready=False))
    checks, allowed = run.checks()
    assert checks["create-found"].violations == 0
    assert allowed["tasks/get -32603 on a hub not ready"] == 1
    assert allowed["listen -32603 on a hub not ready"] == 1


def test_a_run_cut_short_during_a_fault_excuses_to_its_end() -> None:
    run = clean()
    run.history.faults.append(FaultRecord(1, "hub-kill", 1, started=100.0))
    run.history.gets.append(error(500.0, 1, -32603))
    checks, _ = run.checks()
    assert checks["create-found"].violations == 0


def test_growth_is_measured_per_hub_process() -> None:
    """A restarted hub is a new series: a step between two flat processes is no growth."""
    run = clean()
    run.history.resources = samples(
        rss_mb=lambda t: 50 if t < 600 else 58,
        fds=lambda t: 15 if t < 600 else 40,
        pid=lambda t: 100 if t < 600 else 102,
    )
    checks, _ = run.checks()
    assert checks["hub-memory"].violations == checks["hub-fds"].violations == 0
    # hub0's first process ran too briefly after its warm-up to be measured
    assert checks["hub-fds"].checks == 2


def test_healthy_growth_and_spikes_pass() -> None:
    """Growth under the bound, a consumer re-made now and then, fds following the streams."""
    run = clean()
    run.history.resources = samples(
        rss_mb=lambda t: 55 + 0.5 * RSS_GROWTH_LIMIT_MB_PER_H * t / 3600 + (2 if t % 70 else 0),
        fds=lambda t: 20 + int(t // 10) % 20,
        consumers=lambda t: 3 if t % 400 == 0 else 2,
    )
    checks, _ = run.checks()
    assert {n: c.violations for n, c in checks.items() if c.violations} == {}


def test_a_short_run_is_not_checked_for_growth() -> None:
    """Minutes of samples say too little per hour: only the cap is checked."""
    run = clean()
    run.history.resources = samples(until=60.0, rss_mb=lambda t: 54 + t / 30)
    checks, _ = run.checks()
    assert checks["hub-memory"].violations == 0
    assert checks["hub-memory"].checks == 2  # each hub process's cap
    assert checks["hub-fds"].checks == 0
