"""`taskhub serve` as a user runs it: a real process with its embedded nats-server."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import httpx

from tests.helpers import SUB_KEY, SseStream, eventually, free_port, headers_for, rpc


def taskhub_command() -> list[str]:
    script = shutil.which("taskhub")
    return [script] if script else [sys.executable, "-m", "hub.commands.cli"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie awaiting its parent's wait() counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


async def test_serve_starts_answers_and_shuts_down_gracefully(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    args = ["serve", "--port", str(port), "--data-dir", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args)
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            discover = rpc("server/discover", id="d1")

            async def discovered() -> bool:
                try:
                    r = await client.post(
                        url + "/mcp", json=discover, headers=headers_for(discover)
                    )
                except httpx.TransportError:
                    return False
                return r.status_code == 200

            await eventually(discovered, timeout=5)
            assert time.monotonic() - started < 5
            assert (await client.get(url + "/healthz")).status_code == 200
            assert (await client.get(url + "/readyz")).status_code == 200
            metrics = (await client.get(url + "/metrics")).text
            assert "taskhub_requests_total" in metrics and "taskhub_open_streams" in metrics

            ports = list((tmp_path / "nats" / "ports").glob("nats-server_*.ports"))
            assert len(ports) == 1 and (tmp_path / "nats" / "nats-server.log").exists()
            nats_pid = int(ports[0].stem.split("_")[1])
            assert pid_alive(nats_pid)

            body = rpc("subscriptions/listen", {"notifications": {"taskIds": []}}, id=7)
            async with client.stream(
                "POST", url + "/mcp", json=body, headers=headers_for(body)
            ) as response:
                assert response.headers["x-accel-buffering"] == "no"
                stream = SseStream(response)
                ack = await stream.next()
                assert ack["method"] == "notifications/subscriptions/acknowledged"
                assert ack["params"] == {"_meta": {SUB_KEY: 7}, "notifications": {"taskIds": []}}
                proc.send_signal(signal.SIGTERM)
                goodbye = await stream.next()
                assert goodbye == {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "result": {"resultType": "complete", "_meta": {SUB_KEY: 7}},
                }
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
        await eventually(lambda: not pid_alive(nats_pid), timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def wakeups(pid: int) -> int:
    """How many times the process has gone to sleep and been woken (voluntary switches)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return sum(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_")
    )


async def test_an_idle_hub_sleeps_and_still_stops_at_once(tmp_path: Path) -> None:
    """No streams, no changes: the hub wakes for its timers only (the NATS pings, the
    watch check, the tick, the sweeps, uvicorn's date once a second: about ten a second;
    uvicorn alone woke it ten times a second more), and SIGTERM still stops it at once."""
    port = free_port()
    args = ["serve", "--port", str(port), "--data-dir", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args)
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def ready() -> bool:
                try:
                    r = await client.get(f"http://127.0.0.1:{port}/readyz")
                except httpx.TransportError:
                    return False
                return r.status_code == 200

            await eventually(ready, timeout=10)
        await asyncio.sleep(1)  # past start-up's own work
        before, started = wakeups(proc.pid), time.monotonic()
        await asyncio.sleep(3)
        rate = (wakeups(proc.pid) - before) / (time.monotonic() - started)
        assert rate < 15, f"{rate:.1f} wake-ups a second"
        proc.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
        assert time.monotonic() - stopping < 2
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_terminal_ctrl_c_reaches_the_hub_and_not_its_nats(tmp_path: Path) -> None:
    """Ctrl-C signals the terminal's whole foreground process group; the embedded
    nats-server is outside it, so the hub says goodbye, drains and stops it in order."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--data-dir", str(tmp_path)]
    # A process group of its own, as a shell gives a foreground job.
    proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args, start_new_session=True)
    try:
        ports_dir = tmp_path / "nats" / "ports"
        await eventually(lambda: any(ports_dir.glob("*.ports")), timeout=10)
        nats_pid = int(next(ports_dir.glob("*.ports")).stem.split("_")[1])
        assert os.getpgid(nats_pid) != os.getpgid(proc.pid)
        async with httpx.AsyncClient(timeout=5) as client:
            await eventually(lambda: ready(client, url), timeout=10)
            body = rpc("subscriptions/listen", {"notifications": {"taskIds": []}}, id=8)
            async with client.stream(
                "POST", url + "/mcp", json=body, headers=headers_for(body)
            ) as response:
                stream = SseStream(response)
                await stream.next()  # the ack
                os.killpg(os.getpgid(proc.pid), signal.SIGINT)
                assert (await stream.next())["result"]["resultType"] == "complete"
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
        await eventually(lambda: not pid_alive(nats_pid), timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def ready(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url + "/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def test_embedded_nats_dies_with_a_killed_hub(tmp_path: Path) -> None:
    args = ["serve", "--port", str(free_port()), "--data-dir", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args)
    try:
        ports_dir = tmp_path / "nats" / "ports"
        await eventually(lambda: any(ports_dir.glob("*.ports")), timeout=10)
        nats_pid = int(next(ports_dir.glob("*.ports")).stem.split("_")[1])
        proc.kill()  # SIGKILL: no chance to stop the child itself
        await proc.wait()
        await eventually(lambda: not pid_alive(nats_pid), timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def test_workers_share_the_port_and_stop_gracefully(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--data-dir", str(tmp_path), "--workers", "2"]
    proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args)
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def all_ready() -> bool:
                try:
                    answers = [await client.get(url + "/readyz") for _ in range(8)]
                except httpx.TransportError:
                    return False
                return all(r.status_code == 200 for r in answers)

            await eventually(all_ready, timeout=20)
            # nats-server plus two workers (and spawn's resource tracker, if any).
            assert len(children(proc.pid)) >= 3
            body = rpc("subscriptions/listen", {"notifications": {"taskIds": []}}, id="w")
            async with client.stream(
                "POST", url + "/mcp", json=body, headers=headers_for(body)
            ) as response:
                stream = SseStream(response)
                assert (await stream.next())["method"].endswith("acknowledged")
                proc.send_signal(signal.SIGTERM)
                assert (await stream.next())["id"] == "w"
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
