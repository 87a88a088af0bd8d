"""Scenario (j), tasks an upstream keeps: C clients follow T tasks of a poll-only upstream
(examples/own_store, bench/own_store_upstream.py) for a while, through the hub and directly,
and the upstream's load, the CPU of each process and the clients' staleness are compared.

Through the hub (`taskhub serve --upstream URL`, `--poll-burst 0`: every client here is the
same anonymous caller), half the clients poll `tasks/get` every pollIntervalMs and half hold
a `subscriptions/listen` stream; the hub answers the pollers from a state no older than the
interval and polls the upstream for the listeners. Directly, the same clients go to the
upstream itself, which offers no listen: all of them poll. Ten clients per task (the issue's
figure), so the hub should read each task about once per interval (T / interval reads/s)
where the direct clients make C / interval requests: ≥ 10× fewer.

Each task's state changes every `ut_change_interval_ms`, the T tasks spread over that
interval; each change's time is in the state (`statusMessage: "t=<time_ns>"`, beside
`lastUpdatedAt`), so staleness is a client's receive time less it, same clock. Target: p99
≤ pollIntervalMs + 100 ms. Upstream requests are its own count (`GET /stats`); CPU is each
process's over the measured window (the hub's nats-server separately: the hub records each
state it reads there, for the other replicas). The two sides alternate which goes first.
"""

from __future__ import annotations

import asyncio
import os
import re
import time

import msgspec

from bench import protocol
from bench.control import Worker
from bench.harness import Harness, Server, bucket_name, server_stats
from bench.processes import cpu_seconds, machine_busy_seconds
from bench.sizes import Sizes
from bench.stats import Metrics, medians

SIDES = ("direct", "hub")
TASK_MS = 3_600_000  # the `slow` tool's run: longer than any bench run, so no task ends
STALENESS_MARGIN_MS = 100  # the target: p99 ≤ pollIntervalMs + this
RATIO_TARGET = 10.0  # direct ÷ hub upstream requests, at 10 clients per task
ABOUT = 1.25  # "about T / interval": the hub's reads at most this many times that
_TASK_ID = re.compile(rb'"taskId":"([^"]+)"')


