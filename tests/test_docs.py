"""Every citation in the repository resolves to a heading in docs/.

Code and docs cite protocol rules as `H<n>`, decisions as `D<n>` (headings of
docs/protocol.md), "invariant N" and "contract N" (headings of docs/architecture.md), and
headings by link (`docs/<file>.md#<anchor>`, GitHub's heading slugs). The checker is a few
pure functions over file texts; the unit tests below break a citation of each kind on
purpose and expect it reported, and the last test runs the checker on the repository.

Only RFC sections may be cited with a section sign (`RFC 9110 §8.6`): the protocol digest
the code once cited by section is not part of the repository, and neither are the other
documents named in `RETIRED`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (
    "README.md",
    "bench",
    "bridge",
    "conformance",
    "deploy",
    "docs",
    "examples",
    "hub",
    "tests",
)
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__"})
SKIPPED_FILES = frozenset({"package-lock.json"})
PROTOCOL = "docs/protocol.md"
ARCHITECTURE = "docs/architecture.md"

SECTION = "\u00a7"
# Names of documents that are not in the repository (spelled apart: this file is scanned too).
RETIRED = ("DESIGN" + ".md", "wire" + " digest", "spec" + " digest", "mcp-tasks" + "-wire")

# Upper case only: `h2` (the HTTP/2 library) and `H2O` are no tags. Not inside base64 runs.
_TAG = re.compile(r"(?<![\w+=])([HD])(\d+)(?![\w+=])")
_NUMBERED = re.compile(
    r"\b(invariant|contract)s?\s+(\d+(?:\s*(?:,|and|or|&|–|-)\s*\d+)*)\b", re.IGNORECASE
)
_DOCS_LINK = re.compile(r"\bdocs/([\w.-]+\.md)(?:#([\w-]*))?")
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
_RFC_SECTIONS = re.compile(
    rf"\bRFC ?\d+ {SECTION}[\w.]+(?:\s*(?:/|,)\s*{SECTION}[\w.]+)*", re.IGNORECASE
)
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


# -- the checker ----------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(markdown: str) -> list[tuple[int, str]]:
    """(level, text) of every heading, outside fenced code blocks."""
    found: list[tuple[int, str]] = []
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append((len(match.group(1)), match.group(2)))
    return found


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a document, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for _, heading in headings(markdown):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def numbered_headings(markdown: str, word: str) -> set[int]:
    """N of every `### <word> N ...` heading (`### H12 — ...`, `### Invariant 2 — ...`)."""
    pattern = re.compile(rf"{re.escape(word)} ?(\d+)\b")
    return {
        int(m.group(1))
        for level, text in headings(markdown)
        if level == 3 and (m := pattern.match(text))
    }


def _links(path: str, line: str) -> Iterator[tuple[str, str | None]]:
    """(docs file, anchor or None) for every link into docs/ on `line` of `path`."""
    for match in _DOCS_LINK.finditer(line):
        yield f"docs/{match.group(1)}", match.group(2) or None
    if not path.startswith("docs/"):
        return
    for match in _MD_LINK.finditer(line):  # relative links between the docs themselves
        target = match.group(1)
        if "://" in target or target.startswith(("mailto:", "../", "/")) or "docs/" in target:
            continue
        name, _, anchor = target.partition("#")
        if name and not name.endswith(".md"):
            continue
        yield (f"docs/{name}" if name else path), anchor or None


def broken_citations(texts: Mapping[str, str], protocol_md: str, architecture_md: str) -> list[str]:
    """`path:line: citation (why)` for every citation in `texts` that does not resolve.

    `texts` maps repository paths to file contents; links into docs/ are resolved against
    the `docs/*.md` entries among them.
    """
    tags = {word: numbered_headings(protocol_md, word) for word in ("H", "D")}
    numbered = {
        "invariant": numbered_headings(architecture_md, "Invariant"),
        "contract": numbered_headings(architecture_md, "Contract"),
    }
    doc_anchors = {p: anchors(text) for p, text in texts.items() if p.startswith("docs/")}
    problems: list[str] = []
    for path in sorted(texts):
        for number, line in enumerate(texts[path].splitlines(), 1):
            where = f"{path}:{number}"
            for match in _TAG.finditer(line):
                kind, n = match.group(1), int(match.group(2))
                if n not in tags[kind]:
                    problems.append(f"{where}: {match.group(0)} (no '### {kind}{n} ' heading)")
            for match in _NUMBERED.finditer(line):
                kind = match.group(1).lower()
                for n in map(int, re.findall(r"\d+", match.group(2))):
                    if n not in numbered[kind]:
                        heading = f"### {kind.capitalize()} {n}"
                        problems.append(f"{where}: {match.group(0)} (no '{heading}' heading)")
            for doc, anchor in _links(path, line):
                if doc not in doc_anchors:
                    problems.append(f"{where}: {doc} (no such file)")
                elif anchor is not None and anchor not in doc_anchors[doc]:
                    problems.append(f"{where}: {doc}#{anchor} (no such heading)")
            if SECTION in _RFC_SECTIONS.sub("", line):
                problems.append(
                    f"{where}: {line.strip()} (a section sign outside 'RFC n {SECTION}x')"
                )
            lowered = line.lower()
            for name in RETIRED:
                if name.lower() in lowered:
                    problems.append(f"{where}: {name} (not in the repository)")
    return problems


def repository_texts(root: Path = ROOT) -> dict[str, str]:
    """The text files the checker reads, by path relative to `root`."""
    texts: dict[str, str] = {}
    for top in SCANNED:
        start = root / top
        files = [start] if start.is_file() else sorted(start.rglob("*"))
        for file in files:
            relative = file.relative_to(root)
            parts = relative.parts[:-1]
            if not file.is_file() or file.name in SKIPPED_FILES:
                continue
            if any(part in SKIPPED_DIRS or part.startswith(".") for part in parts):
                continue
            data = file.read_bytes()
            if b"\0" in data:
                continue
            try:
                texts[relative.as_posix()] = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
    return texts


# -- the checker's own tests ----------------------------------------------------------------

PROTOCOL_MD = """# Protocol
## Validation order
### H1 — One endpoint
### H13 — Mcp-Name matches
### D7 — Expired tasks are gone
```
### H9 — inside a code block, not a heading
```
"""
ARCHITECTURE_MD = """# Architecture
### Invariant 1 — Found everywhere
### Invariant 2 — Final states arrive
### Contract 3 — The NATS wire format
## Fan-out
## Fan-out
"""


def check(text: str, path: str = "hub/example.py") -> list[str]:
    """What the checker reports about `text` at `path`, beside the two sample docs above."""
    texts = {PROTOCOL: PROTOCOL_MD, ARCHITECTURE: ARCHITECTURE_MD, path: text}
    problems = broken_citations(texts, PROTOCOL_MD, ARCHITECTURE_MD)
    return [problem for problem in problems if problem.startswith(f"{path}:")]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "H13 — Mcp-Name must equal the taskId on tasks/*",
            "h13--mcp-name-must-equal-the-taskid-on-tasks",
        ),
        (
            "Invariant 3 — Nothing leaks about others' tasks",
            "invariant-3--nothing-leaks-about-others-tasks",
        ),
        ("`server/discover` result", "serverdiscover-result"),
        ("uvicorn internals, on purpose", "uvicorn-internals-on-purpose"),
        ("Watch and catch-up", "watch-and-catch-up"),
    ],
)
def test_slugs_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_duplicate_headings_are_numbered_and_code_blocks_skipped() -> None:
    assert {"fan-out", "fan-out-1"} <= anchors(ARCHITECTURE_MD)
    assert numbered_headings(PROTOCOL_MD, "H") == {1, 13}


def test_resolving_citations_pass() -> None:
    text = "\n".join(
        [
            "# H1, H13 and D7; a range H1–H13; H1/H13",
            "# invariant 1, Invariants 1 and 2, contract 3's envelope, contracts 3, 3",
            "# docs/protocol.md, docs/protocol.md#validation-order, docs/architecture.md#"
            + "fan-out-1",
            "# RFC 9110 \u00a78.6, RFC 7519 \u00a74.1.4/\u00a74.1.5, rfc 6750 \u00a73",
            "# not tags: h2, HTTP/2, H2O, SHA256, base64 ab+H9=, D3js, an invariant of the cache",
        ]
    )
    assert check(text) == []


@pytest.mark.parametrize(
    ("text", "reported"),
    [
        ("# H2: GET is refused", "H2 (no '### H2 ' heading)"),
        ("# see D18", "D18 (no '### D18 ' heading)"),
        ("# H1–H15", "H15 (no '### H15 ' heading)"),
        ("# invariant 5", "invariant 5 (no '### Invariant 5' heading)"),
        ("# Invariants 2 and 4", "Invariants 2 and 4 (no '### Invariant 4' heading)"),
        ("# contract 2", "contract 2 (no '### Contract 2' heading)"),
        ("# docs/" + "guide.md", "/guide.md (no such file)"),
        ("# docs/protocol.md#" + "nowhere", "/protocol.md#nowhere (no such heading)"),
        ("# (" + "\u00a78 item 18)", "(a section sign outside 'RFC n \u00a7x')"),
        ("# the order of \u00a72.5", "(a section sign outside 'RFC n \u00a7x')"),
        ("# RFC 9110 \u00a715.5.9 and \u00a72.5", "(a section sign outside 'RFC n \u00a7x')"),
        (f"# ({RETIRED[0]})", f"{RETIRED[0]} (not in the repository)"),
        (f"# the {RETIRED[1].title()}", f"{RETIRED[1]} (not in the repository)"),
        (f"# the {RETIRED[2]}", f"{RETIRED[2]} (not in the repository)"),
        (f"# spec/{RETIRED[3]}.md", f"{RETIRED[3]} (not in the repository)"),
    ],
)
def test_a_broken_citation_is_reported_with_its_place(text: str, reported: str) -> None:
    problems = check("ok\n" + text)
    assert len(problems) == 1, problems
    assert problems[0].startswith("hub/example.py:2: ")
    assert problems[0].endswith(reported)


@pytest.mark.parametrize(
    ("text", "reported"),
    [
        ("[x](architecture.md#nowhere)", "/architecture.md#nowhere (no such heading)"),
        ("[x](#nowhere)", "/guide.md#nowhere (no such heading)"),
        ("[x](missing.md)", "/missing.md (no such file)"),
    ],
)
def test_links_between_docs_are_checked(text: str, reported: str) -> None:
    fine = "[fine](#guide) [fine](architecture.md#fan-out) [fine](https://example.com/#x)"
    guide = PROTOCOL.replace("protocol", "guide")
    problems = check(f"# Guide\n{text}\n{fine}", guide)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{guide}:2: docs")
    assert problems[0].endswith(reported)


def test_repository_texts_skip_binaries_and_dependencies(tmp_path: Path) -> None:
    (tmp_path / "hub" / "__pycache__").mkdir(parents=True)
    (tmp_path / "hub" / "a.py").write_text("# H1\n")
    (tmp_path / "hub" / "blob.bin").write_bytes(b"H\x002")
    (tmp_path / "hub" / "__pycache__" / "a.pyc").write_text("H9")
    (tmp_path / "tests" / "ts" / "node_modules" / "x").mkdir(parents=True)
    (tmp_path / "tests" / "ts" / "node_modules" / "x" / "y.js").write_text("// H9")
    (tmp_path / "tests" / "ts" / "package-lock.json").write_text('{"v": "H9"}')
    (tmp_path / "README.md").write_text("# readme\n")
    assert repository_texts(tmp_path) == {"README.md": "# readme\n", "hub/a.py": "# H1\n"}


# -- the repository ---------------------------------------------------------------------------


def test_every_citation_in_the_repository_resolves() -> None:
    texts = repository_texts()
    assert PROTOCOL in texts and ARCHITECTURE in texts
    problems = broken_citations(texts, texts[PROTOCOL], texts[ARCHITECTURE])
    assert not problems, f"{len(problems)} citations do not resolve:\n" + "\n".join(problems)


# -- the module table (docs/architecture.md, "Modules") ------------------------------------

_MODULE_ROW = re.compile(r"^\| `((?:hub|bridge)/[^`]+\.py)` \|", re.M)


def tabled_modules(architecture: str) -> set[str]:
    """The modules the "Modules" section's tables name (a package's face may be named too)."""
    section = architecture.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return {module for module in _MODULE_ROW.findall(section) if not module.endswith("__init__.py")}


def package_modules(root: Path) -> set[str]:
    """Every module under hub/ and bridge/ but the packages' `__init__.py`."""
    return {
        path.relative_to(root).as_posix()
        for package in ("hub", "bridge")
        for path in (root / package).rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def test_the_module_tables_name_every_module_and_only_those() -> None:
    tabled = tabled_modules((ROOT / "docs" / "architecture.md").read_text())
    present = package_modules(ROOT)
    assert not present - tabled, f"missing from docs/architecture.md: {sorted(present - tabled)}"
    assert not tabled - present, f"gone, still in docs/architecture.md: {sorted(tabled - present)}"


def test_the_module_table_check_sees_a_missing_and_a_gone_module(tmp_path: Path) -> None:
    (tmp_path / "hub" / "store").mkdir(parents=True)
    (tmp_path / "bridge").mkdir()
    for name in ("hub/__init__.py", "hub/store/cache.py", "hub/new.py", "bridge/wire.py"):
        (tmp_path / name).write_text("")
    doc = "# A\n\n## Modules\n\n| `hub/store/cache.py` | x |\n| `hub/old.py` | y |\n" + (
        "| `bridge/wire.py` | z |\n\n## Lifecycles\n\n| `hub/later.py` | not this section |\n"
    )
    tabled, present = tabled_modules(doc), package_modules(tmp_path)
    assert present - tabled == {"hub/new.py"}
    assert tabled - present == {"hub/old.py"}
