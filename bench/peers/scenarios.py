"""Scenarios with peers: the hub, the raw ceiling and established servers, side by side.

peers_fanout  S streams over T topics (one topic per task, S/T streams each), frames/s
              delivered at fixed offered rates: server CPU per frame, p50/p99/p99.9
              publish→client, and every process's CPU (which one ran out first). Then
              an overload window (OVERLOAD × the top rate offered: what each target
              delivers flat out) and a paced one (PACED × what that target delivered
              flat out: its saturation with no queue building).
peers_storm   N streams connect at once: wall time until every stream has its first
              frame (the hub's ack + snapshot, nchan's newest message, Pushpin's origin
              body), the server CPU it took, and RSS per idle stream.
peers_poll    closed-loop `tasks/get` on C keep-alive connections: hub, raw ceiling, and
              nginx serving the hub's own answers as static files.

Each target runs in a lane of its own: its own publisher (the writer on a bucket of its
own for hub and raw; bench/peers/publisher.py for a peer) and its own load generator, so
streams held open on one target cost nothing while another is measured. Within each
repetition the targets take turns (per rate in the fan-out, in an order rotated per
repetition elsewhere), so drift on a shared machine hits them all alike. A peer that
cannot be had, or fails to start, is recorded as skipped (bench/peers/setup.py).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from bench.control import Params, Worker, WorkerError
from bench.harness import Harness, HarnessError, Server, bucket_name
from bench.peers import nginx, pushpin, server
from bench.processes import cpu_seconds, machine_busy_seconds
from bench.protocol import ResponseReader, tasks_get
from bench.sizes import Sizes
from bench.stats import Metrics, medians

# The peers each scenario compares (the hub and the raw ceiling take part in all).
PEERS: dict[str, tuple[str, ...]] = {
    "peers_fanout": ("nchan", "pushpin"),
    "peers_storm": ("nchan", "pushpin"),
    "peers_poll": ("nginx",),
}
T = TypeVar("T")
# A stream the target refuses while many open at once is opened again, as EventSource
# does: Pushpin answers 5xx to some of a thousand concurrent requests (with its default
# ZeroMQ and zurl settings). The wall time includes the retries, and the table counts them.
OPEN_RETRIES = 10
# After a fan-out window, at most this long for the target to go quiet. Pushpin at its
# defaults still delivers its queue (up to 25,000 messages at ~2,500/s) 10 s after its
# publisher stopped: with a shorter bound its backlog ran into the next target's window,
# on a CPU the two then shared (the targets' order is rotated, not shuffled, so one
# target was always next).
DRAIN_S = 30.0
OVERLOAD = 2.0  # the overload window offers this many times the top fixed rate
PACED = 0.9  # the paced window offers this share of what the target delivered overloaded


@dataclass
class Running:
    """One started target: where streams go, and what its processes cost."""

    port: int
    cpu: Callable[[], dict[str, float]]  # CPU seconds per server process
    rss: Callable[[], int]
    stop: Callable[[], Awaitable[None]]
    publish_port: int = 0  # a peer's publish endpoint (0: the hub's path, via NATS)
    path: str | None = None  # a peer's stream GET; None: subscriptions/listen
    side: dict[str, int] = field(default_factory=dict)  # its helpers' PIDs (nats, origin)
    newest_on_connect: bool = False  # nchan: publish once per topic before streams open
    log_tail: Callable[[], str] = lambda: ""


@dataclass
class Lane:
    """A target and its own publisher and load generator, kept for the whole scenario."""

    name: str
    start: Callable[[], Awaitable[Running]]
    loadgen: Worker
    topics: list[str]
    publisher: Worker | None = None
    side: dict[str, int] = field(default_factory=dict)  # name → PID, e.g. the writer


def _server_running(h: Harness, srv: Server, side: dict[str, int]) -> Running:
    async def stop() -> None:
        await h.stop(srv)

    return Running(
        srv.port,
        lambda: {srv.name: srv.child.cpu_seconds()},
        srv.child.rss_bytes,
        stop,
        side=side,
    )


def _peer_running(h: Harness, peer: server.PeerServer) -> Running:
    async def stop() -> None:
        await server.stop(h, peer.tree)
        if peer.origin is not None:
            await h.stop(peer.origin)

    return Running(
        peer.port,
        peer.tree.cpu_by_member,
        peer.tree.rss_bytes,
        stop,
        publish_port=peer.publish_port,
        path=peer.stream_path,
        side={"grip-origin": peer.origin.child.pid} if peer.origin is not None else {},
        newest_on_connect=peer.name == "nchan",
        log_tail=peer.tree.child.log_tail,
    )


async def _lanes(h: Harness, s: Sizes, scenario: str, topics: int, streams: int) -> list[Lane]:
    """Hub and raw (each with a bucket and writer of its own), then every peer available."""
    lanes: list[Lane] = []
    nats = h.nats.process
    nats_side = {"nats-server": nats.pid} if nats is not None else {}
    for name in ("hub", "raw"):
        bucket = await h.bucket(bucket_name(f"{scenario}-{name}"))
        writer = await h.writer(bucket)
        task_ids: list[str] = (await writer.call("create", 120, count=topics))["task_ids"]

        async def start(name: str = name, bucket: str = bucket) -> Running:
            srv = await (
                h.start_hub(bucket, max_streams=streams + 100)
                if name == "hub"
                else h.start_raw(bucket)
            )
            return _server_running(h, srv, nats_side)

        loadgen = await h.loadgen()
        lanes.append(Lane(name, start, loadgen, task_ids, writer, {"writer": writer.child.pid}))
    peers: dict[str, Callable[[Harness], Awaitable[server.PeerServer]]] = {
        "nchan": nginx.start_nchan,
        "pushpin": pushpin.start_pushpin,
    }
    for name in PEERS[scenario]:
        if name not in peers or not await h.peers.available(name):
            continue
        publisher = await h.worker("publisher", ["-m", "bench.peers.publisher", "--kind", name])

        async def start_peer(
            start: Callable[[Harness], Awaitable[server.PeerServer]] = peers[name],
        ) -> Running:
            return _peer_running(h, await start(h))

        loadgen = await h.loadgen()
        ids = [str(uuid.uuid4()) for _ in range(topics)]  # task ids, as the hub's topics
        side = {"publisher": publisher.child.pid}
        lanes.append(Lane(name, start_peer, loadgen, ids, publisher, side))
    return lanes


async def _start(h: Harness, lanes: list[Lane], lane: Lane) -> Running | None:
    """Start a lane's target fresh; None if a peer fails to (it is marked skipped and
    leaves `lanes`, so every repetition measures the same targets)."""
    try:
        return await lane.start()
    except (HarnessError, OSError) as exc:
        if lane.name in ("hub", "raw"):
            raise
        h.peers.skip(lane.name, f"did not start: {str(exc).splitlines()[0][:160]}")
        lanes.remove(lane)
        return None


def _rotated(items: list[T], rep: int) -> list[T]:
    k = rep % len(items) if items else 0
    return items[k:] + items[:k]


class Meter:
    """CPU seconds of a target's processes, its lane's helpers and the whole machine."""

    def __init__(self, run: Running, side: dict[str, int]) -> None:
        self.run = run
        self.side = {**side, **run.side}

    @classmethod
    def of(cls, lane: Lane, run: Running) -> Meter:
        """A lane's target, its publisher and its load generator."""
        return cls(run, {**lane.side, "load generator": lane.loadgen.child.pid})

    def read(self) -> tuple[dict[str, float], dict[str, float], float]:
        side = {name: cpu_seconds(pid) for name, pid in self.side.items()}
        return self.run.cpu(), side, machine_busy_seconds()

    def since(
        self, before: tuple[dict[str, float], dict[str, float], float], seconds: float
    ) -> Metrics:
        """`server_s` (all server processes), and `cores_<process>` for every process."""
        server_after, side_after, machine = self.read()
        server_before, side_before, machine_before = before
        spent = {name: cpu - server_before.get(name, 0.0) for name, cpu in server_after.items()}
        spent |= {name: cpu - side_before[name] for name, cpu in side_after.items()}
        figures: Metrics = {f"cores_{name}": cpu / seconds for name, cpu in spent.items()}
        figures["server_s"] = sum(spent[name] for name in server_after)
        others = machine - machine_before - sum(spent.values())
        figures["cores_others"] = max(0.0, others) / seconds
        return figures


