"""What `pip install .` (the image in deploy/, a non-editable install) gets: every module
and asset of the shipped packages, subpackages included. An editable install hides a
missing one, since it imports from the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("hub", "bridge", "bench")


@pytest.mark.timeout(120)
def test_the_wheel_holds_every_module_and_asset(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("taskhub-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        path.relative_to(ROOT).as_posix()
        for package in SHIPPED
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert wanted - packed == set()
