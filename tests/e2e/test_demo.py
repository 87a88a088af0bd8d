"""`taskhub demo` as a newcomer runs it: one process with NATS, the hub and a busy fleet."""

from __future__ import annotations

import asyncio
import glob
import os
import random
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from hub.commands.demo_fleet import SILENT_SERVER, Fleet, Pace
from tests.e2e.test_serve import pid_alive
from tests.helpers import SseEvents, eventually, free_port, start_served_hub

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


async def test_demo_serves_a_busy_fleet_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hub.commands.cli", "demo", "--port", str(port)),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its temporary store goes
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=15.0)) as client:

            async def ready() -> bool:
                try:
                    return (await client.get(url + "/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=10, interval=0.05)
            (store,) = os.listdir(tmp_path)
            assert store.startswith("taskhub-demo-")
            (ports,) = glob.glob(f"{tmp_path}/{store}/nats/ports/nats-server_*.ports")
            nats_pid = int(Path(ports).stem.split("_")[1])
            request = client.build_request("GET", url + "/operator/stream")
            response = await client.send(request, stream=True)
            try:
                assert response.status_code == 200
                events = SseEvents(response)
                name, hello = await events.next()
                assert name == "hello" and hello["principal"] == "anonymous"
                servers, statuses, tasks = set(), set(), 0
                while tasks < 5:  # a busy fleet within 10 s of the start
                    name, data = await events.next(timeout=10 - (time.monotonic() - started))
                    if name == "task":
                        tasks += 1
                        servers.add(data["server"])
                        statuses.add(data["task"]["status"])
                        assert data["owner"] == "anonymous"
                deadline = started + 30
                while len(statuses) < 3 or len(servers) < 3:
                    name, data = await events.next(timeout=deadline - time.monotonic())
                    if name == "task":
                        servers.add(data["server"])
                        statuses.add(data["task"]["status"])
                assert servers == {"atlas-1", "borealis-1", "cirrus-1"}

                banner = (await asyncio.wait_for(process.stdout.read(4096), 5)).decode()
                assert f"{url}/" in banner and f"taskhub tail --url {url}" in banner

                # Stop it with the stream still open: fleet, hub and NATS go, exit 0.
                stopping = time.monotonic()
                process.send_signal(signal.SIGTERM)
                async with asyncio.timeout(10):
                    with pytest.raises((EOFError, httpx.HTTPError)):
                        while True:
                            name, data = await events.next()
                            if name == "bye":
                                assert data == {"reason": "shutdown"}
                    code = await process.wait()
            finally:
                await response.aclose()
        errors = (await process.stderr.read()).decode()
        assert code == 0, errors
        assert "Traceback" not in errors
        assert time.monotonic() - stopping < 8
        assert not pid_alive(nats_pid)
        assert os.listdir(tmp_path) == []  # the temporary store is gone
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_demo_reads_its_options_from_the_environment_as_serve_does(
    tmp_path: Path,
) -> None:
    """`TASKHUB_PORT=… TASKHUB_DATA_DIR=… taskhub demo`: the variables the README promises
    for every command (before, the demo's own parser ignored them and served on 8080)."""
    port = free_port()
    data_dir = tmp_path / "demo-data"
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hub.commands.cli", "demo"),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TASKHUB_PORT": str(port), "TASKHUB_DATA_DIR": str(data_dir)},
    )
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:

            async def ready() -> bool:
                try:
                    return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=15, interval=0.05)
        assert (data_dir / "nats").is_dir()  # the store is where the variable said
        process.send_signal(signal.SIGTERM)
        assert process.stderr is not None
        errors = (await asyncio.wait_for(process.stderr.read(), 15)).decode()
        assert await asyncio.wait_for(process.wait(), 15) == 0, errors
        assert (data_dir / "nats").is_dir()  # a given data dir is kept
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_fleet_steers_its_tasks_through_the_hub(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Input answered, a cancel, and a silent server's waiting cancel, end to end."""
    harness = await start_served_hub(nats_url, bucket, tmp_path)
    fleet = Fleet(nats_url, harness.url, bucket, Pace(step_s=0.05))
    fleet.random = random.Random(7)
    try:
        async with fleet.connected(), harness.operator_stream() as events:
            await events.opening()
            atlas, borealis = fleet.servers[0], fleet.servers[1]
            async with asyncio.timeout(30):
                await asyncio.gather(fleet.input(atlas), fleet.cancel(borealis))
            seen: dict[str, list[str]] = {}
            while sum(s[-1] in ("completed", "cancelled") for s in seen.values()) < 2:
                data = await events.until("task")
                seen.setdefault(data["task"]["taskId"], []).append(data["task"]["status"])
            answered = next(s for s in seen.values() if "input_required" in s)
            assert answered[-1] == "completed"
            assert any(s[-1] == "cancelled" for s in seen.values())

            # Silent: no consumer, so the client's cancel waits; on recovery it is taken.
            silent = next(s for s in fleet.servers if s.id == SILENT_SERVER)
            task_id = await fleet._create(silent, "waiting on a lock")
            await silent.go_silent()
            await fleet.client.cancel(task_id)

            def waiting() -> bool:
                rows = {row["server"]: row for row in harness.hub.fleet.servers()}
                return bool((rows.get(SILENT_SERVER) or {}).get("controlWaiting"))

            await eventually(waiting, timeout=15)
            snapshot = harness.hub.cache.get(task_id)
            assert snapshot is not None and snapshot.status == "working"  # still waiting
            await silent.start()
            done = await events.until(
                "task",
                lambda d: d["task"]["taskId"] == task_id and d["task"]["status"] != "working",
                timeout=15,
            )
            assert done["task"]["status"] == "cancelled"
    finally:
        await harness.stop()
