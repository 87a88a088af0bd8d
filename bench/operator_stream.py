"""Scenario (h), the operator stream: D dashboards (`GET /operator/stream`, docs/dashboard.md)
follow a hub whose bucket holds T tasks while the writer changes them at paced rates, then
flat out: changes/s written and frames/s delivered, the share of the changes each dashboard
saw, write→delivery latency, hub CPU per frame, and which process ran out of CPU first.

Every dashboard sees every change (the writer's tasks are all `anonymous`'s, the caller of
an open hub), so one change costs the hub D frames. A dashboard that falls behind is
coalesced, not queued: it sees fewer changes, and the share reports how many fewer. Before
the changes, the time until all D dashboards hold their initial state (hello … synced) is
measured on a fresh hub, as a page reload of the whole operations room would see it.
"""

from __future__ import annotations

import asyncio
import os

from bench.control import Worker
from bench.harness import Harness, Server, bucket_name
from bench.processes import cpu_seconds, machine_busy_seconds
from bench.sizes import Sizes
from bench.stats import Metrics, medians

# The processes whose CPU a window reports (JSON key prefix → the table's name), any of
# which may be the one that runs out of CPU first on a small machine.
PROCESSES = {"hub": "hub", "writer": "writer", "loadgen": "load generator", "nats": "nats-server"}
DRAIN_S = 30.0  # after a window, at most this long for the hub to deliver what it holds


