"""What `pip install .` (the image in deploy/, a non-editable install) gets: every module
and asset of the shipped packages, subpackages included, and nothing else at top level.
An editable install hides a missing module, since it imports from the source tree; a
top-level `bench` beside them would collide with any other project's `bench`.

The wheel is built from a copy of the sources: setuptools packs whatever an earlier build
left in `build/lib/`, so a build in the repository could hold a package no longer shipped.
.ci/wheel_check.py installs the wheel alone and runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("hub", "bridge")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of pyproject.toml and README.md beside every top-level package here
    (bench, tests, examples, … included, so that leaving them out is what is tested)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in ROOT.glob("*/__init__.py"):
        shutil.copytree(
            package.parent,
            source / package.parent.name,
            ignore=shutil.ignore_patterns("__pycache__", "node_modules"),
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = tmp.glob("taskhub-*.whl")
    return zipfile.ZipFile(built)


@pytest.mark.timeout(120)
def test_the_wheel_holds_every_module_and_asset(wheel: zipfile.ZipFile) -> None:
    packed = set(wheel.namelist())
    wanted = {
        path.relative_to(ROOT).as_posix()
        for package in SHIPPED
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert wanted - packed == set()


@pytest.mark.timeout(120)
def test_the_wheel_holds_the_shipped_packages_alone(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    (dist_info,) = (top for top in tops if top.endswith(".dist-info"))
    assert tops - {dist_info} == set(SHIPPED)
    assert wheel.read(f"{dist_info}/top_level.txt").decode().split() == sorted(SHIPPED)
