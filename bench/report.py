"""The bench's output: one JSON object, and a markdown table for humans and the README.

The JSON object has one key per scenario (its median figures) plus `machine` and `run`
(`run.skipped`: each peer that could not be measured, and why);
the acceptance keys of issue 6 (`fanout.hub_rate`, `poll.origin_rps`, ...) are always
present for a scenario that ran, and extra figures sit beside them. The table puts each
hub figure next to its reference measured in the same run and the issue's target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.front_door import FRONT_DOOR_CALLS
from bench.operator_stream import PROCESSES
from bench.peers import report as peers_report
from bench.upstream_tasks import table as upstream_tasks_table

Results = dict[str, dict[str, float]]
Row = tuple[str, str, str, str, str]


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗ missed"


def _at_least(r: dict[str, float], prefix: str) -> str:
    """`≥ ` when the writer's top rate did not saturate that server."""
    return "≥ " if r[f"{prefix}_saturated"] < 0.5 else ""


def _fanout(r: dict[str, float]) -> list[Row]:
    label = f"fan-out ({r['streams']:,.0f} streams, {r['followers_per_task']:,.0f} per task)"
    return [
        (
            label,
            "notifications/s delivered at saturation",
            f"{_at_least(r, 'hub')}{_n(r['hub_rate'])} (at {r['hub_cpu_cores']:.2f} cores)",
            f"raw {_at_least(r, 'raw')}{_n(r['raw_rate'])} (at {r['raw_cpu_cores']:.2f} cores)"
            f" → **{r['ratio']:.2f}×**",
            f"≥ 0.5× raw {_mark(r['ratio'] >= 0.5)}",
        ),
        (
            "",
            f"publish→client p50 / p99 / p99.9 at 50% ({_n(r['latency_rate'])}/s; "
            f"load generator at {r['latency_client_cores']:.2f} cores)",
            f"{_ms(r['p50_ms'])} / **{_ms(r['p99_ms'])}** / {_ms(r['p999_ms'])} ms",
            f"raw at the same rate {_ms(r['raw_p50_ms'])} / {_ms(r['raw_p99_ms'])} / "
            f"{_ms(r['raw_p999_ms'])} ms",
            f"p99 ≤ 10 ms {_mark(r['p99_ms'] <= 10)}",
        ),
        (
            "",
            "CPU per delivered frame (of it kernel); RSS per stream",
            f"{r['hub_us_per_frame']:.1f} µs ({r['hub_sys_us_per_frame']:.1f}); "
            f"{r['hub_kb_per_stream']:.1f} KB",
            f"raw {r['raw_us_per_frame']:.1f} µs ({r['raw_sys_us_per_frame']:.1f}) → "
            f"{r['cpu_ratio']:.2f}× per core; "
            f"{r['raw_kb_per_stream']:.1f} KB",
            "",
        ),
    ]


def _storm(r: dict[str, float]) -> list[Row]:
    full = r["streams"] >= 10_000
    return [
        (
            f"connect storm ({r['streams']:,.0f} streams)",
            "all acked + initial snapshot",
            f"**{r['seconds']:.2f} s**",
            f"raw {r['raw_seconds']:.2f} s",
            f"≤ 5 s at 10k {_mark(r['seconds'] <= 5) if full else '(not at this size)'}",
        ),
        (
            "",
            "RSS per idle stream",
            f"**{r['kb_per_stream']:.1f} KB**",
            f"raw {r['raw_kb_per_stream']:.1f} KB",
            f"≤ 16 KB {_mark(r['kb_per_stream'] <= 16)}",
        ),
    ]


def _poll(r: dict[str, float]) -> list[Row]:
    return [
        (
            f"poll ({r['connections']:.0f} connections)",
            "tasks/get req/s",
            f"**{_n(r['hub_rps'])}**",
            f"raw {_n(r['raw_rps'])} → {r['raw_ratio']:.2f}×; "
            f"origin {_n(r['origin_rps'])} → {r['origin_ratio']:.1f}×",
            f"≥ 0.25× raw {_mark(r['raw_ratio'] >= 0.25)}, "
            f"≥ 3× origin {_mark(r['origin_ratio'] >= 3)}",
        ),
        (
            "",
            "server CPU per tasks/get",
            f"{r['hub_us_per_request']:.0f} µs",
            f"raw {r['raw_us_per_request']:.0f} µs → {r['raw_cpu_ratio']:.2f}× per core; "
            f"origin {r['origin_us_per_request']:.0f} µs → {r['origin_cpu_ratio']:.1f}×",
            "",
        ),
        (
            "",
            "p50 / p99 latency",
            f"{_ms(r['hub_p50_ms'])} / **{_ms(r['hub_p99_ms'])}** ms",
            f"raw {_ms(r['raw_p99_ms'])}, origin {_ms(r['origin_p99_ms'])} ms (p99)",
            f"p99 ≤ 5 ms {_mark(r['hub_p99_ms'] <= 5)}",
        ),
    ]


