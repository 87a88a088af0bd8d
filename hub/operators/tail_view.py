"""What `taskhub tail` shows: the operator stream's events folded into a view, and the view
drawn as a rich table, a plain line per change, or a JSON line per change.

All pure: events and the hub's clock in, state and renderables out, so every rule of
docs/dashboard.md ("Views shared by the page and `taskhub tail`") is unit-tested without a
hub. A reconnect sends the whole state again; it is gathered aside and replaces the view
at `synced`, so the screen never shows half a view and tasks gone meanwhile are removed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import msgspec
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from bridge.wire import TERMINAL, parse_timestamp

STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
STATUS_STYLES = {
    "working": "cyan",
    "input_required": "bold yellow",
    "completed": "green",
    "failed": "bold red",
    "cancelled": "magenta",
}
# docs/dashboard.md, "Views shared by the page and `taskhub tail`".
STUCK_POLLS = 10
STUCK_MIN_MS = 30_000
DEFAULT_POLL_MS = 1_000
EXPIRING_MS = 60_000
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
_FRACTION = re.compile(r"(\d+)\s*(?:/|\bof\b)\s*(\d+)")


# -- the stream's events, decoded once at the edge ----------------------------------------


class Filters(msgspec.Struct):
    server: list[str] = msgspec.field(default_factory=list)
    status: list[str] = msgspec.field(default_factory=list)
    owner: list[str] = msgspec.field(default_factory=list)


class Hello(msgspec.Struct):
    principal: str = ""
    operator: bool = False
    filters: Filters = msgspec.field(default_factory=Filters)
    silentAfterMs: int | None = None
    at: int | None = None


class TaskFields(msgspec.Struct):
    """The fields of a DetailedTask the view reads; the rest passes through as raw JSON."""

    taskId: str
    status: str
    createdAt: str
    lastUpdatedAt: str
    ttlMs: int | None = None
    statusMessage: str | None = None
    pollIntervalMs: int | None = None


class TaskEvent(msgspec.Struct, kw_only=True):
    owner: str | None = None
    server: str = ""
    task: msgspec.Raw


class Removed(msgspec.Struct):
    taskId: str


class FleetServer(msgspec.Struct):
    server: str
    silent: bool = False
    reason: str | None = None


class Fleet(msgspec.Struct):
    ready: bool = True
    at: int | None = None
    servers: list[FleetServer] = msgspec.field(default_factory=list)


class JsonTask(msgspec.Struct):
    event: str
    owner: str | None
    server: str
    task: msgspec.Raw


class JsonRemoved(msgspec.Struct):
    event: str
    taskId: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One task as the view holds it: typed fields for the rules, raw bytes for --json."""

    owner: str | None
    server: str
    fields: TaskFields
    raw: msgspec.Raw
    created_ms: float
    updated_ms: float

    @property
    def task_id(self) -> str:
        return self.fields.taskId

    @property
    def terminal(self) -> bool:
        return self.fields.status in TERMINAL


def decode_entry(data: str | bytes) -> Entry:
    """A `task` event's data; raises msgspec.ValidationError or ValueError if malformed."""
    event = msgspec.json.decode(data, type=TaskEvent)
    fields = msgspec.json.decode(event.task, type=TaskFields)
    created = parse_timestamp(fields.createdAt).timestamp() * 1000
    updated = parse_timestamp(fields.lastUpdatedAt).timestamp() * 1000
    return Entry(event.owner, event.server, fields, event.task, created, updated)


# -- the shared rules ----------------------------------------------------------------------


def progress(message: str | None) -> float | None:
    """A fraction 0..1 from `40%`, `12.5 %`, `3/10` or `3 of 10`; the first match counts."""
    if not message:
        return None
    matches = [m for m in (_PERCENT.search(message), _FRACTION.search(message)) if m]
    if not matches:
        return None
    first = min(matches, key=lambda m: m.start())
    if first.re is _PERCENT:
        return min(float(first.group(1)) / 100, 1.0)
    done, total = int(first.group(1)), int(first.group(2))
    return None if total == 0 else min(done / total, 1.0)


def is_stuck(entry: Entry, now_ms: float) -> bool:
    """Not terminal and unchanged for 10 poll intervals, and at least 30 s."""
    if entry.terminal:
        return False
    poll = entry.fields.pollIntervalMs or DEFAULT_POLL_MS
    return now_ms - entry.updated_ms >= max(STUCK_POLLS * poll, STUCK_MIN_MS)