class Room:
    """The dashboards of one hub, the writer changing their tasks, and the CPU of both."""

    def __init__(
        self, h: Harness, writer: Worker, loadgen: Worker, task_ids: list[str], hub: Server
    ) -> None:
        self.h = h
        self.writer = writer
        self.loadgen = loadgen
        self.task_ids = task_ids
        self.hub = hub
        nats = h.nats.process
        self._pids = {
            "hub": hub.child.pid,
            "writer": writer.child.pid,
            "loadgen": loadgen.child.pid,
            "nats": nats.pid if nats is not None else None,
        }

    def _cpu(self) -> dict[str, float]:
        spent = {name: cpu_seconds(pid) if pid else 0.0 for name, pid in self._pids.items()}
        return {**spent, "machine": machine_busy_seconds()}

    async def window(
        self,
        s: Sizes,
        *,
        rate: float,
        in_flight: int | None = None,
        label: str = "",
    ) -> Metrics:
        """Changes at `rate`/s (at most `in_flight` writes outstanding): what was written,
        what the dashboards got, and every process's CPU meanwhile."""
        dashboards = s.operator_dashboards
        await self.loadgen.call("dashboards_seen", 30)  # count from here
        await self.writer.call(
            "pace_start", 30, task_ids=self.task_ids, rate=rate, in_flight=in_flight
        )
        recording = None
        try:
            await asyncio.sleep(s.warmup_seconds + 0.5)
            if label:
                recording = await self.h.record(self.hub, label, s.operator_seconds)
            before = self._cpu()
            measured = await self.loadgen.call(
                "dashboards_measure", s.operator_seconds + 60, seconds=s.operator_seconds
            )
            after = self._cpu()
        finally:
            written = await self.writer.call("pace_stop", 60)
        await self.h.report_profile(recording)
        if measured["open"] < dashboards:
            self.h.log(f"  the hub closed {dashboards - measured['open']} dashboards")
        if written["errors"]:
            self.h.log(f"  {written['errors']} task writes failed")
        drained = await self.drain()
        # Every change written since pace_start, against the frames each dashboard got for
        # them, late ones included: below 1 only where the hub coalesced.
        seen = await self.loadgen.call("dashboards_seen", 30)
        changes = max(1, written["updates"])
        seconds = measured["seconds"]
        frames = max(1, measured["frames"])
        window: Metrics = {
            "offered": rate,
            "written": written["rate"],
            "rate": measured["rate"],
            "per_dashboard": measured["rate"] / dashboards,
            "share": seen["mean"] / changes,
            "share_min": seen["min"] / changes,
            "drain_seconds": drained,
            "p50_ms": measured["p50_ms"],
            "p99_ms": measured["p99_ms"],
            "us_per_frame": (after["hub"] - before["hub"]) / frames * 1e6,
        }
        if in_flight is not None:
            window["in_flight"] = in_flight
        for name in PROCESSES:
            window[f"{name}_cpu_cores"] = (after[name] - before[name]) / seconds
        # What the rest of the machine took meanwhile (the bench's orchestrator included):
        # on a shared machine, the reason a window can be short of cores with none of ours busy.
        ours = sum(after[name] - before[name] for name in PROCESSES)
        others = after["machine"] - before["machine"] - ours
        window["others_cpu_cores"] = max(0.0, others) / seconds
        self.h.log(
            f"  offered {rate:,.0f}/s: written {written['rate']:,.0f}/s, delivered "
            f"{measured['rate']:,.0f} frames/s ({window['share']:.0%} of changes per dashboard), "
            f"p99 {window['p99_ms']:.1f} ms, hub at {window['hub_cpu_cores']:.2f} cores; "
            f"drained in {drained:.1f} s"
        )
        return window

    async def drain(self) -> float:
        """Wait until the dashboards stop receiving (the hub caught up); how long it took."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < DRAIN_S:
            quiet = await self.loadgen.call("dashboards_measure", 30, seconds=0.2, latency=False)
            if quiet["frames"] == 0:
                return loop.time() - started
        self.h.log(f"  the hub was still delivering {DRAIN_S:.0f} s after the writer stopped")
        return loop.time() - started


async def operator(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("operator"))
    writer = await h.writer(bucket)
    loadgen = await h.loadgen()
    created = await writer.call("create", 300, count=s.operator_tasks)
    task_ids: list[str] = created["task_ids"]
    dashboards = s.operator_dashboards
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {
            "dashboards": dashboards,
            "tasks": s.operator_tasks,
            "cores": float(os.cpu_count() or 1),
        }
        hub = await h.start_hub(bucket, max_streams=dashboards + 100)
        recording = await h.record(
            hub, "operator-initial", 2 + s.operator_tasks * dashboards / 200_000
        )
        opened = await loadgen.call("dashboards_open", 300, port=hub.port, dashboards=dashboards)
        await h.report_profile(recording)
        if opened["failed"]:
            raise RuntimeError(
                f"operator: {opened['failed']} of {dashboards} dashboards failed: "
                f"{opened['first_error']}"
            )
        if opened["initial_tasks_min"] != s.operator_tasks:
            raise RuntimeError(
                f"operator: a dashboard's initial state held {opened['initial_tasks_min']} "
                f"tasks, not {s.operator_tasks}"
            )
        run["initial_seconds"] = opened["seconds"]
        run["initial_p50_seconds"] = opened["p50_seconds"]
        run["initial_mb"] = opened["initial_bytes"] / dashboards / 1e6
        room = Room(h, writer, loadgen, task_ids, hub)
        windows: list[tuple[str, float, int | None]] = [
            (f"paced{i + 1}", rate, None) for i, rate in enumerate(s.operator_rates)
        ]
        windows.append(("flat", s.operator_flat_rate, s.operator_flat_in_flight))
        for key, rate, in_flight in windows:
            window = await room.window(s, rate=rate, in_flight=in_flight, label=f"operator-{key}")
            run.update({f"{key}_{name}": value for name, value in window.items()})
        await loadgen.call("dashboards_close", 60)
        await h.stop(hub)
        h.log(
            f"operator #{rep + 1}: {dashboards} dashboards synced {s.operator_tasks:,} tasks "
            f"in {run['initial_seconds']:.2f} s; flat out {run['flat_written']:,.0f} changes/s "
            f"→ {run['flat_rate']:,.0f} frames/s"
        )
        runs.append(run)
    await h.close_worker(writer)
    await h.close_worker(loadgen)
    return medians(runs)
