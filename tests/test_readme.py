"""README.md and docs/ against the real CLI: every `taskhub serve` flag they name exists,
and every flag `taskhub serve --help` lists has a row in docs/configuration.md's table.

The README once promised a `--send-timeout` that did not exist. Flags of other commands
(`python -m bench --quick`, `pip install --no-deps .`, `mypy --strict`) are told apart by
the command they follow; the few named bare in prose are listed in OTHER_COMMANDS. The
set-up's first command runs here as written, up to its install, and .ci/run installs and
tests as it does.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.commands.cli import main

ROOT = Path(__file__).resolve().parent.parent
USER_PAGES = (
    "index",
    "configuration",
    "endpoint",
    "bridge",
    "production",
    "security",
    "performance",
    "scaling",
)
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
# The README and the docs pages a user reads for the commands to run.
PAGES = [README, *(ROOT / "docs" / f"{name}.md" for name in USER_PAGES)]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
SERVE = re.compile(r"\btaskhub serve\b")
# Flags of other commands that the README names in prose without their command.
# README "Set up and test", as a newcomer types it from the repository root.
SET_UP = ["python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]'", "pytest"]
OTHER_COMMANDS = {
    "--upgrade": "uv pip compile (Reproducible installs)",
    "--shutdown-grace": "the examples/fleet servers (Task tools for the mcp SDK)",
}


def cli_flags(command: str = "serve") -> set[str]:
    """The long options of `taskhub <command>`, read from its --help as a user sees them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    options = re.findall(r"^ {2}(?:-\w, )?(--[a-z][a-z0-9-]*)", out.getvalue(), re.MULTILINE)
    return set(options) - {"--help"}


def commands(text: str) -> Iterator[str]:
    """Every command the README shows: code-block lines and inline code spans outside them,
    each split at `&&`, `;` and `|`. Flags in plain prose are an error: whose are they?"""
    prose = FENCE.sub("", text)
    for block in FENCE.findall(text):
        for line in block.splitlines():
            yield from re.split(r"&&|;|\|", line)
    for span in CODE_SPAN.findall(prose):
        yield from re.split(r"&&|;|\|", span)
    stray = FLAG.findall(CODE_SPAN.sub("", prose))
    assert not stray, f"README names flags outside code spans: {stray}"


def serve_flags_named(text: str) -> set[str]:
    """Flags the README gives to `taskhub serve`: after that command, or bare in a code span."""
    named: set[str] = set()
    for command in commands(text):
        serve = SERVE.search(command)
        if serve is not None:
            named.update(FLAG.findall(command[serve.end() :].split("#")[0]))
        elif command.strip().startswith("--"):
            flag = FLAG.match(command.strip())
            if flag is not None and flag.group() not in OTHER_COMMANDS:
                named.add(flag.group())
        # Anything else is another command (pip, uv, python -m bench, mypy): not ours.
    return named


def flags_given_to(command: str, text: str) -> set[str]:
    """Flags the README writes after `taskhub <command>` in a command."""
    pattern = re.compile(rf"\btaskhub {command}\b")
    named: set[str] = set()
    for line in commands(text):
        found = pattern.search(line)
        if found is not None:
            named.update(FLAG.findall(line[found.end() :].split("#")[0]))
    return named


def table_flags(text: str) -> list[str]:
    """The first column of the configuration table."""
    return re.findall(r"^\| `(--[a-z][a-z0-9-]*)` \|", text, re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_serve_flag_the_readme_names_exists(page: Path) -> None:
    named = serve_flags_named(page.read_text())
    if page == README:
        assert "--send-timeout" in named and "--nats-url" in named  # prose and commands count
    assert named - cli_flags() == set(), f"{page.name} names flags `taskhub serve` lacks"


@pytest.mark.parametrize("command", ["tail", "demo"])
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_flag_the_readme_gives_tail_and_demo_exists(command: str, page: Path) -> None:
    named = flags_given_to(command, page.read_text())
    assert named - cli_flags(command) == set(), f"{page.name} names flags `taskhub {command}` lacks"


def test_the_configuration_table_lists_every_flag_once() -> None:
    table = table_flags(CONFIGURATION.read_text())
    assert len(table) == len(set(table)), "a flag has two rows"
    flags = cli_flags()
    assert flags - set(table) == set(), "flags missing from docs/configuration.md's table"
    assert set(table) - flags == set(), "table rows for flags `taskhub serve` lacks"


def test_the_set_up_makes_and_enters_a_virtual_environment(tmp_path: Path) -> None:
    """A stock Debian or Ubuntu Python refuses `pip install` outside a virtual environment
    and has no `python` command, so the first command makes one and enters it. It runs here
    as written up to the install, which is asked where pip and python now are instead; CI
    makes a venv of its own (`enter_venv` in .ci/run), then installs and tests the same way.
    """
    section = README.read_text().split("## Set up and test", 1)[1]
    block = FENCE.search(section)
    assert block is not None
    assert block.group(1).splitlines() == SET_UP, "README's set-up is not the two commands"
    make_and_enter, install = SET_UP[0].rsplit(" && ", 1)
    probe = "python -c 'import sys; print(sys.prefix)' && pip --version"
    done = subprocess.run(
        ["sh", "-c", f"{make_and_enter} && {probe}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    prefix, pip = done.stdout.splitlines()
    venv = tmp_path / ".venv"
    assert Path(prefix) == venv and str(venv) in pip
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    start = ci.index("enter_venv newest")
    assert ci[start + 1 : start + 4] == [
        install,
        "show_versions newest",
        "pytest || failed+=(newest)",
    ]


def test_other_commands_flags_do_not_count() -> None:
    text = """
```sh
python -m bench --quick          # the --json flag prints JSON
pip install --no-deps . && taskhub serve --port 1 | tee log
```
Run `taskhub serve --host 0.0.0.0` or `python -m examples.fleet.run --decline`; `--workers N`,
`mypy --strict`, and uv's `--upgrade`.
"""
    assert serve_flags_named(text) == {"--port", "--host", "--workers"}
    with pytest.raises(AssertionError, match="outside code spans"):
        serve_flags_named("add --seed 1 to repeat")