def is_expiring(entry: Entry, now_ms: float) -> bool:
    """Not terminal and createdAt + ttlMs less than 60 s away."""
    ttl = entry.fields.ttlMs
    if entry.terminal or ttl is None:
        return False
    return entry.created_ms + ttl - now_ms < EXPIRING_MS


# -- the view ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskChanged:
    entry: Entry


@dataclass(frozen=True, slots=True)
class TaskRemoved:
    task_id: str


@dataclass(frozen=True, slots=True)
class SilenceChanged:
    server: str
    silent: bool
    reason: str | None


Change = TaskChanged | TaskRemoved | SilenceChanged


@dataclass(slots=True)
class View:
    """The tasks on screen and what is known about the stream; `only` keeps those ids."""

    only: frozenset[str] | None = None
    tasks: dict[str, Entry] = field(default_factory=dict)
    hello: Hello | None = None
    synced: bool = False  # the current connection has sent its whole state
    ever_synced: bool = False
    fleet: Fleet | None = None
    silent: dict[str, str | None] = field(default_factory=dict)
    seen_terminal: set[str] = field(default_factory=set)
    clock_offset_ms: float = 0.0  # the hub's clock minus ours
    connected: bool = False
    problem: str | None = None  # why the stream is down, while it is
    malformed: int = 0
    _incoming: dict[str, Entry] = field(default_factory=dict)

    def connect(self, hello: Hello, local_ms: float) -> None:
        """A (re)connected stream: its states are gathered until `synced`."""
        self.hello, self.synced, self.connected, self.problem = hello, False, True, None
        self._incoming = {}
        self._set_clock(hello.at, local_ms)

    def disconnect(self, problem: str) -> None:
        self.connected, self.synced, self.problem = False, False, problem
        self._incoming = {}

    def task(self, entry: Entry) -> list[Change]:
        if self.only is not None and entry.task_id not in self.only:
            return []
        if not self.synced:
            self._incoming[entry.task_id] = entry
            return []
        return self._put(entry)

    def removed(self, task_id: str) -> list[Change]:
        if not self.synced:
            self._incoming.pop(task_id, None)
            return []
        if self.tasks.pop(task_id, None) is None:
            return []
        return [TaskRemoved(task_id)]

    def sync(self) -> list[Change]:
        """`synced`: the gathered states replace the view; only differences are changes."""
        incoming, self._incoming = self._incoming, {}
        changes: list[Change] = [TaskRemoved(tid) for tid in self.tasks if tid not in incoming]
        for task_id in [tid for tid in self.tasks if tid not in incoming]:
            del self.tasks[task_id]
        self.synced = self.ever_synced = True
        for entry in incoming.values():
            changes += self._put(entry)
        return changes

    def fleet_update(self, fleet: Fleet, local_ms: float) -> list[Change]:
        self.fleet = fleet
        self._set_clock(fleet.at, local_ms)
        now_silent = {s.server: s.reason for s in fleet.servers if s.silent}
        changes: list[Change] = [
            SilenceChanged(server, True, reason)
            for server, reason in now_silent.items()
            if server not in self.silent
        ]
        changes += [SilenceChanged(s, False, None) for s in self.silent if s not in now_silent]
        self.silent = now_silent
        return changes

    def done(self) -> bool:
        """--until-done: every task in the view is terminal, or with --task, every named
        task has been seen terminal (one never seen stays awaited)."""
        if not self.ever_synced:
            return False
        if self.only is not None:
            return self.only <= self.seen_terminal
        return self.synced and all(entry.terminal for entry in self.tasks.values())

    def _put(self, entry: Entry) -> list[Change]:
        if self.tasks.get(entry.task_id) == entry:
            return []  # the same state again, as a reconnect sends it
        self.tasks[entry.task_id] = entry
        if entry.terminal:
            self.seen_terminal.add(entry.task_id)
        return [TaskChanged(entry)]

    def _set_clock(self, at: int | None, local_ms: float) -> None:
        if at is not None:
            self.clock_offset_ms = at - local_ms


# -- drawing ---------------------------------------------------------------------------------


