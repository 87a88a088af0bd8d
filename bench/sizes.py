"""How big each scenario runs: `full` (the issue's sizes), `quick` (< 2 minutes on 2 cores),
`smoke` (seconds; the test suite's run, where only the shape of the output matters).

Fan-out is shaped so one update reaches `fanout_streams / fanout_tasks` streams, each
stream following `fanout_follow` task(s): a client follows its own task, a task has
several followers (a dashboard, other tabs), and every frame is its own write, the
hub's worst case. `fanout_saturation_rate` is the writer's top rate: times the fan-out
it offers more notifications than one Python process can send, so the saturation search
(bench/scenarios.py) can overload any server.

The operator stream's dashboards each see every task, so a change costs the hub one frame
per dashboard; its paced rates are changes/s, and "flat out" paces at a rate no writer
reaches with `operator_flat_in_flight` writes outstanding (bench/operator_stream.py).

The upstream_tasks scenario keeps 10 clients per task at every size (the issue's ratio);
its states change every 4 poll intervals, so a client that sees a state late still sees
each one, and no missed state drops out of the staleness figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    name: str
    # (a) fan-out: streams over tasks, the writer's top rate, window lengths
    fanout_streams: int
    fanout_tasks: int
    fanout_follow: int
    fanout_saturation_rate: float  # the writer's top rate, updates/s
    fanout_probe_seconds: float
    fanout_seconds: float
    # (b) connect storm
    storm_streams: int
    storm_tasks: int
    storm_window: int  # streams still opening at once (below the listen backlog)
    # (c) poll
    poll_connections: int
    poll_tasks: int
    poll_seconds: float
    # (d) poll vs push: one task per client, each changing every `change_interval_ms`
    pvp_clients: int
    pvp_poll_interval_ms: int
    pvp_change_interval_ms: int
    pvp_seconds: float
    # (e) cold start
    cold_tasks: int
    # (f) writes
    writes_concurrency: int
    writes_seconds: float
    # (g) front door: closed-loop tools/call, upstream directly and through the hub
    front_door_connections: int
    front_door_seconds: float
    # (h) operator stream: dashboards over a bucket of tasks, paced changes/s, then flat out
    operator_dashboards: int
    operator_tasks: int
    operator_rates: tuple[float, ...]
    operator_flat_rate: float
    operator_flat_in_flight: int
    operator_seconds: float
    # (j) upstream tasks: clients following tasks of a poll-only upstream (half poll, half
    # listen), through the hub and directly; each task's state changes every
    # `ut_change_interval_ms`, and `ut_poll_interval_ms` is the upstream's pollIntervalMs
    ut_clients: int
    ut_tasks: int
    ut_poll_interval_ms: int
    ut_change_interval_ms: int
    ut_seconds: float  # measured, per side
    ut_warmup_seconds: float  # clients running before the measured window, per side
    warmup_seconds: float = 0.5
    # peers (bench/peers/): the fan-out's streams and topics at fixed frames/s delivered
    # (publishes/s × streams per topic), each window `peer_seconds` long; the storm's size
    peer_rates: tuple[float, ...] = (10_000, 20_000, 40_000)
    peer_seconds: float = 5.0  # long enough to average out the shared machine's stalls
    # ... after the warm-up, this long for the pace to settle before a window is measured
    peer_settle_seconds: float = 0.5


FULL = Sizes(
    name="full",
    fanout_streams=2000,
    fanout_tasks=20,
    fanout_follow=1,
    fanout_saturation_rate=2000,
    fanout_probe_seconds=1.0,
    fanout_seconds=3.0,
    storm_streams=10_000,
    storm_tasks=100,
    storm_window=1000,
    poll_connections=64,
    poll_tasks=100,
    poll_seconds=4.0,
    pvp_clients=500,
    pvp_poll_interval_ms=1000,
    pvp_change_interval_ms=2000,
    pvp_seconds=8.0,
    cold_tasks=100_000,
    writes_concurrency=64,
    writes_seconds=4.0,
    front_door_connections=64,
    front_door_seconds=4.0,
    operator_dashboards=100,
    operator_tasks=10_000,
    operator_rates=(1000, 5000),
    operator_flat_rate=50_000,
    operator_flat_in_flight=256,
    operator_seconds=3.0,
    ut_clients=500,
    ut_tasks=50,
    ut_poll_interval_ms=500,
    ut_change_interval_ms=2000,
    ut_seconds=30.0,
    ut_warmup_seconds=3.0,
)

QUICK = Sizes(
    name="quick",
    fanout_streams=500,
    fanout_tasks=5,
    fanout_follow=1,
    fanout_saturation_rate=2000,
    fanout_probe_seconds=0.5,
    fanout_seconds=1.0,
    storm_streams=1000,
    storm_tasks=50,
    storm_window=1000,
    poll_connections=64,
    poll_tasks=50,
    poll_seconds=1.0,
    pvp_clients=100,
    pvp_poll_interval_ms=500,
    pvp_change_interval_ms=1000,
    pvp_seconds=2.5,
    cold_tasks=10_000,
    writes_concurrency=64,
    writes_seconds=1.0,
    front_door_connections=64,
    front_door_seconds=1.0,
    operator_dashboards=100,
    operator_tasks=2000,
    operator_rates=(500, 2000),
    operator_flat_rate=50_000,
    operator_flat_in_flight=256,
    operator_seconds=1.0,
    ut_clients=100,
    ut_tasks=10,
    ut_poll_interval_ms=500,
    ut_change_interval_ms=2000,
    ut_seconds=5.0,
    ut_warmup_seconds=1.5,
    warmup_seconds=0.3,
    peer_rates=(10_000, 20_000),
    peer_seconds=1.0,
)

SMOKE = Sizes(
    name="smoke",
    fanout_streams=20,
    fanout_tasks=2,
    fanout_follow=1,
    fanout_saturation_rate=200,
    fanout_probe_seconds=0.2,
    fanout_seconds=0.3,
    storm_streams=20,
    storm_tasks=4,
    storm_window=20,
    poll_connections=8,
    poll_tasks=4,
    poll_seconds=0.3,
    pvp_clients=8,
    pvp_poll_interval_ms=100,
    pvp_change_interval_ms=150,
    pvp_seconds=0.6,
    cold_tasks=200,
    writes_concurrency=4,
    writes_seconds=0.3,
    front_door_connections=4,
    front_door_seconds=0.3,
    operator_dashboards=3,
    operator_tasks=10,
    operator_rates=(50,),
    operator_flat_rate=5000,
    operator_flat_in_flight=4,
    operator_seconds=0.3,
    ut_clients=20,
    ut_tasks=2,
    ut_poll_interval_ms=200,
    ut_change_interval_ms=800,
    ut_seconds=1.0,
    ut_warmup_seconds=0.6,
    warmup_seconds=0.1,
    peer_rates=(200, 400),
    peer_seconds=0.3,
    peer_settle_seconds=0.0,  # the shape of the output, not steady figures
)

PROFILES = {sizes.name: sizes for sizes in (FULL, QUICK, SMOKE)}
