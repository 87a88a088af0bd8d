"""The seeded fault plan: which fault, when, against what, for how long.

`make_plan(seed, duration, soak)` draws everything from `random.Random(seed)`, so the same
seed (and duration/profile) gives the same plan. Faults run one after another, never
overlapping, and the runner waits for the cluster and every live hub to settle before the
next one: so at most one NATS node is down or paused at a time (except the deliberate
full restart) and at most one hub is down at a time. The first fault is always a NATS one.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

NODE_KILL = "node-kill"  # kill -9 one NATS node, restart it after `seconds`
NODE_PAUSE = "node-pause"  # SIGSTOP one NATS node for `seconds`, then SIGCONT
FULL_RESTART = "full-restart"  # kill -9 all three nodes, restart them after `seconds`
HUB_KILL = "hub-kill"  # kill -9 one hub, restart it after `seconds`
SSE_RESET = "sse-reset"  # abort every client connection into one hub (proxy)
SSE_STALL = "sse-stall"  # freeze every client connection into one hub for `seconds`
NATS_LINK_RESET = "nats-link-reset"  # abort one hub's connections to NATS (proxy)
NATS_LINK_STALL = "nats-link-stall"  # freeze one hub's NATS connections for `seconds`
# Partitions (tests/cluster.py PartitionableCluster): a cut lasts `seconds`, then heals;
# `silent` cuts stop bytes, the others reset connections and refuse new ones. The nodes
# are chosen when the fault starts, by their role then.
ISOLATE_LEADER = "isolate-leader"  # the bucket stream's leader cut off from both others
ISOLATE_FOLLOWER = "isolate-follower"  # a follower cut off (the leader keeps the majority)
CUT_PAIR = "cut-pair"  # the leader and one follower cut apart; both still reach the third
HUB_CUT = "hub-cut"  # one hub cut off from every node; its clients still reach it

NATS_KINDS = (NODE_KILL, NODE_PAUSE, FULL_RESTART)
PARTITION_KINDS = (ISOLATE_LEADER, ISOLATE_FOLLOWER, CUT_PAIR)
KINDS = (
    NODE_KILL,
    NODE_PAUSE,
    FULL_RESTART,
    HUB_KILL,
    SSE_RESET,
    SSE_STALL,
    NATS_LINK_RESET,
    NATS_LINK_STALL,
    ISOLATE_LEADER,
    ISOLATE_FOLLOWER,
    CUT_PAIR,
    HUB_CUT,
)
WEIGHTS = {
    NODE_KILL: 3,
    NODE_PAUSE: 3,
    FULL_RESTART: 1,
    HUB_KILL: 2,
    SSE_RESET: 2,
    SSE_STALL: 2,
    NATS_LINK_RESET: 2,
    NATS_LINK_STALL: 1,
    ISOLATE_LEADER: 3,
    ISOLATE_FOLLOWER: 2,
    CUT_PAIR: 2,
    HUB_CUT: 1,
}
SECONDS = {  # how long the fault lasts (uniform range)
    NODE_KILL: (2.0, 5.0),
    NODE_PAUSE: (2.0, 8.0),
    FULL_RESTART: (1.0, 3.0),
    HUB_KILL: (1.0, 3.0),
    SSE_RESET: (0.0, 0.0),
    SSE_STALL: (3.0, 12.0),  # past 10 s the clients give up on the silent stream
    NATS_LINK_RESET: (0.0, 0.0),
    NATS_LINK_STALL: (2.0, 6.0),
    ISOLATE_LEADER: (5.0, 12.0),  # on both sides of the ~10 s a cut-off leader keeps leading
    ISOLATE_FOLLOWER: (5.0, 12.0),
    CUT_PAIR: (5.0, 12.0),
    HUB_CUT: (2.0, 8.0),
}


@dataclass(frozen=True)
class Fault:
    index: int
    at: float  # seconds after the workload starts, at the earliest
    kind: str
    target: int  # node index (node faults) or hub index (hub and proxy faults); -1 = all
    seconds: float
    silent: bool = False  # partitions: bytes stop instead of connections reset

    def describe(self) -> str:
        if self.kind in PARTITION_KINDS:
            target = "silent" if self.silent else "reset"
        elif self.target < 0:
            target = "all nodes"
        elif self.kind in (NODE_KILL, NODE_PAUSE):
            target = f"node n{self.target}"
        else:
            target = f"hub {self.target}"
        return (
            f"#{self.index:<2} t+{self.at:6.1f}s {self.kind:<16} {target:<10} {self.seconds:4.1f}s"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def make_plan(seed: int, duration: float, soak: bool = False) -> list[Fault]:
    rng = random.Random(seed)
    if soak:
        first, gap, stop = min(120.0, duration / 4), (150.0, 240.0), duration - 60.0
        max_full = max(1, int(duration // 900))
    else:
        first, gap, stop = (
            min(6.0, duration / 5),
            (max(4.0, duration / 14), duration / 8),
            0.7 * duration,
        )
        max_full = 1
    faults: list[Fault] = []
    at = first
    fulls = 0
    while at <= stop:
        if not faults:
            kind = rng.choice((*NATS_KINDS[:2], ISOLATE_LEADER))
        else:
            kinds = [k for k in KINDS if k != FULL_RESTART or fulls < max_full]
            kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        fulls += kind == FULL_RESTART
        if kind == FULL_RESTART:
            target = -1
        elif kind in (NODE_KILL, NODE_PAUSE):
            target = rng.randrange(3)
        else:
            target = rng.randrange(2)
        low, high = SECONDS[kind]
        seconds = round(rng.uniform(low, high), 1)
        silent = kind in PARTITION_KINDS and rng.random() < 0.5
        faults.append(Fault(len(faults), round(at, 1), kind, target, seconds, silent))
        at += rng.uniform(*gap)
    return faults


def format_plan(seed: int, faults: list[Fault]) -> str:
    lines = [f"fault plan (seed {seed}, {len(faults)} faults):"]
    lines += ["  " + fault.describe() for fault in faults]
    return "\n".join(lines)