def _push_vs_poll(r: dict[str, float]) -> list[Row]:
    label = (
        f"poll vs push ({r['clients']:,.0f} clients, {r['seconds']:g} s, "
        f"pollIntervalMs {r['poll_interval_ms']:.0f})"
    )
    return [
        (
            label,
            "requests reaching the fleet",
            f"push via hub: **{_n(r['fleet_requests_push'])}**",
            f"polling the origin: {_n(r['fleet_requests_poll'])}",
            "",
        ),
        (
            "",
            "bytes on the wire (HTTP payload)",
            f"{r['bytes_push'] / 1e6:.2f} MB",
            f"{r['bytes_poll'] / 1e6:.2f} MB",
            "",
        ),
        (
            "",
            "staleness p50 / p99 (change → client)",
            f"**{_ms(r['staleness_push_ms'])}** / {_ms(r['staleness_push_p99_ms'])} ms",
            f"{_ms(r['staleness_poll_ms'])} / {_ms(r['staleness_poll_p99_ms'])} ms",
            "",
        ),
    ]


def _cold_start(r: dict[str, float]) -> list[Row]:
    tasks = r["tasks"]
    if tasks >= 1_000_000:
        scale = "1M"
    elif tasks >= 100_000:
        scale = "100k"
    else:
        scale = ""

    def target(seconds: float) -> str:
        if scale == "1M":
            return f"≤ 10 s at 1M {_mark(seconds <= 10)}"
        if scale == "100k":
            return f"≤ 3 s at 100k {_mark(seconds <= 3)}"
        return "(not at this size)"

    def memory(rss_per_task: float, rss_mb: float) -> tuple[str, str, str]:
        ratio = rss_per_task / r["json_bytes"]
        return (
            f"**{rss_per_task:,.0f} B** ({rss_mb:,.0f} MB in all)",
            f"its task JSON {r['json_bytes']:.0f} B → {ratio:.2f}×",
            f"≤ 2× JSON {_mark(ratio <= 2)}" if scale else "",
        )

    rows: list[Row] = [
        (
            f"cold start ({tasks:,.0f} tasks)",
            "process start → /readyz 200, from the bucket alone",
            f"**{r['seconds']:.2f} s**",
            f"listening after {r['listening_seconds']:.2f} s, "
            f"cache loaded {r['load_seconds']:.2f} s later",
            target(r["seconds"]),
        ),
        ("", "RSS per cached task (over an empty hub's)", *memory(r["rss_per_task"], r["rss_mb"])),
    ]
    if "restart_seconds" in r:
        rows += [
            (
                "",
                "restart with `--checkpoint` (1% of the tasks changed while down)",
                f"**{r['restart_seconds']:.2f} s**",
                f"listening after {r['restart_listening_seconds']:.2f} s (file read), ready "
                f"{r['restart_load_seconds']:.2f} s later; the file {r['checkpoint_mb']:,.0f} "
                f"MB, written in a stop of {r['checkpoint_stop_seconds']:.1f} s",
                target(r["restart_seconds"]),
            ),
            (
                "",
                "RSS per cached task, restarted",
                *memory(r["restart_rss_per_task"], r["restart_rss_mb"]),
            ),
        ]
    if "crash_seconds" in r:
        rows.append(
            (
                "",
                "restart after SIGKILL, from the checkpoint the hub wrote while running "
                "(`--checkpoint-every`; 1% of the tasks changed after it)",
                f"**{r['crash_seconds']:.2f} s**",
                f"listening after {r['crash_listening_seconds']:.2f} s (file read), ready "
                f"{r['crash_load_seconds']:.2f} s later",
                target(r["crash_seconds"]),
            )
        )
    return rows


