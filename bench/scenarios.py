"""The scenarios of issues 6 and 11, each a function of the harness, sizes and a repeat count.

Each repetition measures the hub and its reference in the same minute on the same
machine; the scenario returns the median of every figure over the repetitions (and
the median of the per-repetition ratios, which cancel noise that hits a repetition as
a whole). Servers that report memory per stream are started fresh each repetition,
because an allocator that already grew for the last run would hide what a stream costs.
Server CPU per frame or per request is reported beside every rate: on a small machine
the server shares its cores with clients, writer and nats-server, and CPU per unit of
work is the figure that sharing disturbs least.

(a) fanout       S streams over T tasks; notifications/s delivered at saturation, hub vs
                 raw ceiling; publish→client latency at 50% of the hub's saturation,
                 with the raw ceiling's at the same rate beside it (what NATS and the
                 machine add); CPU per frame and RSS per stream.
(b) storm        time until N streams have their ack and initial snapshot.
(c) poll         closed-loop tasks/get on 64 keep-alive connections: hub, raw, origin.
(d) push_vs_poll the same clients follow their tasks by polling the origin every
                 pollIntervalMs, then by listening at the hub: requests reaching the
                 fleet, bytes on the wire, staleness.
(e) cold_start   hub start with the bucket full until /readyz is 200; restarts from a
                 checkpoint written at a stop, and from one written while running.
(f) writes       bridge updates/s with concurrent writers, under nats-server's default
                 sync_interval (2m) and under "always" (an fsync before every ack).
(g) front_door   closed-loop `tools/call` through the hub's front door against the same
                 upstream called directly (bench/front_door.py).
(h) operator     D dashboards on `GET /operator/stream` over T tasks: their initial state,
                 then changes at paced rates and flat out (bench/operator_stream.py).
(i) peers_*      fan-out, storm and tasks/get beside nchan, Pushpin and nginx static
                 (bench/peers/scenarios.py).
(j) upstream_tasks  C clients follow T tasks of a poll-only upstream (examples/own_store),
                 half polling and half listening through the hub, all polling directly:
                 upstream tasks/get per s, CPU, staleness (bench/upstream_tasks.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.control import Params, Worker
from bench.front_door import front_door
from bench.harness import Harness, Server, bucket_name, server_stats
from bench.operator_stream import operator
from bench.peers.scenarios import peers_fanout, peers_poll, peers_storm
from bench.processes import cpu_seconds
from bench.sizes import Sizes
from bench.stats import Metrics, medians
from bench.upstream_tasks import upstream_tasks

Scenario = Callable[[Harness, Sizes, int], Awaitable[Metrics]]


async def _open_streams(
    loadgen: Worker,
    server: Server,
    task_ids: list[str],
    streams: int,
    per_stream: int,
    window: int,
) -> tuple[Params, float]:
    """Open `streams` listen streams; (the loadgen's answer, server RSS KB per stream)."""
    await asyncio.sleep(0.2)  # let the server's start-up allocations settle
    before = server.child.rss_bytes()
    opened = await loadgen.call(
        "listen_open",
        300,
        port=server.port,
        task_ids=task_ids,
        per_stream=per_stream,
        streams=streams,
        window=window,
    )
    if opened["failed"]:
        raise RuntimeError(
            f"{server.name}: {opened['failed']} of {streams} streams failed: "
            f"{opened['first_error']}"
        )
    kb = (server.child.rss_bytes() - before) / 1024 / streams
    return opened, kb


@dataclass
class Paced:
    """A writer pacing updates to `task_ids` while a load generator's streams are measured."""

    h: Harness
    writer: Worker
    loadgen: Worker
    task_ids: list[str]
    followers: float  # streams that receive each update
    streams: int  # streams the load generator holds open

    async def window(
        self,
        server: Server,
        *,
        rate: float,
        seconds: float,
        warmup: float,
        latency: bool = False,
        label: str = "",
    ) -> Metrics:
        """Updates at `rate`/s; frames/s delivered, offered, server CPU, latency if asked."""
        await self.writer.call("pace_start", 30, task_ids=self.task_ids, rate=rate)
        recording = None
        try:
            await asyncio.sleep(warmup)
            if label:
                recording = await self.h.record(server, label, seconds)
            user, system = server.child.cpu_times()
            measured = await self.loadgen.call(
                "listen_measure", seconds + 60, seconds=seconds, latency=latency
            )
            user_after, system_after = server.child.cpu_times()
            cpu = user_after + system_after - user - system
            system = system_after - system
        finally:
            written = await self.writer.call("pace_stop", 60)
        await self.h.report_profile(recording)
        if measured["open"] < self.streams:
            self.h.log(f"  {server.name} closed {self.streams - measured['open']} streams")
        window: Metrics = {
            "rate": measured["rate"],
            "offered": written["rate"] * self.followers,
            "bytes": measured["bytes"],
            "cpu_cores": cpu / measured["seconds"],
            "us_per_frame": cpu / max(1, measured["frames"]) * 1e6,
            "sys_us_per_frame": system / max(1, measured["frames"]) * 1e6,
            "client_cpu_cores": measured["client_cpu_s"] / measured["seconds"],
        }
        if latency:
            window.update({key: measured[key] for key in ("p50_ms", "p99_ms", "p999_ms")})
        return window

    async def saturation(self, server: Server, s: Sizes) -> Metrics:
        """The most frames/s `server` delivers, found by a short search.

        An overload probe at the writer's top rate shows roughly what the server manages;
        then the offered rate starts at 1.5× that and grows 1.5× per step while at least
        95% of it is delivered. How a server fares far past saturation is its own affair
        (work spent on updates it coalesces away, or saved by never going idle), so the
        figure is the best window's, probe included, and no server is judged only at an
        overload it was never sized for.
        """
        top = s.fanout_saturation_rate
        probe = await self.window(server, rate=top, seconds=s.fanout_probe_seconds, warmup=0.2)
        best = probe
        overloaded = probe["rate"] < 0.95 * probe["offered"]
        rate = min(top, 1.5 * probe["rate"] / self.followers)
        for _ in range(3):
            step = await self.window(
                server,
                rate=rate,
                seconds=s.fanout_seconds,
                warmup=s.warmup_seconds,
                label="fanout-saturation",
            )
            self.h.log(
                f"  {server.name}: offered {step['offered']:,.0f}/s, delivered "
                f"{step['rate']:,.0f}/s at {step['cpu_cores']:.2f} cores "
                f"(overload probe {probe['rate']:,.0f}/s)"
            )
            if step["rate"] > best["rate"]:
                best = step
            if step["rate"] < 0.95 * step["offered"]:
                overloaded = True
                break
            if rate >= top:
                break
            rate = min(top, rate * 1.5)
        # 0: even the writer's top rate was delivered in full, so the figure is a floor.
        best["saturated"] = float(overloaded)
        return best


async def fanout(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("fanout"))
    writer = await h.writer(bucket)
    loadgen = await h.loadgen()
    task_ids: list[str] = (await writer.call("create", 120, count=s.fanout_tasks))["task_ids"]
    followers = s.fanout_streams * s.fanout_follow / s.fanout_tasks
    paced = Paced(h, writer, loadgen, task_ids, followers, s.fanout_streams)
    runs: list[Metrics] = []
    half_rate = 0.0
    for rep in range(repeat):
        run: Metrics = {
            "streams": s.fanout_streams,
            "tasks": s.fanout_tasks,
            "followers_per_task": followers,
        }
        hub, raw = await asyncio.gather(
            h.start_hub(bucket, max_streams=s.fanout_streams + 100), h.start_raw(bucket)
        )
        for server in (hub, raw):
            name = server.name
            _, run[f"{name}_kb_per_stream"] = await _open_streams(
                loadgen, server, task_ids, s.fanout_streams, s.fanout_follow, 1000
            )
            best = await paced.saturation(server, s)
            keys = ("rate", "offered", "saturated", "cpu_cores", "us_per_frame", "sys_us_per_frame")
            for key in keys:
                run[f"{name}_{key}"] = best[key]
            run[f"{name}_client_cpu_cores"] = best["client_cpu_cores"]
            # Latency at half the hub's saturation (updates/s = frames/s ÷ fan-out); the raw
            # ceiling at the same rate shows what the machine itself adds (NATS, scheduling).
            if server is hub:
                half_rate = 0.5 * best["rate"] / followers
            half = await paced.window(
                server,
                rate=half_rate,
                seconds=s.fanout_seconds,
                # Settle first: an overloaded hub leaves queues and garbage behind.
                warmup=s.warmup_seconds + 1.5,
                latency=True,
                label="fanout-half-load",
            )
            prefix = "" if server is hub else "raw_"
            for key in ("p50_ms", "p99_ms", "p999_ms"):
                run[prefix + key] = half[key]
            if server is hub:
                run["latency_rate"] = half["rate"]
                # The load generator's share: near a core, it is the one adding the tail.
                run["latency_client_cores"] = half["client_cpu_cores"]
            await loadgen.call("listen_close", 60)
            await h.stop(server)
        run["ratio"] = run["hub_rate"] / run["raw_rate"] if run["raw_rate"] else 0.0
        # The same comparison per CPU second, which the other processes sharing the
        # cores (client, writer, nats-server) disturb less than the rates.
        run["cpu_ratio"] = run["raw_us_per_frame"] / max(run["hub_us_per_frame"], 1e-9)
        h.log(
            f"fanout #{rep + 1}: hub {run['hub_rate']:,.0f}/s raw {run['raw_rate']:,.0f}/s "
            f"p99 {run['p99_ms']:.1f} ms"
        )
        runs.append(run)
    await h.close_worker(writer)
    await h.close_worker(loadgen)
    return medians(runs)


async def storm(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("storm"))
    writer = await h.writer(bucket)
    loadgen = await h.loadgen()
    task_ids: list[str] = (await writer.call("create", 120, count=s.storm_tasks))["task_ids"]
    await h.close_worker(writer)
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {"streams": s.storm_streams}
        hub, raw = await asyncio.gather(
            h.start_hub(bucket, max_streams=s.storm_streams + 100), h.start_raw(bucket)
        )
        for server, prefix in ((hub, ""), (raw, "raw_")):
            recording = await h.record(server, "storm", 2 + s.storm_streams / 2000)
            opened, kb = await _open_streams(
                loadgen, server, task_ids, s.storm_streams, 1, s.storm_window
            )
            await h.report_profile(recording)
            run[f"{prefix}seconds"] = opened["seconds"]
            run[f"{prefix}kb_per_stream"] = kb
            await loadgen.call("listen_close", 120)
            await h.stop(server)
        h.log(f"storm #{rep + 1}: {s.storm_streams} streams in {run['seconds']:.2f} s")
        runs.append(run)
    await h.close_worker(loadgen)
    return medians(runs)


async def poll(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("poll"))
    writer = await h.writer(bucket)
    task_ids: list[str] = (await writer.call("create", 120, count=s.poll_tasks))["task_ids"]
    await h.close_worker(writer)
    loadgen = await h.loadgen()
    servers = await asyncio.gather(
        h.start_hub(bucket, max_streams=100), h.start_raw(bucket), h.start_origin(bucket)
    )
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {"connections": s.poll_connections}
        for server in servers:
            recording = await h.record(server, "poll", s.warmup_seconds + s.poll_seconds)
            cpu = server.child.cpu_seconds()
            result = await loadgen.call(
                "poll",
                s.poll_seconds + 120,
                port=server.port,
                task_ids=task_ids,
                connections=s.poll_connections,
                warmup=s.warmup_seconds,
                seconds=s.poll_seconds,
            )
            cpu = server.child.cpu_seconds() - cpu
            await h.report_profile(recording)
            # Server CPU per answer: a figure the shared cores disturb less than req/s.
            run[f"{server.name}_us_per_request"] = cpu / max(1, result["all_requests"]) * 1e6
            if result["errors"]:
                raise RuntimeError(f"{server.name}: {result['errors']} tasks/get errors")
            run[f"{server.name}_rps"] = result["rps"]
            elapsed = s.warmup_seconds + s.poll_seconds
            run[f"{server.name}_client_cpu_cores"] = result["client_cpu_s"] / elapsed
            for key in ("p50_ms", "p99_ms"):
                run[f"{server.name}_{key}"] = result[key]
        run["raw_cpu_ratio"] = run["raw_us_per_request"] / run["hub_us_per_request"]
        run["origin_cpu_ratio"] = run["origin_us_per_request"] / run["hub_us_per_request"]
        run["raw_ratio"] = run["hub_rps"] / run["raw_rps"]
        run["origin_ratio"] = run["hub_rps"] / run["origin_rps"]
        h.log(
            f"poll #{rep + 1}: hub {run['hub_rps']:,.0f}/s raw {run['raw_rps']:,.0f}/s "
            f"origin {run['origin_rps']:,.0f}/s"
        )
        runs.append(run)
    for server in servers:
        await h.stop(server)
    await h.close_worker(loadgen)
    return medians(runs)


async def _origin_requests(origin: Server) -> int:
    """How many `POST /mcp` the origin has received."""
    return (await server_stats(origin))["requests"]


async def push_vs_poll(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("pvp"))
    writer = await h.writer(bucket)
    loadgen = await h.loadgen()
    created = await writer.call(
        "create", 120, count=s.pvp_clients, poll_interval_ms=s.pvp_poll_interval_ms
    )
    task_ids: list[str] = created["task_ids"]
    hub, origin = await asyncio.gather(
        h.start_hub(bucket, max_streams=s.pvp_clients + 100), h.start_origin(bucket)
    )
    rate = s.pvp_clients * 1000 / s.pvp_change_interval_ms
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {
            "clients": s.pvp_clients,
            "poll_interval_ms": s.pvp_poll_interval_ms,
            "seconds": s.pvp_seconds,
        }
        # Without the hub: every client polls the fleet (the origin) at pollIntervalMs.
        before = await _origin_requests(origin)
        await writer.call("pace_start", 30, task_ids=task_ids, rate=rate)
        try:
            polled = await loadgen.call(
                "follow_poll",
                s.pvp_seconds + 60,
                port=origin.port,
                task_ids=task_ids,
                interval_ms=s.pvp_poll_interval_ms,
                seconds=s.pvp_seconds,
            )
        finally:
            await writer.call("pace_stop", 60)
        run["fleet_requests_poll"] = await _origin_requests(origin) - before
        run["bytes_poll"] = polled["bytes"]
        run["staleness_poll_ms"] = polled["staleness_p50_ms"]
        run["staleness_poll_p99_ms"] = polled["staleness_p99_ms"]
        # With the hub: the same clients listen there; the fleet only writes to NATS.
        before = await _origin_requests(origin)
        await _open_streams(loadgen, hub, task_ids, s.pvp_clients, 1, 1000)
        pushed = await Paced(h, writer, loadgen, task_ids, 1, s.pvp_clients).window(
            hub,
            rate=rate,
            seconds=s.pvp_seconds,
            warmup=s.warmup_seconds,
            latency=True,
            label="push",
        )
        await loadgen.call("listen_close", 60)
        run["fleet_requests_push"] = await _origin_requests(origin) - before
        run["bytes_push"] = pushed["bytes"]
        run["staleness_push_ms"] = pushed["p50_ms"]
        run["staleness_push_p99_ms"] = pushed["p99_ms"]
        h.log(
            f"push_vs_poll #{rep + 1}: fleet requests {run['fleet_requests_poll']:.0f} vs "
            f"{run['fleet_requests_push']:.0f}, staleness {run['staleness_poll_ms']:.0f} vs "
            f"{run['staleness_push_ms']:.1f} ms"
        )
        runs.append(run)
    await h.stop(hub)
    await h.stop(origin)
    await h.close_worker(writer)
    await h.close_worker(loadgen)
    return medians(runs)


async def cold_start(h: Harness, s: Sizes, repeat: int) -> Metrics:
    """Start to ready: from the bucket alone, then restarted from a checkpoint (after a
    hundredth of the tasks changed while no hub ran), then restarted after a SIGKILL from
    the checkpoint the running hub wrote itself (a hundredth changed after it)."""
    bucket = await h.bucket(bucket_name("cold"))
    writer = await h.writer(bucket)
    populated = await writer.call("populate", 1200, count=s.cold_tasks, in_flight=1000)
    h.log(f"cold_start: {s.cold_tasks} tasks written in {populated['seconds']:.1f} s")
    # An empty hub's RSS, so what the snapshot costs per task is what it adds.
    empty = await h.start_hub(await h.bucket(bucket_name("cold-empty")), max_streams=100)
    idle_rss = empty.child.rss_bytes()
    await h.stop(empty)

    async def started(
        label: str, saved: Path | None, every: float | None = None
    ) -> tuple[Server, Metrics]:
        hub = await h.start_hub(
            bucket, max_streams=100, wait=False, checkpoint=saved, checkpoint_every=every
        )
        # Sampled until ready, however long that takes (py-spy needs a duration).
        recording = await h.record(hub, label, 600)
        await h.wait_ready(hub, timeout=600)
        rss = hub.child.rss_bytes()
        await h.report_profile(recording, now=True)
        return hub, {
            "seconds": hub.ready_at - hub.spawned_at,
            "listening_seconds": hub.listening_at - hub.spawned_at,
            "load_seconds": hub.ready_at - hub.listening_at,
            "rss_mb": rss / 1e6,
            "rss_per_task": (rss - idle_rss) / s.cold_tasks,
        }

    changed = max(1, s.cold_tasks // 100)  # tasks changed before each restart
    runs: list[Metrics] = []
    for rep in range(repeat):
        hub, run = await started("cold-start", None)
        await h.stop(hub)
        h.log(f"cold_start #{rep + 1}: ready in {run['seconds']:.2f} s")
        runs.append(run)
    result = medians(runs)
    # The first hub with --checkpoint reads the bucket; its stop writes the file.
    saved = h.root / "cold-checkpoint"
    hub, _ = await started("cold-first-checkpoint", saved)
    stopping = time.perf_counter()
    await h.stop(hub, grace=120)
    stop_seconds = time.perf_counter() - stopping
    restarts: list[Metrics] = []
    for rep in range(repeat):
        await writer.call("populate", 600, count=changed, in_flight=1000)
        hub, run = await started("restart", saved)
        await h.stop(hub, grace=120)
        h.log(f"cold_start restart #{rep + 1}: ready in {run['seconds']:.2f} s")
        restarts.append(run)
    # A power cut: the checkpoint the running hub wrote itself, then SIGKILL (no stop),
    # and a hundredth of the tasks changed after it, which only NATS still has.
    hub, _ = await started("before-crash", saved, every=1.0)
    await writer.call("populate", 600, count=changed, in_flight=1000)
    written = saved.stat().st_mtime_ns
    deadline = time.monotonic() + 300
    while saved.stat().st_mtime_ns == written:
        if time.monotonic() > deadline:
            raise RuntimeError("the running hub wrote no checkpoint within 300 s")
        await asyncio.sleep(0.1)
    os.kill(hub.child.pid, signal.SIGKILL)
    await h.stop(hub)
    await writer.call("populate", 600, count=changed, in_flight=1000)
    hub, crashed = await started("after-crash", saved)
    await h.stop(hub, grace=120)
    await h.close_worker(writer)
    restart = medians(restarts)
    result.update({f"restart_{name}": value for name, value in restart.items()})
    result.update({f"crash_{name}": value for name, value in crashed.items()})
    result.update(
        {
            "tasks": s.cold_tasks,
            "populate_per_s": s.cold_tasks / populated["seconds"],
            "json_bytes": populated["json_bytes"],
            "checkpoint_mb": saved.stat().st_size / 1e6,
            "checkpoint_stop_seconds": stop_seconds,
        }
    )
    return result


async def _burst(writer: Worker, nats_pid: int | None, s: Sizes) -> Metrics:
    nats_cpu = cpu_seconds(nats_pid) if nats_pid is not None else 0.0
    burst: dict[str, Any] = await writer.call(
        "burst",
        s.writes_seconds + 120,
        concurrency=s.writes_concurrency,
        seconds=s.writes_seconds,
    )
    if nats_pid is not None:
        nats_cpu = cpu_seconds(nats_pid) - nats_cpu
    return {
        "updates_per_s": burst["updates_per_s"],
        "writer_cpu_cores": burst["writer_cpu_s"] / burst["seconds"],
        # The task creations before the burst count here too (a few ms).
        "nats_cpu_cores": nats_cpu / burst["seconds"],
    }


async def writes(h: Harness, s: Sizes, repeat: int) -> Metrics:
    """The harness's nats-server (sync_interval 2m), then one with "always", in turn."""
    bucket = await h.bucket(bucket_name("writes"))
    writer = await h.writer(bucket)
    synced = await h.sync_server("always")
    synced_writer = await h.writer(bucket, synced.url)
    pids = [server.process.pid if server.process else None for server in (h.nats, synced)]
    runs: list[Metrics] = []
    for rep in range(repeat):
        interval = await _burst(writer, pids[0], s)
        always = await _burst(synced_writer, pids[1], s)
        runs.append(
            {
                **interval,
                "concurrency": s.writes_concurrency,
                **{f"always_{key}": value for key, value in always.items()},
                "always_ratio": always["updates_per_s"] / interval["updates_per_s"],
            }
        )
        h.log(
            f"writes #{rep + 1}: {interval['updates_per_s']:,.0f} updates/s (sync 2m), "
            f"{always['updates_per_s']:,.0f} updates/s (sync always)"
        )
    await h.close_worker(writer)
    await h.close_worker(synced_writer)
    return medians(runs)


SCENARIOS: dict[str, Scenario] = {
    "fanout": fanout,
    "storm": storm,
    "poll": poll,
    "push_vs_poll": push_vs_poll,
    "cold_start": cold_start,
    "writes": writes,
    "front_door": front_door,
    "operator": operator,
    "upstream_tasks": upstream_tasks,
    "peers_fanout": peers_fanout,
    "peers_storm": peers_storm,
    "peers_poll": peers_poll,
}
