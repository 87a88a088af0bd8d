#!/usr/bin/env python3
"""CI: the wheel installs the product alone, and the product works from it.

Builds the sdist and, from it, the wheel (`python -m build`) out of a copy of the working
tree, installs the wheel with its dependencies in a new virtual environment, and there,
away from the repository, checks that only `hub` and `bridge` reach the top level of
site-packages (`bench` and the rest run from the repository root), that
`from bridge import TaskBridge` imports, and that `taskhub serve` and `taskhub demo`, each
with its embedded NATS, answer /readyz 200 and serve the dashboard with its assets, then
exit 0 on SIGTERM with their nats-server stopped.

Run alone with the dev extra installed (it brings `build`): `python .ci/wheel_check.py`.
Bounded by --timeout; it stops only the processes it started, by PID, and exits 1 with the
reason and the logs on any failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = {"hub", "bridge"}
# Build output and caches a working tree may hold; setuptools would pack a stale build/lib.
SKIPPED_AT_TOP = {"build", "dist"}
SKIPPED_ANYWHERE = shutil.ignore_patterns("__pycache__", "node_modules", "*.egg-info")
ASSET = re.compile(r'(?:src|href)="(/dashboard/[^"]+)"')


class CheckFailed(Exception):
    """One check failed; the message says which and carries what shows why."""


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise CheckFailed("out of time (--timeout)")
        return left if cap is None else min(left, cap)


def say(message: str) -> None:
    print(f"== wheel: {message}", flush=True)


def run(
    argv: list[str],
    deadline: Deadline,
    log: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run to completion; its output goes to `log` and is returned."""
    with log.open("wb") as out:
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=deadline.left(),
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"{shlex.join(argv)}: out of time\n{tail(log)}") from None
    if done.returncode != 0:
        raise CheckFailed(f"{shlex.join(argv)} exited {done.returncode}\n{tail(log)}")
    return log.read_text(errors="replace")


def tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(f"   | {line}" for line in text.splitlines()[-lines:])


def copy_sources(source: Path) -> None:
    """The working tree without build output, caches or dot directories (.git, …)."""
    source.mkdir()
    for path in ROOT.iterdir():
        if path.name.startswith(".") or path.name in SKIPPED_AT_TOP:
            continue
        if path.is_dir():
            shutil.copytree(path, source / path.name, ignore=SKIPPED_ANYWHERE)
        elif not path.name.endswith(".egg-info"):
            shutil.copy2(path, source / path.name)


def wheel_tops(wheel: Path) -> tuple[set[str], set[str], set[str]]:
    """Top-level names of the wheel's files, of its RECORD, and of its top_level.txt, the
    .dist-info directory left out."""
    with zipfile.ZipFile(wheel) as packed:
        names = packed.namelist()
        (dist_info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
        record = packed.read(f"{dist_info}/RECORD").decode()
        top_level = packed.read(f"{dist_info}/top_level.txt").decode()
    files = {name.split("/")[0] for name in names}
    recorded = {line.split(",")[0].split("/")[0] for line in record.splitlines() if line}
    return files - {dist_info}, recorded - {dist_info}, set(top_level.split())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except OSError:
        return 0, b""


def alive(pid: int) -> bool:
    """A live process (not a zombie) holds `pid`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@contextmanager
def started(
    argv: list[str], log: Path, cwd: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """A process of this check's own; whatever happens, it does not outlive the block."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()  # by its PID
            process.wait()


def run_until_ready(
    command: str, bin_dir: Path, work: Path, cwd: Path, env: dict[str, str], deadline: Deadline
) -> None:
    """`taskhub <command>` in `cwd` on a free port, its embedded NATS under `work`: /readyz
    200, the dashboard and every asset it names 200, then SIGTERM, exit 0, NATS stopped."""
    port, data_dir, log = free_port(), work / command, work / f"{command}.log"
    base = f"http://127.0.0.1:{port}"
    argv = [str(bin_dir / "taskhub"), command, "--port", str(port), "--data-dir", str(data_dir)]
    name = f"taskhub {command}"
    with started(argv, log, cwd, env) as process:
        began = time.monotonic()
        ready_by = began + deadline.left(cap=60)
        while get(f"{base}/readyz")[0] != 200:
            if process.poll() is not None or time.monotonic() > ready_by:
                raise CheckFailed(f"{name}: never ready on /readyz\n{tail(log)}")
            time.sleep(0.2)
        say(f"{name}: /readyz 200 after {time.monotonic() - began:.1f} s")
        status, page = get(f"{base}/")
        assets = ASSET.findall(page.decode(errors="replace"))
        if status != 200 or not assets:
            raise CheckFailed(f"{name}: the dashboard page is {status}, its assets {assets}")
        for asset in assets:
            status, body = get(base + asset)
            if status != 200 or not body:
                raise CheckFailed(f"{name}: {asset} is {status}\n{tail(log)}")
        say(f"{name}: the dashboard and its {len(assets)} assets 200")
        # nats-server deletes its ports file on exit: read its PID while it runs.
        nats = [int(p.stem.rpartition("_")[2]) for p in data_dir.glob("nats/ports/*.ports")]
        if len(nats) != 1:
            raise CheckFailed(f"{name}: not one embedded nats-server but {nats}")
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(deadline.left(cap=30))
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"{name}: still running 30 s after SIGTERM\n{tail(log)}") from None
    if code != 0:
        raise CheckFailed(f"{name}: exited {code} on SIGTERM\n{tail(log)}")
    if alive(nats[0]):
        raise CheckFailed(f"{name}: its nats-server (PID {nats[0]}) outlived it")
    say(f"{name}: exit 0 on SIGTERM, its nats-server stopped")