def _writes(r: dict[str, float]) -> list[Row]:
    rows = [
        (
            f"writes ({r['concurrency']:.0f} concurrent)",
            "bridge task updates/s, nats-server sync_interval 2m (its default)",
            f"**{_n(r['updates_per_s'])}**",
            f"writer process at {r['writer_cpu_cores']:.2f} cores, "
            f"nats-server at {r['nats_cpu_cores']:.2f}",
            f"≥ 15k/s {_mark(r['updates_per_s'] >= 15_000)}",
        )
    ]
    if "always_updates_per_s" in r:
        rows.append(
            (
                "",
                "bridge task updates/s, sync_interval always (fsync before every ack; "
                "taskhub's embedded default and deploy/)",
                f"**{_n(r['always_updates_per_s'])}**",
                f"{r['always_ratio']:.2f}× the 2m rate; writer at "
                f"{r['always_writer_cpu_cores']:.2f} cores, nats-server at "
                f"{r['always_nats_cpu_cores']:.2f}",
                "",
            )
        )
    return rows


def _front_door(r: dict[str, float]) -> list[Row]:
    """Per answer form: the rate through the hub beside direct and through nginx, then the
    CPU each proxy spends per call; the targets of issue 40 where they apply."""
    rows: list[Row] = []
    for call in FRONT_DOOR_CALLS:
        k = call.key
        if f"{k}_hub_rps" not in r:
            continue
        label = f"front door ({r['connections']:.0f} connections, tools/call)" if not rows else ""
        nginx = f"{k}_nginx_rps" in r
        added = (
            f"{r[f'{k}_hub_p50_ms'] - r[f'{k}_direct_p50_ms']:+.1f} / "
            f"{r[f'{k}_hub_p99_ms'] - r[f'{k}_direct_p99_ms']:+.1f} ms added"
        )
        rate_reference = (
            f"upstream direct {_n(r[f'{k}_direct_rps'])}; {_ms(r[f'{k}_direct_p50_ms'])} / "
            f"{_ms(r[f'{k}_direct_p99_ms'])} ms → **{r[f'{k}_ratio']:.2f}×**"
        )
        hub_cpu = r[f"{k}_hub_us_per_request"]
        upstream_share = hub_cpu / max(r[f"{k}_direct_us_per_request"], 1e-9)
        cpu_reference = (
            f"upstream direct {r[f'{k}_direct_us_per_request']:,.0f} µs → hub "
            f"**{upstream_share:.2f}×** of it"
        )
        json_answer = k != "sse"
        floor = 0.95 if json_answer else 0.9
        rate_target = f"≥ {floor}× direct {_mark(r[f'{k}_ratio'] >= floor)}"
        cpu_target = f"≤ 0.25× upstream {_mark(upstream_share <= 0.25)}" if json_answer else ""
        if nginx:
            rate_reference += (
                f"; nginx {_n(r[f'{k}_nginx_rps'])}; {_ms(r[f'{k}_nginx_p50_ms'])} / "
                f"{_ms(r[f'{k}_nginx_p99_ms'])} ms → {r[f'{k}_nginx_ratio']:.2f}×"
            )
            nginx_cpu = r[f"{k}_nginx_us_per_request"]
            to_nginx = hub_cpu / max(nginx_cpu, 1e-9)
            cpu_reference += (
                f"; nginx {nginx_cpu:,.0f} µs ({r[f'{k}_nginx_upstream_us_per_request']:,.0f} "
                f"µs) → hub **{to_nginx:.1f}×** nginx"
            )
            if json_answer:
                cpu_target += f", ≤ 2× nginx {_mark(to_nginx <= 2)}"
        rows += [
            (
                label,
                f"{call.label}: tools/call req/s; p50 / p99",
                f"**{_n(r[f'{k}_hub_rps'])}**; {_ms(r[f'{k}_hub_p50_ms'])} / "
                f"{_ms(r[f'{k}_hub_p99_ms'])} ms ({added})",
                rate_reference,
                rate_target,
            ),
            (
                "",
                "CPU per tools/call: proxy (upstream behind it); new upstream connections",
                f"hub {hub_cpu:,.0f} µs ({r[f'{k}_hub_upstream_us_per_request']:,.0f} µs); "
                f"{_n(r[f'{k}_hub_new_upstream_connections'])}",
                cpu_reference,
                cpu_target,
            ),
        ]
    return rows


