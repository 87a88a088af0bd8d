"""The run's report: invariant counts, fault recovery times, lag, resources; and its table.

Recovery of a fault, from its start: `ready_s` until every live hub answers /readyz 200
again (after the fault is over), `streams_s` until every stream that was delivering just
before the fault delivers again (the end of the last silence > 1.5 s that began during
the fault; keep-alives come every second, so a healthy stream is never silent that long).
Lag: from the bridge's write being acknowledged to a stream that was already open
receiving that state; `quiet` leaves out writes acknowledged during a fault (+2 s).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from tests.chaos import plan
from tests.chaos.history import FaultRecord, History, Session
from tests.chaos.invariants import Check

if TYPE_CHECKING:
    from tests.chaos.env import Env
    from tests.chaos.run import Options

GAP_S = 1.5


def _ready_recovery(history: History, fault: FaultRecord, next_start: float) -> float:
    """From the fault's start until every live hub answered /readyz 200 for good (0 if
    none ever stopped answering 200 during the fault and its settling, which ends where
    the next fault starts)."""
    window_end = min(max(fault.settled, fault.ended) + 1.0, next_start)
    rounds = [(t, s) for t, s in history.ready_rounds if fault.started <= t <= window_end]
    down = [t for t, s in rounds if not all(x for x in s if x is not None)]
    if not down:
        return 0.0
    up = next((t for t, s in rounds if t > down[-1]), window_end)
    return up - fault.started


def _idle(history: History) -> dict[int, list[tuple[float, float]]]:
    """Per follower, the spans with nothing to follow: from a session that ended with all
    its tasks terminal ("done") to the start of the next session."""
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    by_follower: dict[int, list[Session]] = defaultdict(list)
    for s in history.sessions:
        by_follower[s.follower].append(s)
    for follower, sessions in by_follower.items():
        for a, b in zip(sessions, [*sessions[1:], None], strict=True):
            if a.end == "done" and a.ended is not None:
                spans[follower].append((a.ended, b.started if b is not None else float("inf")))
    return spans


def _stream_recovery(
    history: History, fault: FaultRecord, idle: dict[int, list[tuple[float, float]]]
) -> tuple[float, int]:
    """From the fault's start until every stream delivering just before it delivers again:
    the end of the last silence > GAP_S that began during the fault (+1 s), not counting
    silences in which the follower had nothing to follow."""
    recovered, affected = 0.0, 0
    for follower, times in history.activity.items():
        i = bisect.bisect_left(times, fault.started - 2.0)
        if i >= len(times) or times[i] > fault.started:
            continue  # not delivering just before the fault
        j = bisect.bisect_right(times, fault.started) - 1
        worst = None
        while j + 1 < len(times) and times[j] <= fault.ended + 1.0:
            g0, g1 = times[j], times[j + 1]
            if g1 - g0 > GAP_S and not any(a < g1 and g0 < b for a, b in idle[follower]):
                worst = g1
            j += 1
        if worst is not None:
            affected += 1
            recovered = max(recovered, worst - fault.started)
    return recovered, affected


def _lags(history: History) -> dict[str, Any]:
    windows = [(f.started, (f.settled or f.ended) + 2.0, f.kind) for f in history.faults]
    lags: dict[int, list[float]] = defaultdict(list)
    by_kind: dict[str, list[float]] = defaultdict(list)  # acked within that fault's window
    quiet: list[float] = []
    worst: tuple[float, str] = (0.0, "")
    for s in history.sessions:
        for f in s.frames:
            ack = next(
                (
                    a
                    for a in history.acks.get(f.task_id, ())
                    if (a.status, a.message) == (f.status, f.message)
                ),
                None,
            )
            if ack is None or ack.at <= s.started:
                continue
            lag = max(0.0, f.at - ack.at)
            lags[s.hub].append(lag)
            kinds = {kind for a, b, kind in windows if a <= ack.at <= b}
            for kind in kinds:
                by_kind[kind].append(lag)
            if not kinds:
                quiet.append(lag)
            if lag > worst[0]:
                worst = (
                    lag,
                    f"hub {s.hub} {s.request_id} {f.task_id} {f.status} "
                    f"acked t={history.rel(ack.at)}",
                )

    def p(values: list[float], q: float) -> float:
        values = sorted(values)
        return round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else 0.0

    every = [x for v in lags.values() for x in v]
    return {
        "frames": len(every),
        "max_s": p(every, 1.0),
        "p99_s": p(every, 0.99),
        "quiet_max_s": p(quiet, 1.0),
        "quiet_p99_s": p(quiet, 0.99),
        "per_hub_max_s": {str(h): p(v, 1.0) for h, v in sorted(lags.items())},
        "per_fault_kind_max_s": {k: p(v, 1.0) for k, v in sorted(by_kind.items())},
        "worst": worst[1],
    }


def _resources(history: History) -> dict[str, Any]:
    rows = history.resources
    if not rows:
        return {}
    picks = {"start": rows[0], "middle": rows[len(rows) // 2], "end": rows[-1]}
    names = sorted({k for r in rows for k in r if k not in ("t", "consumers")})
    out: dict[str, Any] = {}
    for name in names:
        entry: dict[str, Any] = {}
        for label, row in picks.items():
            v = row.get(name)
            entry[label] = None if v is None else [v["rss_kb"], v["fds"]]
        entry["max"] = [
            max((r[name]["rss_kb"] or 0) for r in rows if name in r),
            max((r[name]["fds"] or 0) for r in rows if name in r),
        ]
        out[name] = entry
    consumers = [r["consumers"] for r in rows if r.get("consumers") is not None]
    out["consumers"] = {
        **{label: row.get("consumers") for label, row in picks.items()},
        "max": max(consumers, default=None),
    }
    return out


def build(
    history: History,
    options: Options,
    fault_plan: list[plan.Fault],
    checks: list[Check],
    allowed: dict[str, int],
    env: Env,
) -> dict[str, Any]:
    per_kind: dict[str, dict[str, Any]] = {}
    fault_rows = []
    idle = _idle(history)
    starts = [f.started for f in history.faults[1:]] + [float("inf")]
    for f, next_start in zip(history.faults, starts, strict=True):
        ready = _ready_recovery(history, f, next_start)
        streams, affected = _stream_recovery(history, f, idle)
        fault_rows.append(
            {
                "index": f.index,
                "kind": f.kind,
                "target": f.target,
                "at": history.rel(f.started),
                "lasted_s": round(f.ended - f.started, 2),
                "ready_s": round(ready, 2),
                "streams_s": round(streams, 2),
                "streams_affected": affected,
                "note": f.note,
            }
        )
        k = per_kind.setdefault(f.kind, {"count": 0, "ready_max_s": 0.0, "streams_max_s": 0.0})
        k["count"] += 1
        k["ready_max_s"] = max(k["ready_max_s"], round(ready, 2))
        k["streams_max_s"] = max(k["streams_max_s"], round(streams, 2))
    sessions = history.sessions
    ends: dict[str, int] = defaultdict(int)
    for s in sessions:
        ends[s.end.split(":")[0][:40]] += 1
    return {
        "seed": options.seed,
        "duration": options.duration,
        "soak": options.soak,
        "tasks": options.tasks,
        "streams": options.streams,
        "ok": all(c.violations == 0 for c in checks),
        "plan": [f.to_json() for f in fault_plan],
        "invariants": {c.name: c.to_json() for c in checks},
        "allowed": allowed,
        "faults": fault_rows,
        "fault_kinds": per_kind,
        "lag": _lags(history),
        "writes": {
            "acked": sum(len(a) for a in history.acks.values()),
            "tasks": len(history.created_at),
            "unknown_creates": len(history.unknown_creates),
            "retries": dict(history.write_retries),
            "nats_client_errors": dict(history.nats_client_errors),
        },
        "sessions": {"count": len(sessions), "ends": dict(ends)},
        "gets": len(history.gets),
        "resources": _resources(history),
        "logs": env.where_to_look(),
        "notes": history.notes,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"chaos seed={result['seed']} duration={result['duration']}s soak={result['soak']} "
        f"tasks={result['tasks']} streams={result['streams']} wall={result.get('wall_s')}s"
    ]
    lines.append(f"{'invariant':<16}{'checks':>9}{'violations':>12}")
    for name, c in result["invariants"].items():
        lines.append(f"{name:<16}{c['checks']:>9}{c['violations']:>12}")
        lines += [f"    e.g. {e[:300]}" for e in c["examples"]]
    if result["allowed"]:
        lines.append(
            "allowed (not violations): "
            + ", ".join(f"{k}={v}" for k, v in result["allowed"].items())
        )
    lines.append(
        f"{'fault kind':<17}{'count':>6}{'ready max s':>13}{'streams max s':>15}{'lag max s':>11}"
    )
    lag_by_kind = result["lag"].get("per_fault_kind_max_s", {})
    for kind, k in sorted(result["fault_kinds"].items()):
        lines.append(
            f"{kind:<17}{k['count']:>6}{k['ready_max_s']:>13}{k['streams_max_s']:>15}"
            f"{lag_by_kind.get(kind, 0.0):>11}"
        )
    for f in result["faults"]:
        lines.append(
            f"  #{f['index']:<2} t={f['at']:>7.1f} {f['kind']:<16} tgt {f['target']:>2} "
            f"lasted {f['lasted_s']:>5}s ready {f['ready_s']}s streams {f['streams_s']}s "
            f"({f['streams_affected']} affected) {f['note']}"
        )
    lag = result["lag"]
    lines.append(
        f"write-ack→delivery lag over {lag['frames']} live frames: max {lag['max_s']}s "
        f"p99 {lag['p99_s']}s; outside faults max {lag['quiet_max_s']}s "
        f"p99 {lag['quiet_p99_s']}s; per hub max {lag['per_hub_max_s']}"
    )
    w = result["writes"]
    lines.append(
        f"writes acked {w['acked']} for {w['tasks']} tasks; unknown creates "
        f"{w['unknown_creates']}; retries {w['retries']}; bridge/admin NATS errors "
        f"{w['nats_client_errors']}"
    )
    lines.append(
        f"sessions {result['sessions']['count']} ends {result['sessions']['ends']}; "
        f"tasks/get {result['gets']}"
    )
    res = result["resources"]
    if res:
        lines.append(f"{'resources':<12}{'start rss/fds':>16}{'middle':>16}{'end':>16}{'max':>16}")
        for name, e in res.items():
            if name == "consumers":
                continue

            def cell(v: Any) -> str:
                return "-" if v is None else f"{v[0] // 1024}MB/{v[1]}"

            lines.append(
                f"{name:<12}{cell(e['start']):>16}{cell(e['middle']):>16}"
                f"{cell(e['end']):>16}{cell(e['max']):>16}"
            )
        c = res["consumers"]
        lines.append(
            f"{'consumers':<12}{c['start']!s:>16}{c['middle']!s:>16}{c['end']!s:>16}"
            f"{c['max']!s:>16}"
        )
    lines.append("RESULT: " + ("PASS" if result["ok"] else "FAIL"))
    return "\n".join(lines)