async def _open(lane: Lane, run: Running, streams: int, window: int) -> Params:
    if run.newest_on_connect and lane.publisher is not None:
        await lane.publisher.call("publish_once", 60, port=run.publish_port, task_ids=lane.topics)
    opened = await lane.loadgen.call(
        "listen_open",
        300,
        port=run.port,
        task_ids=lane.topics,
        per_stream=1,
        streams=streams,
        window=window,
        path=run.path,
        retries=OPEN_RETRIES,
    )
    if opened["failed"]:
        raise RuntimeError(
            f"{lane.name}: {opened['failed']} of {streams} streams failed: {opened['first_error']}"
        )
    return opened


async def _opened(
    h: Harness, lanes: list[Lane], lane: Lane, target: Running, streams: int, window: int
) -> Params | None:
    """`_open`, except that a peer whose streams fail is marked skipped (with its log's
    last line) and leaves `lanes`, rather than failing the hub's figures with it."""
    try:
        opened = await _open(lane, target, streams, window)
    except (RuntimeError, WorkerError) as exc:
        if lane.name in ("hub", "raw"):
            raise
        h.log(f"  {lane.name}: {exc}\n{target.log_tail()}")
        h.peers.skip(lane.name, str(exc).removeprefix(f"{lane.name}: ").splitlines()[0][:160])
        lanes.remove(lane)
        await lane.loadgen.call("listen_close", 60)
        return None
    return opened