def _busiest(r: dict[str, float], window: str) -> str:
    """Which process ran out of CPU in a window: one near a whole core (the Python ones are
    single-threaded), else the machine if its cores were all busy, else none."""
    cores = {name: r[f"{window}_{key}_cpu_cores"] for key, name in PROCESSES.items()}
    busiest = max(cores, key=lambda name: cores[name])
    rest = [f"{name} {value:.2f}" for name, value in cores.items() if name != busiest]
    rest.append(f"other processes {r[f'{window}_others_cpu_cores']:.2f}")
    spent = f"{busiest} at {cores[busiest]:.2f} cores; {', '.join(rest)}"
    if cores[busiest] >= 0.9:
        return f"saturated: **{spent}**"
    if sum(cores.values()) + r[f"{window}_others_cpu_cores"] >= 0.9 * r["cores"]:
        return f"saturated: all {r['cores']:.0f} cores busy ({spent})"
    return f"none saturated ({spent})"


def _operator(r: dict[str, float]) -> list[Row]:
    rows: list[Row] = [
        (
            f"operator stream ({r['dashboards']:,.0f} dashboards, {r['tasks']:,.0f} tasks)",
            f"initial state to every dashboard, hello … synced ({r['initial_mb']:.2f} MB each)",
            f"**{r['initial_seconds']:.2f} s**",
            f"p50 dashboard {r['initial_p50_seconds']:.2f} s",
            "",
        )
    ]
    windows = [f"paced{i}" for i in range(1, 100) if f"paced{i}_offered" in r] + ["flat"]
    for w in windows:
        offered = (
            f"flat out ({r['flat_in_flight']:.0f} writes in flight)"
            if w == "flat"
            else f"offered {_n(r[f'{w}_offered'])}/s"
        )
        rows.append(
            (
                "",
                f"{offered}: changes/s written → frames/s delivered (per dashboard; share of "
                "changes a dashboard saw, mean / slowest); p50 / p99 write→delivery",
                f"{_n(r[f'{w}_written'])} → **{_n(r[f'{w}_rate'])}** "
                f"({_n(r[f'{w}_per_dashboard'])}; {r[f'{w}_share']:.0%} / "
                f"{r[f'{w}_share_min']:.0%}); {_ms(r[f'{w}_p50_ms'])} / "
                f"**{_ms(r[f'{w}_p99_ms'])}** ms",
                f"hub {r[f'{w}_us_per_frame']:.1f} µs CPU per frame; {_busiest(r, w)}",
                "",
            )
        )
    return rows


_ROWS: dict[str, Callable[[dict[str, float]], list[Row]]] = {
    "fanout": _fanout,
    "storm": _storm,
    "poll": _poll,
    "push_vs_poll": _push_vs_poll,
    "cold_start": _cold_start,
    "writes": _writes,
    "front_door": _front_door,
    "operator": _operator,
}


def as_json(results: Results, machine: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    return {"machine": machine, "run": run, **results}


def markdown(results: Results, machine: dict[str, Any], run: dict[str, Any]) -> str:
    versions = machine["versions"]
    lines = [
        f"Machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gb']} GB, "
        f"{machine['os']}, {machine['python']}; taskhub {versions['taskhub']}, "
        f"uvicorn {versions['uvicorn']}, uvloop {versions['uvloop']}, "
        f"httptools {versions['httptools']}, starlette {versions['starlette']}, "
        f"msgspec {versions['msgspec']}, nats-py {versions['nats-py']}, mcp {versions['mcp']}, "
        f"nats-server {versions['nats-server']}.",
        f"Run: `{run['command']}` — {run['sizes']} sizes, median of {run['repeat']} "
        f"repetition(s), {run['seconds']:.0f} s, load average {run['load_before']:.2f} before "
        f"and {run['load_after']:.2f} after.",
        "",
        "| scenario | measure | hub | reference (same run) | target |",
        "|---|---|---|---|---|",
    ]
    for name, rows in _ROWS.items():
        if name in results:
            lines.extend("| " + " | ".join(row) + " |" for row in rows(results[name]))
    # Tables of their own: upstream_tasks (a row per side), peers (bench/peers/: a column
    # per target).
    tables = []
    if "upstream_tasks" in results:
        tables.append(upstream_tasks_table(results["upstream_tasks"]))
    peers = peers_report.table(results, run.get("skipped", {}), machine.get("peers"))
    if peers:
        tables.append(peers)
    if tables and lines[-1] == "|---|---|---|---|---|":  # only such scenarios ran
        del lines[-3:]
    for table in tables:
        lines += ["", *table]
    return "\n".join(lines) + "\n"