async def _request(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """One request on a fresh connection; (status, body)."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(data)
            responses = protocol.ResponseReader()
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    raise ConnectionError("closed before a response")
                answers = responses.feed(chunk)
                if answers:
                    return answers[0]
        finally:
            writer.close()


async def _create(hub: Server, count: int) -> list[str]:
    """`count` tasks made through the hub (`slow`, as a task), so the hub keeps them."""
    task_ids = []
    for i in range(count):
        request = protocol.tools_call(hub.port, "slow", {"ms": TASK_MS, "value": "done"}, i + 1)
        status, body = await _request(hub.port, request)
        found = _TASK_ID.search(body)
        if status != 200 or b'"resultType":"task"' not in body or found is None:
            raise RuntimeError(f"tools/call through the hub: {status} {body[:300]!r}")
        task_ids.append(found.group(1).decode())
    return task_ids


async def _pace(upstream: Server, interval_ms: int) -> int:
    request = (
        f"POST /pace?interval_ms={interval_ms} HTTP/1.1\r\nHost: 127.0.0.1:{upstream.port}\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    status, body = await _request(upstream.port, request)
    if status != 200:
        raise RuntimeError(f"{upstream.name} /pace answered {status}")
    paced: int = msgspec.json.decode(body)["tasks"]
    return paced


async def _upstream_gets(upstream: Server) -> int:
    return (await server_stats(upstream)).get("tasks/get", 0)


async def _side(
    h: Harness,
    loadgen: Worker,
    s: Sizes,
    side: str,
    upstream: Server,
    hub: Server,
    tasks: list[str],
) -> Metrics:
    """One side's window: its clients started, warmed up, measured, stopped."""
    target = hub if side == "hub" else upstream
    listeners = s.ut_clients // 2 if side == "hub" else 0
    started = await loadgen.call(
        "follow_start",
        180,
        port=target.port,
        task_ids=tasks,
        pollers=s.ut_clients - listeners,
        listeners=listeners,
        interval_ms=s.ut_poll_interval_ms,
    )
    try:
        if started["failed"]:
            raise RuntimeError(
                f"upstream_tasks {side}: {started['failed']} of {listeners} listen streams "
                f"failed: {started['first_error']}"
            )
        await asyncio.sleep(s.ut_warmup_seconds)
        recording = await h.record(hub, "upstream-tasks", s.ut_seconds) if side == "hub" else None
        nats = h.nats.process
        pids = {
            "upstream": upstream.child.pid,
            "hub": hub.child.pid,
            "nats": nats.pid if nats is not None else 0,
            "loadgen": loadgen.child.pid,
        }
        gets = await _upstream_gets(upstream)
        cpu = {name: cpu_seconds(pid) if pid else 0.0 for name, pid in pids.items()}
        busy = machine_busy_seconds()
        clock = time.perf_counter()
        measured = await loadgen.call("follow_measure", s.ut_seconds + 60, seconds=s.ut_seconds)
        seconds = time.perf_counter() - clock
        busy = machine_busy_seconds() - busy
        cpu = {name: (cpu_seconds(pid) if pid else 0.0) - cpu[name] for name, pid in pids.items()}
        gets = await _upstream_gets(upstream) - gets
        await h.report_profile(recording)
    finally:
        await loadgen.call("follow_stop", 60)
    errors = measured["poll_errors"] + measured["listen_errors"]
    if errors:
        h.log(f"  upstream_tasks {side}: {errors} errors, first: {measured['first_error']}")
    # Errors are figures to report (the first one's text is logged); most answers failing
    # means the setup is broken, not measured.
    if errors > max(1, measured["polls"] + measured["frames"]) / 2:
        raise RuntimeError(f"upstream_tasks {side}: {errors} errors: {measured['first_error']}")
    window: Metrics = {
        "upstream_gets_per_s": gets / seconds,
        "client_requests_per_s": measured["polls"] / measured["seconds"],
        "frames_per_s": measured["frames"] / measured["seconds"],
        "errors": errors,
        "streams_lost": measured["streams_lost"],
        "loadgen_cpu_cores": cpu["loadgen"] / seconds,
        "others_cpu_cores": max(0.0, busy - sum(cpu.values())) / seconds,
        "samples": measured["staleness_samples"],
    }
    for name in ("upstream", "hub", "nats"):
        window[f"{name}_cpu_s"] = cpu[name]
    prefixes = ("staleness_", "poll_staleness_") + (("listen_staleness_",) if listeners else ())
    for prefix in prefixes:
        for q in ("p50_ms", "p99_ms"):
            window[prefix + q] = measured[prefix + q]
    h.log(
        f"  {side}: upstream {window['upstream_gets_per_s']:,.1f} tasks/get/s, staleness "
        f"p50 {window['staleness_p50_ms']:.0f} p99 {window['staleness_p99_ms']:.0f} ms "
        f"({window['samples']:.0f} changes seen), upstream {cpu['upstream']:.2f} s CPU, "
        f"hub {cpu['hub']:.2f} s, nats-server {cpu['nats']:.2f} s, {errors:.0f} errors"
    )
    return window


async def upstream_tasks(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("upstream-tasks"))
    loadgen = await h.loadgen()
    upstream = await h.start_own_store(poll_interval_ms=s.ut_poll_interval_ms)
    hub = await h.start_hub(
        bucket,
        max_streams=s.ut_clients + 100,
        upstreams=[f"http://127.0.0.1:{upstream.port}/mcp"],
    )
    tasks = await _create(hub, s.ut_tasks)
    paced = await _pace(upstream, s.ut_change_interval_ms)
    if paced != len(tasks):
        raise RuntimeError(f"upstream_tasks: {paced} tasks paced, {len(tasks)} made")
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {
            "clients": s.ut_clients,
            "tasks": s.ut_tasks,
            "poll_interval_ms": s.ut_poll_interval_ms,
            "change_interval_ms": s.ut_change_interval_ms,
            "seconds": s.ut_seconds,
            "cores": float(os.cpu_count() or 1),
        }
        sides = list(SIDES) if rep % 2 == 0 else list(reversed(SIDES))
        for side in sides:
            window = await _side(h, loadgen, s, side, upstream, hub, tasks)
            run.update({f"{side}_{key}": value for key, value in window.items()})
        run["ratio"] = run["direct_upstream_gets_per_s"] / max(run["hub_upstream_gets_per_s"], 1e-9)
        run["hub_reads_per_interval"] = run["hub_upstream_gets_per_s"] / (
            s.ut_tasks * 1000 / s.ut_poll_interval_ms
        )
        h.log(
            f"upstream_tasks #{rep + 1}: upstream tasks/get "
            f"{run['direct_upstream_gets_per_s']:,.0f}/s direct, "
            f"{run['hub_upstream_gets_per_s']:,.1f}/s through the hub "
            f"({run['ratio']:.1f}× fewer)"
        )
        runs.append(run)
    await h.stop(hub)
    await h.stop(upstream)
    await h.close_worker(loadgen)
    return medians(runs)


# -- the table ---------------------------------------------------------------------------


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗ missed"


def _ms(value: float) -> str:
    return f"{value:,.0f}"


def table(r: dict[str, float]) -> list[str]:
    """The scenario's own table (its columns are not the main table's), with its notes."""
    clients, tasks = int(r["clients"]), int(r["tasks"])
    interval = r["poll_interval_ms"]
    half = clients // 2
    bound = interval + STALENESS_MARGIN_MS
    expected = tasks * 1000 / interval
    about = (
        f"Upstream tasks: {clients:,} clients following {tasks:,} tasks of a poll-only upstream "
        f"(examples/own_store, pollIntervalMs {interval:.0f}; each task changes state every "
        f"{r['change_interval_ms']:,.0f} ms), {r['seconds']:g} s measured per side. Through "
        f"the hub {clients - half:,} clients poll tasks/get every pollIntervalMs and {half:,} "
        f"listen; directly all {clients:,} poll, the upstream offering no listen. CPU seconds "
        "over the measured window; staleness = client receive time − the state's change time "
        "at the upstream (same clock)."
    )
    rows = [
        "| upstream_tasks | upstream tasks/get per s | upstream CPU s | hub CPU s "
        "(+ its nats-server) | staleness p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|",
        f"| direct: {clients:,} poll the upstream (no listen there) | "
        f"{r['direct_upstream_gets_per_s']:,.1f} | {r['direct_upstream_cpu_s']:.2f} | — | "
        f"{_ms(r['direct_staleness_p50_ms'])} / {_ms(r['direct_staleness_p99_ms'])} | "
        f"{r['direct_errors']:,.0f} |",
        f"| hub: {clients - half:,} poll, {half:,} listen | "
        f"**{r['hub_upstream_gets_per_s']:,.1f}** | {r['hub_upstream_cpu_s']:.2f} | "
        f"{r['hub_hub_cpu_s']:.2f} (+ {r['hub_nats_cpu_s']:.2f}) | "
        f"{_ms(r['hub_staleness_p50_ms'])} / **{_ms(r['hub_staleness_p99_ms'])}** "
        f"(polling {_ms(r['hub_poll_staleness_p50_ms'])} / {_ms(r['hub_poll_staleness_p99_ms'])}; "
        f"listening {_ms(r['hub_listen_staleness_p50_ms'])} / "
        f"{_ms(r['hub_listen_staleness_p99_ms'])}) | {r['hub_errors']:,.0f} |",
    ]
    stale = {
        "all clients": r["hub_staleness_p99_ms"],
        "polling": r["hub_poll_staleness_p99_ms"],
        "listening": r["hub_listen_staleness_p99_ms"],
    }
    verdicts = ", ".join(f"{kind} {_ms(p99)} {_mark(p99 <= bound)}" for kind, p99 in stale.items())
    notes = [
        f"Targets: (1) upstream requests direct ÷ through the hub **{r['ratio']:.2f}×**: "
        f"≥ {RATIO_TARGET:.0f}× at 10 clients per task {_mark(r['ratio'] >= RATIO_TARGET)} "
        "(direct, 10 clients per task make 10 × tasks ÷ interval requests/s, so this asks the "
        "hub to read each task at most once per interval); (2) the hub's upstream reads "
        f"{r['hub_upstream_gets_per_s']:,.1f}/s = {r['hub_reads_per_interval']:.2f}× tasks ÷ "
        f"interval ({expected:,.0f}/s): about 1×, read here as ≤ {ABOUT}× "
        f"{_mark(r['hub_reads_per_interval'] <= ABOUT)}; (3) staleness p99 through the hub ≤ "
        f"pollIntervalMs + {STALENESS_MARGIN_MS} = {bound:,.0f} ms: {verdicts} (direct "
        f"{_ms(r['direct_staleness_p99_ms'])}).",
        f"Clients' requests: {r['direct_client_requests_per_s']:,.0f}/s direct, "
        f"{r['hub_client_requests_per_s']:,.0f}/s polls + {r['hub_frames_per_s']:,.0f} listen "
        f"frames/s through the hub; listen streams lost {r['hub_streams_lost']:,.0f}; "
        f"load generator at {r['direct_loadgen_cpu_cores']:.2f} / "
        f"{r['hub_loadgen_cpu_cores']:.2f} cores, other processes at "
        f"{r['direct_others_cpu_cores']:.2f} / {r['hub_others_cpu_cores']:.2f} cores "
        f"(direct / hub; {r['cores']:.0f} cores).",
    ]
    return [about, "", *rows, "", *notes]