async def _window(lane: Lane, run: Running, followers: float, frames: float, s: Sizes) -> Metrics:
    """`frames`/s offered for `peer_seconds`: delivered, CPU, latency, every process's cores."""
    assert lane.publisher is not None
    pace: Params = {"task_ids": lane.topics, "rate": frames / followers}
    if run.publish_port:
        pace["port"] = run.publish_port
    meter = Meter.of(lane, run)
    await lane.publisher.call("pace_start", 30, **pace)
    try:
        await asyncio.sleep(s.warmup_seconds + s.peer_settle_seconds)
        before = meter.read()
        measured = await lane.loadgen.call(
            "listen_measure", s.peer_seconds + 60, seconds=s.peer_seconds, latency=True
        )
        figures = meter.since(before, measured["seconds"])
    finally:
        written = await lane.publisher.call("pace_stop", 60)
    figures["drain_s"] = await _drain(lane)
    delivered = max(1, measured["frames"])
    figures.update(
        rate=measured["rate"],
        offered=written["rate"] * followers,
        us_per_frame=figures["server_s"] / delivered * 1e6,
        frame_bytes=measured["bytes"] / delivered,
        p50_ms=measured["p50_ms"],
        p99_ms=measured["p99_ms"],
        p999_ms=measured["p999_ms"],
    )
    if "cores_nats-server" in figures:  # the hub's path also costs nats-server this much
        nats_s = figures["cores_nats-server"] * measured["seconds"]
        figures["nats_us_per_frame"] = nats_s / delivered * 1e6
    return figures


