"""Invariant 2 under faults: a 3-node cluster, two hub processes, 300 tasks, 300 streams.

Each test runs a real 3-node JetStream cluster (bucket with 3 replicas), two `taskhub
serve` processes, three bridges writing 300 tasks (working → two progress updates → a
terminal state) and 300 SSE listen streams split over both hubs, and injects one fault
while updates flow: `kill -9` of one NATS node (the one hosting a hub's watch consumer
behind that hub's back, preferably the bucket's stream leader), `kill -9` of a hub, or
`kill -9` of every NATS node followed by a restart on the same ports and stores.

Clients behave as a real one would: a stream that ends without its completion result
(or goes quiet past the keep-alive) is re-listened at the other hub for the tasks not yet
terminal; the snapshot after the ack carries their current state. Writers retry until
JetStream stores the write; a retried terminal write that finds the task already terminal
counts only if the stored state is the one intended.

Asserted every time: each subscriber ends with every followed task's terminal state,
equal to what the bridge wrote; no subscriber sees a state after a terminal one (so never
two terminal states); every task answers `tasks/get` with that state on every surviving
hub once `/readyz` is 200. Each test prints one line of figures.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bridge import TaskBridge, TaskNotFound, TaskRecord
from bridge.states import IllegalTransition, InvalidPayload, TerminalStateError
from bridge.wire import TERMINAL, kv_stream
from tests.cluster import HubProcess, NatsCluster, wait_all_ready
from tests.helpers import SUB_KEY, SseStream, eventually, headers_for, rpc

TASKS = 300
STREAMS = 300
FOLLOWS = 5  # tasks per stream; stream i follows i, i+61, … so each task has 5 streams
BRIDGES = 3
WRITERS = 12  # concurrent writer coroutines, each taking a task start to end
PACE_S = 0.01  # between one task's writes, so the run lasts long enough to hit mid-way
FAULT_AFTER = TASKS  # inject the fault after this many of the 3 × TASKS writes
DEADLINE_S = 60.0  # everything after the writers start must finish within this
# Keep-alives every second, so a live but idle stream is never silent for READ_TIMEOUT_S.
HUB_ARGS = ("--replicas", "3", "--keepalive", "1", "--log-level", "info")
# Every stream is the same principal (no auth), and after a hub dies one hub holds all.
HUB_ENV = {"TASKHUB_MAX_STREAMS_PER_PRINCIPAL": str(2 * STREAMS)}
READ_TIMEOUT_S = 10.0  # a stream silent this long (no keep-alive either) counts as broken
STEPS = ("created", "progress 1", "progress 2")  # statusMessage → rank within a stream


class BrokenStream(Exception):
    """The stream ended or failed before every followed task reached a terminal state."""


def task_dict(record: TaskRecord) -> dict[str, Any]:
    """The DetailedTask as a client sees it (frames and tasks/get, minus envelope keys)."""
    task: dict[str, Any] = msgspec.to_builtins(record.task)
    return task


@dataclass
class Writes:
    """What the bridges wrote: the expected terminal task per id, and how hard it was."""

    done: int = 0
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)
    stored_at: dict[str, float] = field(default_factory=dict)  # terminal write acked
    retries: Counter[str] = field(default_factory=Counter)


@dataclass
class Follower:
    """One listen client following `task_ids`, starting at hub `home`."""

    index: int
    task_ids: list[str]
    home: int
    pending: set[str] = field(default_factory=set)
    terminal: dict[str, dict[str, Any]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    acked: bool = False
    received_at: dict[str, tuple[float, int]] = field(default_factory=dict)  # (time, hub)

    def __post_init__(self) -> None:
        self.pending = set(self.task_ids)

    async def run(
        self, client: httpx.AsyncClient, hubs: list[HubProcess], alive: list[bool], deadline: float
    ) -> None:
        at = self.home
        attempt = 0
        while self.pending:
            attempt += 1
            request_id = f"{self.index}.{attempt}"
            body = rpc(
                "subscriptions/listen",
                {"notifications": {"taskIds": sorted(self.pending)}},
                id=request_id,
            )
            try:
                async with client.stream(
                    "POST", hubs[at].url + "/mcp", json=body, headers=headers_for(body)
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise BrokenStream(f"HTTP {response.status_code} {response.text[:200]}")
                    await self._follow(SseStream(response), request_id, at, deadline)
                return
            except (httpx.TransportError, EOFError, BrokenStream) as exc:
                self.breaks.append(f"hub {at}: {type(exc).__name__} {exc}")
            if time.monotonic() > deadline:
                raise AssertionError(f"stream {self.index}: no recovery before the deadline")
            # Re-listen at the next live hub (the other one, when both live).
            others = [i for i in range(len(hubs)) if alive[i] and i != at]
            at = others[0] if others else at
            await asyncio.sleep(0.05 * min(attempt, 10))

    async def _follow(self, stream: SseStream, request_id: str, hub: int, deadline: float) -> None:
        requested = sorted(self.pending)
        ack = await stream.next(timeout=max(0.1, deadline - time.monotonic()))
        if ack.get("method") != "notifications/subscriptions/acknowledged":
            raise BrokenStream(f"first frame is not the ack: {ack}")
        granted = ack["params"]["notifications"]["taskIds"]
        if granted != requested:
            # A created task the hub does not know: invariant 1 broken.
            self.violations.append(f"granted {granted} of {requested}")
            raise BrokenStream("not every task granted")
        self.acked = True
        rank: dict[str, int] = {}
        while self.pending:
            remaining = deadline - time.monotonic()
            try:
                message = await stream.next(timeout=max(0.1, remaining))
            except TimeoutError:
                raise AssertionError(
                    f"stream {self.index} ({request_id}) open but silent; "
                    f"still waiting for {sorted(self.pending)}"
                ) from None
            if "method" not in message:
                if message.get("id") == request_id and "result" in message:
                    raise BrokenStream("hub ended the stream (completion result)")
                self.violations.append(f"unexpected message {message}")
                continue
            params = dict(message["params"])
            if params.pop("_meta", None) != {SUB_KEY: request_id}:
                self.violations.append(f"wrong subscription id in {message}")
            task_id, status = params.get("taskId"), params.get("status")
            if task_id in self.terminal:
                self.violations.append(f"{task_id}: {status} after terminal")
                continue
            if task_id not in self.pending:
                self.violations.append(f"{task_id}: not followed by this stream")
                continue
            message_text = params.get("statusMessage")
            if status not in TERMINAL and message_text not in STEPS:
                self.violations.append(f"{task_id}: never written: {status} {message_text}")
                continue
            step = len(STEPS) if status in TERMINAL else STEPS.index(message_text)
            if step < rank.get(task_id, 0):
                self.violations.append(f"{task_id}: went back to {params['statusMessage']}")
            rank[task_id] = step
            if status in TERMINAL:
                self.terminal[task_id] = params
                self.pending.discard(task_id)
                self.received_at[task_id] = (time.monotonic(), hub)


@dataclass
class ReadyLog:
    """/readyz of every live hub, sampled until stopped: (time, hub index, ready)."""

    samples: list[tuple[float, int, bool]] = field(default_factory=list)

    async def run(
        self, client: httpx.AsyncClient, hubs: list[HubProcess], alive: list[bool]
    ) -> None:
        while True:
            live = [i for i in range(len(hubs)) if alive[i]]
            states = await asyncio.gather(*(hubs[i].ready(client) for i in live))
            now = time.monotonic()
            self.samples.extend((now, i, ok) for i, ok in zip(live, states, strict=True))
            await asyncio.sleep(0.05)

    def recovered_after(self, fault_at: float, hubs: list[int]) -> float:
        """Seconds from the fault until every hub in `hubs` answered 200 for good."""
        recovered = fault_at
        for hub in hubs:
            mine = [(t, ok) for t, i, ok in self.samples if i == hub and t >= fault_at]
            last_down = max((t for t, ok in mine if not ok), default=None)
            if last_down is not None:
                up = min((t for t, ok in mine if ok and t > last_down), default=time.monotonic())
                recovered = max(recovered, up)
        return recovered - fault_at


@dataclass
class Run:
    """One scenario's processes, clients and tasks."""

    cluster: NatsCluster
    bucket: str
    hubs: list[HubProcess]
    client: httpx.AsyncClient
    bridges: list[TaskBridge]
    tasks: list[str] = field(default_factory=list)
    owner: dict[str, TaskBridge] = field(default_factory=dict)
    alive: list[bool] = field(default_factory=lambda: [True, True])

    def where_to_look(self) -> str:
        hubs = ", ".join(str(hub.log_file) for hub in self.hubs)
        nodes = ", ".join(str(node.log_file) for node in self.cluster.nodes)
        return f"hub logs: {hubs}; nats logs: {nodes}"


