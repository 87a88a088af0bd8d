"""Launch the whole fleet demo: the hub as front door, servers alpha and beta, the client.

    python -m examples.fleet.run [--data-dir DIR] [--decline]

Picks a loopback port for each server, starts `taskhub serve --upstream alpha=...
--upstream beta=...` (its embedded NATS writes its URL to <data-dir>/nats/url), starts both
servers on their ports against that NATS, runs the client with the hub's URL for each
server (`/servers/alpha/mcp`, `/servers/beta/mcp`) and nothing else, and stops every process
it started, by PID, whatever happens. Logs go to files in the data directory.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: examples/ runs from here
SERVERS = ("alpha", "beta")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


class Processes:
    """Every child this launcher started, stopped in reverse order by PID."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()  # the child holds its own descriptor
        self.started.append((name, process))
        print(f"started {name} (pid {process.pid}), log {self.logs / (name + '.log')}")
        return process

    def stop_all(self) -> None:
        for name, process in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # graceful: listen streams end, tasks end
                try:
                    process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            print(f"stopped {name} (pid {process.pid}, exit code {process.returncode})")
        self.started.clear()

    def check_alive(self) -> None:
        for name, process in self.started:
            if process.poll() is not None:
                log = self.logs / f"{name}.log"
                raise RuntimeError(f"{name} exited with {process.returncode}; see {log}")


def wait_for(what: str, ready: Callable[[], str | None], processes: Processes) -> str:
    """Poll `ready` until it returns a value (a start-up wait, not a test)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        processes.check_alive()
        value = ready()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {START_TIMEOUT:.0f}s")


def read_file(path: Path) -> Callable[[], str | None]:
    def read() -> str | None:
        return path.read_text().strip() if path.exists() else None

    return read


def answers_ok(url: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return url if response.status == 200 else None
        except (urllib.error.URLError, OSError):
            return None

    return probe


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(data_dir: Path, decline: bool) -> int:
    processes = Processes(data_dir)
    # Left by an earlier run in the same directory, they would point at dead processes.
    for stale in (data_dir / "nats" / "url", data_dir / "alpha.url", data_dir / "beta.url"):
        stale.unlink(missing_ok=True)
    try:
        hub_port = free_port()
        ports = {name: free_port() for name in SERVERS}
        upstreams = [f"--upstream={name}=http://127.0.0.1:{ports[name]}/mcp" for name in SERVERS]
        processes.start(
            "taskhub",
            *("-m", "hub.commands.cli", "serve", "--port", str(hub_port)),
            *("--data-dir", str(data_dir)),
            *upstreams,
        )
        nats_url = wait_for("embedded NATS", read_file(data_dir / "nats" / "url"), processes)
        hub_base = f"http://127.0.0.1:{hub_port}"
        wait_for("the hub", answers_ok(hub_base + "/readyz"), processes)
        print(f"hub ready at {hub_base}, NATS at {nats_url}")
        for name in SERVERS:
            ready_file = data_dir / f"{name}.url"
            processes.start(
                name,
                *("-m", f"examples.fleet.{name}", "--nats-url", nats_url),
                *("--server-id", f"{name}-1", "--ready-file", str(ready_file)),
                *("--port", str(ports[name])),
            )
            url = wait_for(name, read_file(ready_file), processes)
            print(f"{name} ready at {url}, served to clients at {hub_base}/servers/{name}/mcp")
        print("\nrunning the client\n" + "-" * 60)
        client = [sys.executable, "-m", "examples.fleet.client"]
        client += [
            arg for name in SERVERS for arg in (f"--{name}", f"{hub_base}/servers/{name}/mcp")
        ]
        client += ["--decline"] if decline else []
        code = subprocess.run(client, cwd=ROOT).returncode
        print("-" * 60)
        return code
    finally:
        processes.stop_all()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.fleet.run", description=__doc__)
    parser.add_argument("--data-dir", type=Path, help="kept afterwards (default: a temp dir)")
    parser.add_argument("--decline", action="store_true", help="answer the deploy with no")
    args = parser.parse_args(argv)
    if args.data_dir is not None:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        return run(args.data_dir.resolve(), args.decline)
    data_dir = Path(tempfile.mkdtemp(prefix="taskhub-fleet-"))
    try:
        return run(data_dir, args.decline)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
