"""`python -m tests.chaos --seed N --duration S` (or `--soak`): see tests/chaos/README.md."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path

from tests.chaos.report import table
from tests.chaos.run import Options, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="fault plan and workload seed")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of workload")
    parser.add_argument(
        "--tasks", type=int, default=None, help="tasks to write (default 600; soak: one per second)"
    )
    parser.add_argument("--streams", type=int, default=72, help="listen streams")
    parser.add_argument(
        "--soak",
        action="store_true",
        help="soak profile: a fault every 150-240 s, steady writes, samples",
    )
    parser.add_argument("--out", type=Path, default=None, help="logs and report (default: tmp)")
    args = parser.parse_args(argv)
    tasks = (
        args.tasks
        if args.tasks is not None
        else (max(600, int(args.duration)) if args.soak else 600)
    )
    out = args.out or Path(tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    options = Options(args.seed, args.duration, tasks, args.streams, args.soak, out)
    # SIGTERM as Ctrl-C: the run is cancelled and its teardown stops every process it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result = asyncio.run(run(options))
    print(table(result))
    print(f"report: {out / 'report.json'}  history: {out / 'history.json'}  logs: {out / 'procs'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
