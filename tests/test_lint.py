"""The house rules run with the tests: ruff (lint and format) and mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("hub", "bridge", "tests", "examples", "bench", "conformance", ".ci")


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "ruff", "check", *CHECKED],
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--check",
            *CHECKED,
        ],
        [sys.executable, "-m", "mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_tool_is_clean(command: list[str]) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