def check(work: Path, deadline: Deadline) -> None:
    began = time.monotonic()
    if importlib.util.find_spec("build") is None:
        raise CheckFailed(f"{sys.executable} has no `build`: pip install -e '.[dev]'")
    source, dist, venv, away = (work / name for name in ("source", "dist", "venv", "away"))
    copy_sources(source)
    # The sdist, then the wheel from the unpacked sdist: what a release uploads.
    run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        deadline,
        work / "build.log",
    )
    (wheel,) = dist.glob("taskhub-*.whl")
    say(f"built {wheel.name} from the sdist in {time.monotonic() - began:.0f} s")
    files, recorded, top_level = wheel_tops(wheel)
    if not files == recorded == top_level == PRODUCT:
        raise CheckFailed(
            f"{wheel.name} holds more than {sorted(PRODUCT)} at top level: files {sorted(files)},"
            f" RECORD {sorted(recorded)}, top_level.txt {sorted(top_level)}"
        )
    say(f"{wheel.name}: top level {sorted(files)} alone (files, RECORD, top_level.txt)")

    run([sys.executable, "-m", "venv", str(venv)], deadline, work / "venv.log")
    bin_dir = venv / "bin"
    # Nothing of the caller's: no PYTHONPATH, no other venv, no TASKHUB_* settings.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not key.startswith("TASKHUB_")
    }
    env |= {"VIRTUAL_ENV": str(venv), "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}
    python = str(bin_dir / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", str(wheel)], deadline, work / "install.log", env=env)
    run([*pip, "check"], deadline, work / "check.log", env=env)
    say(f"installed alone with its dependencies in a new venv ({time.monotonic() - began:.0f} s)")

    # From an empty directory, so the repository is nowhere on sys.path.
    away.mkdir()
    run(
        [python, "-c", "from bridge import TaskBridge"],
        deadline,
        work / "import.log",
        cwd=away,
        env=env,
    )
    probe = run([python, "-c", INSTALLED], deadline, work / "installed.log", cwd=away, env=env)
    installed = json.loads(probe)
    site = installed["site"]
    if set(installed["tops"]) != PRODUCT or installed["bench"] is not None:
        raise CheckFailed(
            f"installed at top level: {installed['tops']}, bench: {installed['bench']}"
        )
    if not all(Path(path).is_relative_to(site) for path in installed["files"]):
        raise CheckFailed(f"not imported from {site}: {installed['files']}")
    say(f"from bridge import TaskBridge; installed at top level: {installed['tops']} alone")

    for command in ("serve", "demo"):
        run_until_ready(command, bin_dir, work, away, env, deadline)
    say(f"passed in {time.monotonic() - began:.0f} s")


# Run in the new venv: what the taskhub distribution installed, and where imports come from.
INSTALLED = """
import importlib.metadata, importlib.util, json, sysconfig
import bridge, hub
files = importlib.metadata.distribution("taskhub").files or []
bench = importlib.util.find_spec("bench")
print(json.dumps({
    "tops": sorted({f.parts[0] for f in files if f.parts[0] != ".."
                    and not f.parts[0].endswith(".dist-info")}),
    "bench": None if bench is None else repr(bench),
    "site": sysconfig.get_path("purelib"),
    "files": [hub.__file__, bridge.__file__],
}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600, help="seconds in all (600)")
    args = parser.parse_args()
    # A SIGTERM (CI giving up) still stops the processes this check started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="taskhub-wheel-") as work:
        try:
            check(Path(work), Deadline(args.timeout))
        except CheckFailed as failure:
            print(f"== wheel: FAILED: {failure}", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
