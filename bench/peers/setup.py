"""Whether a peer's binaries are here, installing its Debian package when they are not.

Set-up runs `apt-get install -y <package>` only as root and only when the run allows it
(not under --smoke), and says so on stderr; otherwise the reason the peer is missing is
what the table shows in its cell. Each peer is looked up once per run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NGINX = Path("/usr/sbin/nginx")
NCHAN_MODULE = Path("/usr/lib/nginx/modules/ngx_nchan_module.so")
PUSHPIN = Path("/usr/bin/pushpin")
APT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Requirement:
    """A peer's files and the Debian packages that provide them."""

    files: tuple[Path, ...]
    packages: tuple[str, ...]


REQUIREMENTS = {
    "nchan": Requirement((NGINX, NCHAN_MODULE), ("nginx-light", "libnginx-mod-nchan")),
    "pushpin": Requirement((PUSHPIN,), ("pushpin",)),
    "nginx": Requirement((NGINX,), ("nginx-light",)),
}


def _missing(requirement: Requirement) -> list[Path]:
    return [path for path in requirement.files if not path.exists()]


def apt_install(packages: Sequence[str]) -> str:
    """Install with apt-get; "" on success, else the tail of its output."""
    try:
        done = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", *packages],
            capture_output=True,
            text=True,
            timeout=APT_TIMEOUT_S,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return ""
    output = (done.stderr or done.stdout).strip().splitlines()
    return output[-1] if output else f"exit code {done.returncode}"


@dataclass
class PeerSetup:
    """Which peers this run can start; `skipped` holds the reason for each that it cannot."""

    log: Callable[[str], None]
    may_install: bool
    skipped: dict[str, str] = field(default_factory=dict)
    _ready: set[str] = field(default_factory=set)

    async def available(self, peer: str) -> bool:
        if peer in self._ready:
            return True
        if peer in self.skipped:
            return False
        requirement = REQUIREMENTS[peer]
        missing = _missing(requirement)
        if missing and self.may_install and os.geteuid() == 0:
            packages = " ".join(requirement.packages)
            self.log(f"{peer}: {missing[0]} is missing; running apt-get install -y {packages}")
            failure = await asyncio.to_thread(apt_install, requirement.packages)
            if failure:
                self.log(f"{peer}: apt-get install failed: {failure}")
            missing = _missing(requirement)
        if missing:
            why = f"{missing[0]} missing"
            if not self.may_install:
                why += "; this run installs nothing"
            elif os.geteuid() != 0:
                why += f"; not root, so not apt-get install {' '.join(requirement.packages)}"
            else:
                why += f"; apt-get install {' '.join(requirement.packages)} did not provide it"
            self.skip(peer, why)
            return False
        self._ready.add(peer)
        return True

    def skip(self, peer: str, why: str) -> None:
        """Record why `peer` is not measured (a failed start counts, too)."""
        if peer not in self.skipped:
            self.log(f"{peer}: skipped ({why})")
            self.skipped[peer] = why
        self._ready.discard(peer)


def _output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).strip()


def versions() -> dict[str, str]:
    """The peers' versions as installed ("absent" when not), for the report's header."""
    nginx = _output([str(NGINX), "-v"]).rpartition("/")[2] if NGINX.exists() else ""
    nchan = _output(["dpkg-query", "-W", "-f", "${Version}", "libnginx-mod-nchan"])
    pushpin = (
        _output([str(PUSHPIN), "--version"]).removeprefix("pushpin ") if PUSHPIN.exists() else ""
    )
    return {
        "nginx": nginx or "absent",
        # Debian spells it 1:1.3.6+dfsg-2: the upstream version is what sits between.
        "nchan": nchan.split(":")[-1].split("+")[0].split("-")[0]
        if NCHAN_MODULE.exists() and nchan
        else "absent",
        "pushpin": pushpin or "absent",
    }
