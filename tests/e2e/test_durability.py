"""Durability you choose and can see (issue 12, item 3).

The embedded nats-server's default, `sync_interval: always`, is proved from the system
calls of the real server: `strace -f` attached to the nats-server child records every
block-file write, fsync and socket write while a bridge creates tasks. For every
acknowledged create, the block-file write carrying its key is followed by a completed
fsync (or fdatasync) of that block file, and only then does the server start writing the
ack (`{"stream":"KV_mcp-tasks","seq":N}`) to the client's socket. Under
`sync_interval: 2m` the same trace shows every ack sent with no fsync in between, so the
test shows the flag is what makes the difference. strace serialises the events of all
threads into one file in the order they happened (an interrupted call is split into
`<unfinished ...>` and `<... resumed>` lines), so line order is event order.

Then what the hub reports: `taskhub serve` logs and exports the replicas and the sync
policy, warning when one power cut could lose an acknowledged create.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest

from bridge import TaskBridge
from bridge.wire import DEFAULT_BUCKET
from hub.commands.embedded_nats import NatsServerProcess
from hub.metrics import Metrics
from hub.options import config_from_args
from hub.store.cache import TaskCache
from hub.store.source import NatsSource
from tests.e2e.test_serve import taskhub_command
from tests.helpers import eventually, free_port

CREATES = 20
TRACED = "write,writev,pwrite64,pwritev,pwritev2,fsync,fdatasync,sendmsg,sendto"


def strace_problem() -> str | None:
    """Why strace cannot trace a process here, or None."""
    strace = shutil.which("strace")
    if strace is None:
        return "strace is not installed (Debian: apt-get install -y strace)"
    probe = subprocess.run(
        [strace, "-f", "-e", "trace=none", "true"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"ptrace is not permitted here: {probe.stderr.strip()[:200]}"
    return None


needs_strace = pytest.mark.skipif(strace_problem() is not None, reason=str(strace_problem()))


def all_threads_traced(pid: int) -> bool:
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except FileNotFoundError:
            continue  # the thread ended
        tracer = re.search(r"^TracerPid:\s*(\d+)", status, re.M)
        if tracer is None or tracer.group(1) == "0":
            return False
    return True


@dataclass
class Trace:
    task_writes: dict[str, tuple[int, str]]  # task id -> (line, block file) of its first write
    fsyncs: list[tuple[int, str]]  # (line where it completed, block file)
    acks: dict[int, int]  # stream sequence -> line where the ack write started


LINE_RE = re.compile(r"^(\d+)\s+(.*)$")
CALL_RE = re.compile(r"^(\w+)\((\d+)<([^>]*)>")
RESUMED_RE = re.compile(r"^<\.\.\. (\w+) resumed>.*= (-?\d+)")
KEY_RE = re.compile(r"\$KV\.[\w-]+\.([0-9a-f-]{36})")
ACK_RE = re.compile(r'\\"stream\\":\\"KV_mcp-tasks\\",\\"seq\\":(\d+)[},]')


def parse_trace(text: str) -> Trace:
    trace = Trace({}, [], {})
    pending: dict[tuple[str, str], str] = {}  # (pid, call) -> block file of an unfinished fsync
    for index, line in enumerate(text.splitlines()):
        match = LINE_RE.match(line)
        if match is None:
            continue
        pid, rest = match.groups()
        resumed = RESUMED_RE.match(rest)
        if resumed is not None:
            path = pending.pop((pid, resumed.group(1)), None)
            if path is not None and resumed.group(2) == "0":
                trace.fsyncs.append((index, path))
            continue
        call = CALL_RE.match(rest)
        if call is None:
            continue
        name, _, path = call.groups()
        unfinished = rest.endswith("<unfinished ...>")
        if name in ("fsync", "fdatasync") and path.endswith(".blk"):
            if unfinished:
                pending[(pid, name)] = path
            elif rest.rstrip().endswith("= 0"):
                trace.fsyncs.append((index, path))
        elif path.endswith(".blk"):
            for task_id in KEY_RE.findall(rest):
                trace.task_writes.setdefault(task_id, (index, path))
        elif path.startswith("TCP"):
            for seq in ACK_RE.findall(rest):
                trace.acks.setdefault(int(seq), index)
    return trace


async def traced_creates(tmp_path: Path, sync: str) -> tuple[Trace, dict[str, int]]:
    """CREATES bridge creates on an embedded nats-server run with `sync`, under strace;
    the trace and each task's stream sequence (its KV revision)."""
    server = NatsServerProcess(tmp_path / "nats", sync=sync)
    url = await asyncio.to_thread(server.start)
    assert server.process is not None
    pid = server.process.pid
    trace_file = tmp_path / "strace.txt"
    strace = await asyncio.create_subprocess_exec(
        *("strace", "-f", "-yy", "-s", "256", "-e", f"trace={TRACED}"),
        *("-o", str(trace_file), "-p", str(pid)),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: all_threads_traced(pid), timeout=10)
        bridge = await TaskBridge.connect(url, server_id="srv-1")
        try:
            task_ids = [(await bridge.create(owner="alice")).task_id for _ in range(CREATES)]
        finally:
            await bridge.close()
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(DEFAULT_BUCKET)
            revisions = {task_id: (await kv.get(task_id)).revision for task_id in task_ids}
        finally:
            await nc.close()
    finally:
        strace.send_signal(signal.SIGTERM)  # detaches; the server runs on
        await asyncio.wait_for(strace.wait(), 10)
        await asyncio.to_thread(server.stop)
    return parse_trace(trace_file.read_text()), {k: int(v or 0) for k, v in revisions.items()}


