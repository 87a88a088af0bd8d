"""What a result was measured on: cores, CPU, memory, Python, package versions, load.

Figures from a 2-core VM and a 32-core workstation are different facts; every report
carries this block so a number is never read without its machine. The load average
before and after the run says how much other work shared the cores.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any

from bench.peers.setup import versions as peer_versions
from hub.commands.embedded_nats import nats_server_binary

PACKAGES = (
    "taskhub",
    "uvicorn",
    "uvloop",
    "httptools",
    "starlette",
    "msgspec",
    "nats-py",
    "mcp",
    "sse-starlette",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


def _nats_server_version() -> str:
    try:
        out = subprocess.run(
            [nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip().removeprefix("nats-server: ") or "unknown"
    except Exception:
        return "unknown"


def load_average() -> float:
    return os.getloadavg()[0]


def describe() -> dict[str, Any]:
    versions: dict[str, str] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions["nats-server"] = _nats_server_version()
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "memory_gb": _memory_gb(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": versions,
        "peers": peer_versions(),  # nginx, nchan, Pushpin: the peers' packages
    }
