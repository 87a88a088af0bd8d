"""Injecting one planned fault into a running `Env`, and waiting for it to be over.

Each `inject` returns once the fault itself has ended (the node restarted, the process
continued, the stall expired); the runner then waits for `Env.settle()` before the next
fault, so faults never overlap.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from tests.chaos import plan
from tests.chaos.env import Env
from tests.chaos.history import FaultRecord

# How long the next fault waits for every replica to be current and every live hub ready.
# After a partition heals, nats-server has taken over a minute to catch a replica up (it
# logs "Expected first catchup entry to be a snapshot and peerstate, will retry").
SETTLE_S = 120.0


async def inject(env: Env, fault: plan.Fault) -> FaultRecord:
    record = FaultRecord(fault.index, fault.kind, fault.target, time.monotonic())
    env.history.faults.append(record)
    kind, seconds = fault.kind, fault.seconds
    if kind == plan.NODE_KILL:
        node = env.cluster.nodes[fault.target]
        record.note = f"{node.name} pid {node.process.pid if node.process else '-'}"
        node.kill()
        await asyncio.sleep(seconds)
        node.start()  # same ports and store; in the loop's thread (PDEATHSIG)
    elif kind == plan.NODE_PAUSE:
        node = env.cluster.nodes[fault.target]
        assert node.process is not None
        pid = node.process.pid
        record.note = f"{node.name} pid {pid}"
        env.paused.add(pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
            env.paused.discard(pid)
    elif kind == plan.FULL_RESTART:
        env.cluster.kill()
        # Both hubs should notice the outage (or the down time pass) before NATS returns.
        deadline = time.monotonic() + max(seconds, 6.0)
        while time.monotonic() < deadline:
            ready = await asyncio.gather(*(env.hub_ready(i) for i in range(len(env.hubs))))
            if not any(ready) and time.monotonic() >= record.started + seconds:
                break
            await asyncio.sleep(0.1)
        record.note = "hubs saw the outage" if not any(ready) else "a hub stayed ready"
        env.cluster.start()
    elif kind == plan.HUB_KILL:
        hub = env.hubs[fault.target]
        assert hub.process is not None
        record.note = f"hub {fault.target} pid {hub.process.pid}"
        env.alive[fault.target] = False
        hub.kill()
        await asyncio.sleep(seconds)
        hub.start()
        assert hub.process is not None
        env.history.hub_restarts.append((time.monotonic(), fault.target, hub.process.pid))
        env.alive[fault.target] = True
    elif kind == plan.SSE_RESET:
        record.note = f"{env.sse_proxies[fault.target].reset()} client connections aborted"
    elif kind == plan.SSE_STALL:
        proxy = env.sse_proxies[fault.target]
        record.note = f"{proxy.open_connections} client connections frozen"
        proxy.stall(seconds)
        await asyncio.sleep(seconds)
    elif kind == plan.NATS_LINK_RESET:
        aborted = sum(p.reset() for p in env.nats_proxies[fault.target])
        record.note = f"{aborted} NATS connections aborted"
    elif kind in plan.PARTITION_KINDS:
        record.note = await _partition(env, fault)
        await asyncio.sleep(seconds)
        env.cluster.heal()
    elif kind == plan.HUB_CUT:
        for proxy in env.nats_proxies[fault.target]:
            proxy.cut()
        record.note = "the hub cut off from every node; its clients still reach it"
        try:
            await asyncio.sleep(seconds)
        finally:
            for proxy in env.nats_proxies[fault.target]:
                proxy.heal()
    elif kind == plan.NATS_LINK_STALL:
        for proxy in env.nats_proxies[fault.target]:
            proxy.stall(seconds)
        record.note = "every NATS connection of the hub frozen"
        await asyncio.sleep(seconds)
    else:
        raise ValueError(f"unknown fault kind {kind}")
    record.ended = time.monotonic()
    return record


async def _partition(env: Env, fault: plan.Fault) -> str:
    """Cut the cluster as the fault says, choosing nodes by their role now."""
    cluster = env.cluster
    leader = await env.stream_leader()
    if leader is None:  # no leader to cut off: cut the first node, say so
        leader = cluster.nodes[0]
    followers = [node for node in cluster.nodes if node is not leader]
    follower = followers[fault.target % len(followers)]
    how = "silent" if fault.silent else "reset"
    if fault.kind == plan.ISOLATE_LEADER:
        cluster.isolate(leader, silent=fault.silent)
        return f"leader {leader.name} isolated ({how})"
    if fault.kind == plan.ISOLATE_FOLLOWER:
        cluster.isolate(follower, silent=fault.silent)
        return f"follower {follower.name} isolated, leader {leader.name} ({how})"
    cluster.cut(leader, follower, silent=fault.silent)
    return f"leader {leader.name} and follower {follower.name} cut apart ({how})"


async def run_plan(env: Env, faults: list[plan.Fault], t0: float, stop: asyncio.Event) -> None:
    """Each fault at its planned time, at the earliest once the previous one settled."""
    for fault in faults:
        while time.monotonic() < t0 + fault.at:
            if stop.is_set():
                return
            await asyncio.sleep(0.1)
        if stop.is_set():
            return
        record = await inject(env, fault)
        settled = await env.settle(timeout=SETTLE_S)
        record.settled = time.monotonic()
        if not settled:
            record.note += f"; did not settle within {SETTLE_S:.0f} s"
            env.history.notes.append(
                f"fault #{fault.index} {fault.kind}: no settle in {SETTLE_S:.0f} s"
            )
        print(
            f"  fault #{fault.index} {fault.kind} target {fault.target}: "
            f"{record.note}; over after {record.ended - record.started:.1f}s, "
            f"settled after {record.settled - record.started:.1f}s",
            flush=True,
        )