async def retried(call: Callable[[], Awaitable[TaskRecord]], writes: Writes) -> TaskRecord:
    """Call until JetStream stores it; NATS may be failing over or gone for a while."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await call()
        except (IllegalTransition, InvalidPayload, TaskNotFound, AssertionError):
            raise  # a state-machine answer or a wrong one, not an outage
        except Exception as exc:  # timeouts, no responders, 503s, reconnects
            writes.retries[type(exc).__name__] += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def write_task(run: Run, n: int, task_id: str, writes: Writes) -> None:
    """working → progress 1 → progress 2 → completed | failed | cancelled."""
    bridge = run.owner[task_id]
    for message in STEPS[1:]:
        await retried(functools.partial(bridge.working, task_id, status_message=message), writes)
        writes.done += 1
        await asyncio.sleep(PACE_S)
    ending = ("completed", "failed", "cancelled")[n % 3]
    final = f"final {n}"

    async def terminal() -> TaskRecord:
        if ending == "completed":
            result = {"content": [{"type": "text", "text": f"result {n}"}]}
            return await bridge.complete(task_id, result, status_message=final)
        if ending == "failed":
            return await bridge.fail(task_id, {"code": -32603, "message": f"boom {n}"})
        return await bridge.cancelled(task_id, status_message=final)

    try:
        record = await retried(terminal, writes)
    except TerminalStateError:
        # An earlier attempt landed but its ack was lost: fine only if it is ours.
        stored = await retried(lambda: _stored(bridge, task_id), writes)
        assert stored.task.status == ending, f"{task_id}: stored {stored.task.status}"
        if ending != "failed":
            assert stored.task.statusMessage == final, f"{task_id}: {stored.task}"
        writes.retries["landed-before-retry"] += 1
        record = stored
    writes.expected[task_id] = task_dict(record)
    writes.stored_at[task_id] = time.monotonic()
    writes.done += 1


async def _stored(bridge: TaskBridge, task_id: str) -> TaskRecord:
    record = await bridge.get(task_id)
    assert record is not None, f"{task_id} vanished"
    return record


async def write_all(run: Run, writes: Writes) -> None:
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in enumerate(run.tasks):
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            n, task_id = queue.get_nowait()
            await write_task(run, n, task_id, writes)

    await asyncio.gather(*(worker() for _ in range(WRITERS)))


async def get_everything(run: Run, hub: HubProcess, expected: dict[str, dict[str, Any]]) -> None:
    """Every task answers tasks/get on `hub` with the terminal state the bridge wrote."""
    limit = asyncio.Semaphore(20)

    async def get(task_id: str) -> None:
        body = rpc("tasks/get", {"taskId": task_id}, id=task_id)
        async with limit:
            response = await run.client.post(hub.url + "/mcp", json=body, headers=headers_for(body))
        assert response.status_code == 200, f"{hub.url} tasks/get {task_id}: {response.text}"
        result = dict(response.json()["result"])
        assert result.pop("resultType") == "complete"
        result.pop("_meta", None)
        assert result == expected[task_id], f"{hub.url} tasks/get {task_id}"

    await asyncio.gather(*(get(task_id) for task_id in run.tasks))


@pytest.fixture
async def run(tmp_path: Path, bucket: str) -> AsyncIterator[Run]:
    cluster = NatsCluster(tmp_path / "nats")
    hubs: list[HubProcess] = []
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=READ_TIMEOUT_S),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=50),
    )
    bridges: list[TaskBridge] = []
    try:
        cluster.start()  # client ports are known from here on, and kept across restarts
        await cluster.wait_ready()
        for i in range(2):
            hub = HubProcess(tmp_path / f"hub{i}", cluster.url, bucket, *HUB_ARGS, env=HUB_ENV)
            hubs.append(hub)
            hub.start()
        for i in range(BRIDGES):
            bridges.append(
                await TaskBridge.connect(
                    cluster.url,
                    f"srv-{i}",
                    bucket=bucket,
                    replicas=3,
                    name=f"fault-bridge-{i}",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                )
            )
        await wait_all_ready(hubs, client)
        yield Run(cluster, bucket, hubs, client, bridges)
    finally:
        for bridge in bridges:
            await bridge.close()
        await client.aclose()
        for hub in hubs:
            hub.stop()
        cluster.stop()


@pytest.fixture
def report(
    capsys: pytest.CaptureFixture[str], record_property: Callable[[str, object], None]
) -> Callable[[str], None]:
    """Show a line in the pytest output with or without `-s`, and in the JUnit XML."""

    def emit(line: str) -> None:
        record_property("figures", line)
        with capsys.disabled():
            print(f"\n{line}")

    return emit


async def create_tasks(run: Run) -> None:
    limit = asyncio.Semaphore(20)

    async def create(n: int) -> None:
        bridge = run.bridges[n % BRIDGES]
        async with limit:
            record = await bridge.create(owner="anonymous", status_message=STEPS[0])
        run.owner[record.task_id] = bridge
        run.tasks[n] = record.task_id

    run.tasks = [""] * TASKS
    await asyncio.gather(*(create(n) for n in range(TASKS)))


async def scenario(
    run: Run, name: str, fault: Callable[[], Awaitable[None]], report: Callable[[str], None]
) -> dict[str, Any]:
    """Write and follow 300 tasks, inject `fault` mid-run, check invariant 2 throughout."""
    await create_tasks(run)
    followers = [
        Follower(i, [run.tasks[(i + 61 * k) % TASKS] for k in range(FOLLOWS)], home=i % 2)
        for i in range(STREAMS)
    ]
    deadline = time.monotonic() + DEADLINE_S
    following = [
        asyncio.create_task(f.run(run.client, run.hubs, run.alive, deadline)) for f in followers
    ]
    ready_log = ReadyLog()
    monitor = asyncio.create_task(ready_log.run(run.client, run.hubs, run.alive))
    writes = Writes()
    writing: asyncio.Task[None] | None = None
    try:
        try:
            await eventually(lambda: all(f.acked for f in followers), timeout=30)
        except AssertionError:
            waiting = [(f.index, f.breaks[-1:]) for f in followers if not f.acked]
            raise AssertionError(f"{len(waiting)} streams not acked, e.g. {waiting[:3]}") from None
        started = time.monotonic()
        writing = asyncio.create_task(write_all(run, writes))
        await eventually(lambda: writes.done >= FAULT_AFTER or writing.done(), timeout=30)
        assert not writing.done(), "the writes finished before the fault"
        open_at_fault = [sum(1 for f in followers if f.pending and f.home == i) for i in (0, 1)]
        fault_at = time.monotonic()
        await fault()
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            await writing
            writes_s = time.monotonic() - started
            outcomes = await asyncio.gather(*following, return_exceptions=True)
        failures = [(f.index, o) for f, o in zip(followers, outcomes, strict=True) if o is not None]
        assert not failures, f"{len(failures)} streams failed, e.g. {failures[:3]}; " + (
            run.where_to_look()
        )
        surviving = [i for i, up in enumerate(run.alive) if up]
        await wait_all_ready([run.hubs[i] for i in surviving], run.client)
        readyz_s = ready_log.recovered_after(fault_at, surviving)
    finally:
        monitor.cancel()
        for task in [*following, *([writing] if writing else [])]:
            task.cancel()
        await asyncio.gather(monitor, *following, return_exceptions=True)

    violations = [f"stream {f.index}: {v}" for f in followers for v in f.violations]
    assert not violations, f"{len(violations)} violations, e.g. {violations[:5]}"
    assert len(writes.expected) == TASKS
    expected_terminals = 0
    received = 0
    for f in followers:
        expected_terminals += len(f.task_ids)
        for task_id in f.task_ids:
            got = f.terminal.get(task_id)
            assert got == writes.expected[task_id], (
                f"stream {f.index}, task {task_id}: got {got}, wrote {writes.expected[task_id]}"
            )
            received += 1
    for i in surviving:
        await get_everything(run, run.hubs[i], writes.expected)
    last_terminal_s = max(at for f in followers for at, _ in f.received_at.values()) - fault_at
    # From the bridge's terminal write being acked to a subscriber holding it, per hub.
    lag = [0.0] * len(run.hubs)
    for f in followers:
        for task_id, (at, hub) in f.received_at.items():
            lag[hub] = max(lag[hub], at - writes.stored_at[task_id])
    broken = sum(1 for f in followers if f.breaks)
    broken_at = Counter(b.split(":")[0] for f in followers for b in f.breaks)
    figures = {
        "scenario": name,
        "tasks": len(run.tasks),
        "subscribers": len(followers),
        "received": received,
        "expected": expected_terminals,
        "streams_reconnected": broken,
        "breaks_at": broken_at,
        "open_at_fault": open_at_fault,
        "readyz_s": readyz_s,
        "last_terminal_s": last_terminal_s,
        "lag_s": lag,
        "write_retries": dict(writes.retries),
    }
    report(
        f"[cluster-faults] {name}: tasks={len(run.tasks)} subscribers={len(followers)} "
        f"terminal states received {received}/{expected_terminals}; "
        f"streams re-listened {broken}; write retries {dict(writes.retries) or 0}; "
        f"recovery: /readyz 200 on all surviving hubs {readyz_s:.2f}s after the fault, "
        f"last terminal state {last_terminal_s:.2f}s after the fault; "
        f"max write-acked→subscriber lag per hub {', '.join(f'{x:.2f}s' for x in lag)} "
        f"(writes took {writes_s:.1f}s)"
    )
    return figures


async def test_kill_9_one_nats_node_mid_run(run: Run, report: Callable[[str], None]) -> None:
    victim_kind: list[str] = []

    async def fault() -> None:
        """Kill the node that hurts most: a hub's watch consumer while the hub is
        connected elsewhere (nothing tells that hub; only the consumer's heartbeats
        can), and the bucket's stream leader if possible (writes stall until a
        new leader is elected)."""
        stream = kv_stream(run.bucket)
        leader = await run.cluster.stream_leader(stream)
        unseen = Counter(
            host.name for host, reader in await run.cluster.push_consumers(stream) if host != reader
        )
        victim = max(run.cluster.nodes, key=lambda n: (unseen[n.name], n is leader))
        victim_kind.append(
            f"{victim.name}: stream leader {'yes' if victim is leader else 'no'}, "
            f"hosts {unseen[victim.name]} hub watch consumer(s) read via another node"
        )
        victim.kill()

    figures = await scenario(run, "kill -9 one NATS node", fault, report)
    report(f"[cluster-faults]   killed {victim_kind[0]}")
    # The hubs live on, so their streams must too: a NATS fault never drops a client.
    assert figures["streams_reconnected"] == 0, run.where_to_look()


async def test_kill_9_one_hub_mid_run_clients_move_to_the_other(
    run: Run, report: Callable[[str], None]
) -> None:
    async def fault() -> None:
        run.alive[0] = False
        run.hubs[0].kill()

    figures = await scenario(run, "kill -9 one hub", fault, report)
    # Hub 0's unfinished streams broke and moved; hub 1's never broke.
    assert figures["open_at_fault"][0] > 0
    assert 0 < figures["streams_reconnected"] <= figures["open_at_fault"][0]
    assert set(figures["breaks_at"]) == {"hub 0"}, figures["breaks_at"]


async def test_kill_9_and_restart_every_nats_node_mid_run(
    run: Run, report: Callable[[str], None]
) -> None:
    async def fault() -> None:
        run.cluster.kill()

        async def both_blind() -> bool:
            # Both hubs must notice the outage before NATS comes back.
            return not any([await hub.ready(run.client) for hub in run.hubs])

        await eventually(both_blind, timeout=10, interval=0.05)
        run.cluster.start()

    figures = await scenario(run, "kill -9 and restart all NATS nodes", fault, report)
    assert figures["streams_reconnected"] == 0, run.where_to_look()
