"""A short seeded chaos run (tests/chaos): real 3-node cluster, two hubs, faults, checks.

Seed 7's plan pauses a NATS node, cuts a follower off from the other nodes (a silent
partition) and kills a node; every invariant must hold. The full-size run and the soak
are command lines (tests/chaos/README.md).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.chaos import plan

ROOT = Path(__file__).resolve().parent.parent


def test_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    args = ["--seed", "7", "--duration", "20", "--tasks", "120", "--streams", "24"]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos", *args, "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        # SIGINT cancels the run, whose teardown stops every process it started.
        child.send_signal(signal.SIGINT)
        try:
            stdout, stderr = child.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
        raise AssertionError(f"the chaos run did not finish in 100 s\n{stdout[-4000:]}") from None
    summary = stdout[-6000:]
    assert child.returncode == 0, summary + stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["ok"], summary
    assert all(c["violations"] == 0 for c in report["invariants"].values()), summary
    assert any(f["kind"] in plan.NATS_KINDS for f in report["faults"]), summary
    assert any(f["kind"] in plan.PARTITION_KINDS for f in report["faults"]), summary
    assert report["writes"]["tasks"] + report["writes"]["unknown_creates"] == 120, summary