async def _drain(lane: Lane) -> float:
    """Wait until the target stops delivering (it caught up); how long that took. A target
    still working through a queue would otherwise spend CPU in the next one's window."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while loop.time() - started < DRAIN_S:
        quiet = await lane.loadgen.call("listen_measure", 30, seconds=0.2, latency=False)
        if quiet["frames"] == 0:
            break
    return loop.time() - started


async def peers_fanout(h: Harness, s: Sizes, repeat: int) -> Metrics:
    streams, topics = s.fanout_streams, s.fanout_tasks
    followers = streams / topics
    lanes = await _lanes(h, s, "peers_fanout", topics, streams)
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {
            "streams": streams,
            "topics": topics,
            "cores": float(len(os.sched_getaffinity(0))),
        }
        started: list[tuple[Lane, Running]] = []
        try:
            for lane in list(lanes):
                target = await _start(h, lanes, lane)
                if target is None:
                    continue
                started.append((lane, target))
                opened = await _opened(h, lanes, lane, target, streams, 1000)
                if opened is None:
                    started.remove((lane, target))
                    await target.stop()
                else:
                    run[f"{lane.name}_retried"] = opened["retried"]
                    h.log(
                        f"  {lane.name}: {streams:,} streams open in {opened['seconds']:.2f} s "
                        f"({opened['retried']} refused and opened again)"
                    )
            windows = [(f"r{frames:.0f}", frames) for frames in s.peer_rates]
            windows.append(("over", OVERLOAD * s.peer_rates[-1]))
            windows.append(("paced", 0.0))  # per target: PACED × its overload delivery
            for key, frames in windows:
                # Every target in this window before the next one: drift hits all alike.
                for lane, target in _rotated(started, rep):
                    offer = frames or PACED * run[f"{lane.name}_over_rate"]
                    window = await _window(lane, target, followers, offer, s)
                    run.update({f"{lane.name}_{key}_{k}": v for k, v in window.items()})
                    h.log(
                        f"  {lane.name} at {offer:,.0f} frames/s ({key}): delivered "
                        f"{window['rate']:,.0f}/s, {window['us_per_frame']:.1f} µs/frame, "
                        f"p99 {window['p99_ms']:.1f} ms; quiet {window['drain_s']:.1f} s later"
                    )
        finally:
            for lane, target in started:
                await lane.loadgen.call("listen_close", 60)
                await target.stop()
        runs.append(run)
    await _close(h, lanes)
    return medians(runs)


async def peers_storm(h: Harness, s: Sizes, repeat: int) -> Metrics:
    streams = s.storm_streams
    lanes = await _lanes(h, s, "peers_storm", s.storm_tasks, streams)
    runs: list[Metrics] = []
    for rep in range(repeat):
        run: Metrics = {"streams": streams, "cores": float(len(os.sched_getaffinity(0)))}
        for lane in _rotated(list(lanes), rep):
            target = await _start(h, lanes, lane)
            if target is None:
                continue
            try:
                if target.newest_on_connect and lane.publisher is not None:
                    await lane.publisher.call(
                        "publish_once", 60, port=target.publish_port, task_ids=lane.topics
                    )
                await asyncio.sleep(0.2)  # let start-up allocations settle
                meter = Meter.of(lane, target)
                rss = target.rss()
                before = meter.read()
                target.newest_on_connect = False  # published above, outside the clock
                opened = await _opened(h, lanes, lane, target, streams, s.storm_window)
                if opened is None:
                    continue
                figures = meter.since(before, max(opened["wall_seconds"], 1e-3))
                kb = (target.rss() - rss) / 1024 / streams
                await lane.loadgen.call("listen_close", 120)
            finally:
                await target.stop()
            wall = max(opened["wall_seconds"], 1e-3)
            run[f"{lane.name}_seconds"] = opened["seconds"]
            run[f"{lane.name}_cpu_s"] = figures["server_s"]
            run[f"{lane.name}_kb_per_stream"] = kb
            run[f"{lane.name}_retried"] = opened["retried"]
            run[f"{lane.name}_origin_cpu_s"] = figures.get("cores_grip-origin", 0.0) * wall
            run.update(
                {f"{lane.name}_{k}": v for k, v in figures.items() if k.startswith("cores_")}
            )
            h.log(
                f"  {lane.name}: {streams:,} streams with a first frame in "
                f"{opened['seconds']:.2f} s ({figures['server_s']:.2f} s server CPU, "
                f"{opened['retried']} refused and opened again), {kb:.1f} KB each"
            )
        runs.append(run)
    await _close(h, lanes)
    return medians(runs)


async def _answers(port: int, task_ids: list[str]) -> dict[str, bytes]:
    """The hub's `tasks/get` answer body for each task, over one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers: dict[str, bytes] = {}
    try:
        responses = ResponseReader()
        for task_id in task_ids:
            writer.write(tasks_get(port, task_id))
            got: list[tuple[int, bytes]] = []
            while not got:
                data = await asyncio.wait_for(reader.read(65536), 10)
                if not data:
                    raise ConnectionError("the hub closed the connection")
                got = responses.feed(data)
            status, body = got[0]
            if status != 200:
                raise RuntimeError(f"tasks/get {task_id}: HTTP {status}")
            answers[task_id] = body
    finally:
        writer.close()
    return answers


