"""`python -m bench`: run the scenarios, print the table (or one JSON object with --json).

Starts its own nats-server, servers and load generators on 127.0.0.1, runs every
scenario bounded in size and time, and stops everything it started. With --json the
JSON object is the only thing on stdout; progress and the table go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench import machine, report
from bench.control import WorkerError
from bench.harness import Harness, HarnessError
from bench.peers.scenarios import PEERS
from bench.processes import raise_fd_limit
from bench.scenarios import SCENARIOS
from bench.sizes import FULL, QUICK, SMOKE, Sizes

# Per scenario, all repetitions included; a hung scenario fails the run instead of hanging it.
SCENARIO_BUDGET_S = {"full": 900.0, "quick": 120.0, "smoke": 60.0}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes: under 2 minutes")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--repeat", type=int, default=3, help="repetitions, median reported (default 3)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample the hub with py-spy under load; stacks and summaries go to DIR",
    )
    parser.add_argument(
        "--scenario",
        nargs="+",
        choices=list(SCENARIOS),
        default=None,
        metavar="NAME",
        help=f"run only these ({', '.join(SCENARIOS)}); default all",
    )
    parser.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the peer scenarios (nchan, Pushpin, nginx static; bench/peers/) with the "
        "rest (default); --no-peers leaves them out unless named with --scenario. "
        "Set-up installs a missing peer with apt-get as root, except under --smoke",
    )
    parser.add_argument(
        "--cold-tasks",
        type=int,
        default=None,
        metavar="N",
        help="tasks in the bucket for cold_start (default: the size's, 100,000 in a full run); "
        "python -m bench --scenario cold_start --cold-tasks 1000000 is the 1M row",
    )
    parser.add_argument(
        "--upstream-seconds",
        type=float,
        default=None,
        metavar="S",
        help="seconds measured per side (direct, through the hub) in upstream_tasks (default: "
        "the size's, 30 in a full run)",
    )
    args = parser.parse_args(argv)
    if args.cold_tasks is not None and args.cold_tasks < 1:
        parser.error("--cold-tasks must be at least 1")
    if args.upstream_seconds is not None and args.upstream_seconds <= 0:
        parser.error("--upstream-seconds must be above 0")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


async def run(
    sizes: Sizes, names: list[str], repeat: int, profile_dir: Path | None
) -> tuple[report.Results, dict[str, str]]:
    """Every scenario's medians, and each peer that could not be measured with why."""
    results: report.Results = {}
    # SIGTERM cancels the run like Ctrl-C does, so every child is stopped and the work
    # dir removed on the way out.
    current = asyncio.current_task()
    assert current is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, current.cancel)
    # --smoke never installs a peer: the test suite measures whatever is already here.
    async with Harness(log, profile_dir, install_peers=sizes.name != "smoke") as harness:
        for name in names:
            log(f"{name}: {repeat} repetition(s) at {sizes.name} sizes")
            started = time.perf_counter()
            async with asyncio.timeout(SCENARIO_BUDGET_S[sizes.name] * repeat / 3 + 60):
                results[name] = await SCENARIOS[name](harness, sizes, repeat)
            log(f"{name}: done in {time.perf_counter() - started:.1f} s")
        return results, dict(harness.peers.skipped)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.cold_tasks is not None:
        sizes = dataclasses.replace(sizes, cold_tasks=args.cold_tasks)
    if args.upstream_seconds is not None:
        sizes = dataclasses.replace(sizes, ut_seconds=args.upstream_seconds)
    names = args.scenario or [name for name in SCENARIOS if args.peers or name not in PEERS]
    raise_fd_limit()  # inherited by every child: hub, raw ceiling, load generators
    about = machine.describe()
    load_before = machine.load_average()
    log(f"{about['cores']} cores, {about['python']}, sizes {sizes.name}")
    started = time.perf_counter()
    try:
        results, skipped = asyncio.run(run(sizes, names, args.repeat, args.profile))
    except (asyncio.CancelledError, KeyboardInterrupt):
        log("interrupted; every process this run started has been stopped")
        return 130
    except (HarnessError, WorkerError, TimeoutError, RuntimeError) as exc:
        log(f"failed: {type(exc).__name__}: {exc}")
        return 1
    command = "python -m bench " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    meta: dict[str, Any] = {
        "command": command.strip(),
        "sizes": sizes.name,
        "repeat": args.repeat,
        "seconds": time.perf_counter() - started,
        "load_before": load_before,
        "load_after": machine.load_average(),
        "skipped": skipped,
    }
    table = report.markdown(results, about, meta)
    if args.json:
        print(table, file=sys.stderr)
        sys.stdout.write(msgspec.json.encode(report.as_json(results, about, meta)).decode() + "\n")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