def fsynced_before_ack(trace: Trace, task_id: str, seq: int) -> bool:
    write_line, block = trace.task_writes[task_id]
    ack_line = trace.acks[seq]
    assert write_line < ack_line
    return any(write_line < line < ack_line and path == block for line, path in trace.fsyncs)


@needs_strace
async def test_embedded_default_fsyncs_every_create_before_its_ack(tmp_path: Path) -> None:
    default_sync = config_from_args([], env={}).nats_sync
    assert default_sync == "always"
    trace, revisions = await traced_creates(tmp_path, default_sync)
    assert len(revisions) == CREATES
    assert set(revisions) <= set(trace.task_writes), "a create's block write is missing"
    assert set(revisions.values()) <= set(trace.acks), "a create's ack is missing"
    assert len(trace.fsyncs) >= CREATES
    late = [t for t, seq in revisions.items() if not fsynced_before_ack(trace, t, seq)]
    assert late == [], f"acknowledged before an fsync: {late}"


@needs_strace
async def test_sync_interval_acks_creates_without_fsync(tmp_path: Path) -> None:
    trace, revisions = await traced_creates(tmp_path, "2m")
    assert set(revisions) <= set(trace.task_writes)
    assert set(revisions.values()) <= set(trace.acks)
    synced = [t for t, seq in revisions.items() if fsynced_before_ack(trace, t, seq)]
    assert synced == [], f"fsynced before the ack under 2m: {synced}"


def test_nats_sync_is_validated() -> None:
    assert config_from_args(["--nats-sync", "10s"], env={}).nats_sync == "10s"
    assert config_from_args([], env={"TASKHUB_NATS_SYNC": "2M"}).nats_sync == "2m"
    for bad in ("soon", "0s", "10", "-1s"):
        with pytest.raises(SystemExit):
            config_from_args(["--nats-sync", bad], env={})


def metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


async def serve_and_report(tmp_path: Path, *extra: str) -> tuple[dict[str, float | None], str]:
    """Start `taskhub serve` (embedded NATS); its durability metrics and log."""
    port = free_port()
    log_file = tmp_path / "hub.log"
    args = ["serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), *extra]
    with log_file.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args, stderr=log)
    names = ("taskhub_bucket_replicas", "taskhub_control_replicas", "taskhub_nats_sync_always")
    found: dict[str, float | None] = {}
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def reported() -> bool:
                try:
                    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                except httpx.TransportError:
                    return False
                found.update({name: metric(text, name) for name in names})
                return found["taskhub_bucket_replicas"] not in (None, 0)

            await eventually(reported, timeout=15)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    return found, log_file.read_text()


async def test_serve_reports_the_embedded_default(tmp_path: Path) -> None:
    found, log = await serve_and_report(tmp_path)
    assert found == {
        "taskhub_bucket_replicas": 1,
        "taskhub_control_replicas": 1,
        "taskhub_nats_sync_always": 1,
    }
    line = next(line for line in log.splitlines() if "durability:" in line)
    assert " INFO " in line and "R1" in line and "NATS sync always" in line, line


async def test_serve_warns_under_a_sync_interval(tmp_path: Path) -> None:
    started = time.monotonic()
    found, log = await serve_and_report(tmp_path, "--nats-sync", "2m")
    assert found["taskhub_nats_sync_always"] == 0
    line = next(line for line in log.splitlines() if "durability:" in line)
    assert " WARNING " in line and "NATS sync 120s" in line and "power cut" in line, line
    assert time.monotonic() - started < 30


async def test_external_server_without_monitoring_is_unknown(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    source = NatsSource(nats_url, f"dur-{os.getpid()}-{time.monotonic_ns()}", TaskCache(), metrics)
    with caplog.at_level(logging.INFO, logger="taskhub.nats"):
        await source.start()
    try:
        assert metrics.nats_sync_always.value() == -1
        assert metrics.bucket_replicas.value() == 1
        warned = [r for r in caplog.records if "durability:" in r.getMessage()]
        assert warned and warned[0].levelno == logging.WARNING
        assert "unknown (no --nats-monitor-url)" in warned[0].getMessage()
    finally:
        await source.close()


async def test_external_server_sync_read_from_monitoring(tmp_path: Path) -> None:
    server = NatsServerProcess(tmp_path / "nats", sync="always", monitor=True)
    url = await asyncio.to_thread(server.start)
    try:
        metrics = Metrics()
        source = NatsSource(
            url, DEFAULT_BUCKET, TaskCache(), metrics, monitor_url=server.monitor_url
        )
        await source.start()
        try:
            assert metrics.nats_sync_always.value() == 1
            assert metrics.control_replicas.value() == 1
        finally:
            await source.close()
    finally:
        await asyncio.to_thread(server.stop)