async def peers_poll(h: Harness, s: Sizes, repeat: int) -> Metrics:
    bucket = await h.bucket(bucket_name("peers-poll"))
    writer = await h.writer(bucket)
    task_ids: list[str] = (await writer.call("create", 120, count=s.poll_tasks))["task_ids"]
    await h.close_worker(writer)
    loadgen = await h.loadgen()
    hub, raw = await asyncio.gather(h.start_hub(bucket, max_streams=100), h.start_raw(bucket))
    targets: dict[str, Running] = {
        "hub": _server_running(h, hub, {}),
        "raw": _server_running(h, raw, {}),
    }
    if await h.peers.available("nginx"):
        try:
            files = await _answers(hub.port, task_ids)
            targets["nginx"] = _peer_running(h, await nginx.start_static(h, files))
        except (HarnessError, OSError) as exc:
            h.peers.skip("nginx", f"did not start: {str(exc).splitlines()[0][:160]}")
    runs: list[Metrics] = []
    try:
        for rep in range(repeat):
            run: Metrics = {
                "connections": s.poll_connections,
                "cores": float(len(os.sched_getaffinity(0))),
            }
            for name in _rotated(list(targets), rep):
                target = targets[name]
                meter = Meter(target, {"load generator": loadgen.child.pid})
                before = meter.read()
                result = await loadgen.call(
                    "poll",
                    s.poll_seconds + 120,
                    port=target.port,
                    task_ids=task_ids,
                    connections=s.poll_connections,
                    warmup=s.warmup_seconds,
                    seconds=s.poll_seconds,
                )
                figures = meter.since(before, s.warmup_seconds + s.poll_seconds)
                if result["all_errors"]:
                    raise RuntimeError(
                        f"{name}: {result['all_errors']} tasks/get errors: {result['first_error']}"
                    )
                run[f"{name}_rps"] = result["rps"]
                run[f"{name}_us_per_request"] = (
                    figures["server_s"] / max(1, result["all_requests"]) * 1e6
                )
                run[f"{name}_p50_ms"] = result["p50_ms"]
                run[f"{name}_p99_ms"] = result["p99_ms"]
                run.update({f"{name}_{k}": v for k, v in figures.items() if k.startswith("cores_")})
            h.log(
                f"peers_poll #{rep + 1}: "
                + ", ".join(f"{name} {run[f'{name}_rps']:,.0f}/s" for name in targets)
            )
            runs.append(run)
    finally:
        for target in targets.values():
            await target.stop()
        await h.close_worker(loadgen)
    return medians(runs)


async def _close(h: Harness, lanes: list[Lane]) -> None:
    for lane in lanes:
        await h.close_worker(lane.loadgen)
        if lane.publisher is not None:
            await h.close_worker(lane.publisher)
