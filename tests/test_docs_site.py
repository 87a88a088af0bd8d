"""The docs site: `mkdocs build --strict` over docs/ succeeds, and its checks bite.

mkdocs.yml raises every link, anchor and nav check to a warning, and strict mode fails
on a warning: a link to a missing page or heading, or a page in docs/ that the nav leaves
out, fails the build. mkdocs 1.6 cannot tell a link out of docs/ (`../deploy/README.md`)
from a link to a missing page (both are `validation.links.not_found`), so the pages name
files outside docs/ as code spans (`deploy/README.md`), as they name `hub/*.py`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"


def nav_pages(nav: Any) -> Iterator[str]:
    """Every page path the nav names, at any depth."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner, not ours
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(CONFIG)]
    done = subprocess.run(
        [*command, "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "scaling" / "index.html").is_file()


def test_every_page_is_in_the_nav_once() -> None:
    config = load_config(str(CONFIG))
    named = list(nav_pages(config["nav"]))
    pages = sorted(page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md"))
    assert sorted(named) == pages, "mkdocs.yml's nav and docs/*.md differ"
    assert config["strict"] and config["validation"]["nav"]["omitted_files"] == logging.WARNING


def test_a_broken_link_anchor_or_nav_fails_the_build(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The project's settings over three pages, each breaking one check on purpose."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[a page](a.md) and [its heading](a.md#a-heading)\n")
    (docs / "a.md").write_text(
        "# A\n\n## A heading\n\n[gone](missing.md), [no such heading](index.md#nowhere),"
        " [out of docs](../deploy/README.md)\n"
    )
    (docs / "orphan.md").write_text("# Not in the nav\n")
    config = load_config(
        str(CONFIG),
        docs_dir=str(docs),
        site_dir=str(tmp_path / "site"),
        nav=[{"Home": "index.md"}, {"A": "a.md"}],
    )
    with caplog.at_level(logging.WARNING, logger="mkdocs"), pytest.raises(Abort):
        build(config)
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "'missing.md'" in warnings
    assert "'#nowhere'" in warnings
    assert "'../deploy/README.md'" in warnings
    assert "orphan.md" in warnings
    assert "a-heading" not in warnings  # GitHub's anchor for "A heading" is the site's too