def duration(ms: float) -> str:
    """12s, 3m04s, 2h05m: short enough for a table cell."""
    seconds = max(0, int(ms // 1000))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def markers(entry: Entry, now_ms: float) -> list[str]:
    return [
        name
        for name, rule in (("stuck", is_stuck), ("expiring", is_expiring))
        if rule(entry, now_ms)
    ]


def ordered(tasks: dict[str, Entry]) -> list[Entry]:
    """Live tasks first, then the rest; most recently updated first within each."""
    return sorted(tasks.values(), key=lambda e: (e.terminal, -e.updated_ms, e.task_id))


def counts(view: View) -> Text:
    tally = Counter(entry.fields.status for entry in view.tasks.values())
    text = Text(f"{len(view.tasks)} tasks")
    for status in STATUSES:
        if tally[status]:
            text.append("  ")
            text.append(f"{status} {tally[status]}", style=STATUS_STYLES[status])
    return text


def status_lines(view: View) -> list[Text]:
    lines: list[Text] = []
    if not view.connected:
        why = f" ({view.problem})" if view.problem else ""
        label = "disconnected — reconnecting" if view.ever_synced or view.problem else "connecting"
        lines.append(Text(label + why, style="bold red"))
    elif not view.synced:
        lines.append(Text("syncing…", style="yellow"))
    if view.fleet is not None and not view.fleet.ready:
        lines.append(Text("hub not ready: its view of NATS may be stale", style="yellow"))
    for server, reason in sorted(view.silent.items()):
        lines.append(Text(f"silent server {server}: {reason or 'no recent writes'}", "yellow"))
    return lines


def render(view: View, now_ms: float, *, max_rows: int = 40) -> RenderableType:
    """The live screen: status lines, counts per status, then one row per task."""
    operator = view.hello is not None and view.hello.operator
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    # Every column keeps its width on a narrow screen but the message, which is cut short.
    widths = {"status": 14, "task": 8, "server": 10, "owner": 9, "age": 5, "updated": 9}
    for column in ("status", "task", "server", *(["owner"] if operator else [])):
        table.add_column(column, no_wrap=True, min_width=widths[column])
    for column in ("age", "updated"):
        table.add_column(column, justify="right", no_wrap=True, min_width=widths[column])
    table.add_column("progress", no_wrap=True, min_width=12)
    table.add_column("", no_wrap=True, min_width=8)  # stuck, expiring
    table.add_column("message", max_width=60)  # the one column that may shrink
    rows = ordered(view.tasks)
    for entry in rows[:max_rows]:
        fields = entry.fields
        fraction = progress(fields.statusMessage)
        bar: RenderableType = (
            Text("") if fraction is None else ProgressBar(completed=fraction * 100, width=12)
        )
        table.add_row(
            Text(fields.status, style=STATUS_STYLES.get(fields.status, "")),
            fields.taskId[:8],
            entry.server,
            *([entry.owner or ""] if operator else []),
            duration(now_ms - entry.created_ms),
            duration(now_ms - entry.updated_ms) + " ago",
            bar,
            Text(" ".join(markers(entry, now_ms)), style="bold red"),
            Text(fields.statusMessage or "", no_wrap=True, overflow="ellipsis"),
        )
    parts: list[RenderableType] = [*status_lines(view), counts(view), table]
    if len(rows) > max_rows:
        parts.append(Text(f"… {len(rows) - max_rows} more", style="dim"))
    return Group(*parts)


def plain_line(change: Change, now_ms: float, *, owner: bool = False) -> str:
    """One line per change, for a pipe or a log file (no colours, no redraws)."""
    if isinstance(change, TaskRemoved):
        return f"removed {change.task_id}"
    if isinstance(change, SilenceChanged):
        if change.silent:
            return f"server {change.server} silent: {change.reason or 'no recent writes'}"
        return f"server {change.server} recovered"
    entry = change.entry
    fields = entry.fields
    parts = [fields.status, fields.taskId, f"server={entry.server}"]
    if owner:
        parts.append(f"owner={entry.owner}")
    fraction = progress(fields.statusMessage)
    if fraction is not None:
        parts.append(f"[{fraction:.0%}]")
    if fields.statusMessage:
        parts.append(repr(fields.statusMessage))
    parts += markers(entry, now_ms)
    return " ".join(parts)


_json = msgspec.json.Encoder()


def json_line(change: TaskChanged | TaskRemoved) -> bytes:
    """--json: the task event as the hub sent it, or the removal; one line, no newline."""
    if isinstance(change, TaskRemoved):
        return _json.encode(JsonRemoved("removed", change.task_id))
    entry = change.entry
    return _json.encode(JsonTask("task", entry.owner, entry.server, entry.raw))
