"""The NATS wire format shared by every task writer and the hub (contract 3, docs/architecture.md).

Values are decoded here, once, at the edge: a reader gets a typed `Envelope` or an
`InvalidEnvelope` naming what was wrong, never a half-checked dict. Any language can
write this format; the hub trusts nothing it reads.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

DEFAULT_BUCKET = "mcp-tasks"
CONTROL_STREAM = "MCP_TASKS_CTL"
CONTROL_SUBJECT_PREFIX = "mcp.tasks.ctl."

TASK_ID_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
SERVER_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

Status = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

# JSON-safe integers (the schema's ±(2^53−1)); negative durations are refused at ingest.
_MAX_SAFE = 2**53 - 1
NonNegative = Annotated[int, Meta(ge=0, le=_MAX_SAFE)]


def kv_stream(bucket: str) -> str:
    """The JetStream stream that backs a KV bucket."""
    return f"KV_{bucket}"


def kv_subject(bucket: str, task_id: str) -> str:
    return f"$KV.{bucket}.{task_id}"


def control_subject(server: str) -> str:
    return f"{CONTROL_SUBJECT_PREFIX}{server}"


def is_task_id(value: object) -> bool:
    return isinstance(value, str) and TASK_ID_RE.fullmatch(value) is not None


def control_message_id(request_id: bytes, principal: str, data: bytes) -> str:
    """The `Nats-Msg-Id` of a forwarded update or cancel: the same request retried (same
    JSON-encoded id, caller and message) is stored once by JetStream's de-duplication."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (request_id, principal.encode(), data):
        digest.update(len(part).to_bytes(4, "big") + part)
    return digest.hexdigest()


# A KV delete or purge, by a client: the `KV-Operation` header.
_REMOVED_OPS = frozenset({"DEL", "PURGE"})
# A marker the server leaves when a message TTL, a limit or a purge removed the value
# (nats-server 2.11+); its reason ("MaxAge", "Purge", "Remove", ...) does not matter:
# a marker never carries a task.
_MARKER_REASON = "Nats-Marker-Reason"


def is_removal(headers: dict[str, str] | None) -> bool:
    """True when a KV message removes its key's task rather than storing one."""
    if not headers:
        return False
    return headers.get("KV-Operation") in _REMOVED_OPS or _MARKER_REASON in headers


class TaskError(Struct, omit_defaults=True):
    """A JSON-RPC error object, as carried by a `failed` task."""

    code: int
    message: str
    data: Any = UNSET


class DetailedTask(Struct, omit_defaults=True):
    """What `tasks/get` returns, minus `resultType` and `_meta` (docs/protocol.md#task-state).

    Field order is the wire order. `ttlMs` has no default so it is always present
    (`null` = unlimited); the variant fields are omitted when unset.
    """

    taskId: str
    status: Status
    createdAt: str
    lastUpdatedAt: str
    ttlMs: NonNegative | None
    statusMessage: str | UnsetType = UNSET
    pollIntervalMs: NonNegative | UnsetType = UNSET
    inputRequests: dict[str, dict[str, Any]] | UnsetType = UNSET
    result: dict[str, Any] | UnsetType = UNSET
    error: TaskError | UnsetType = UNSET


class Envelope(Struct):
    """The KV value: who owns the task, which server runs it, and its full state.

    Unknown envelope fields are ignored by readers (room to grow).
    """

    owner: str
    server: str
    task: DetailedTask


class InvalidEnvelope(ValueError):
    """A KV value that breaks contract 3; the reason is safe to log."""


class KeyMismatch(InvalidEnvelope):
    """A well-formed value stored under another task's key."""


_envelope_decoder = msgspec.json.Decoder(Envelope)
# Server ids already found valid: a fleet has a few, each in many values. Bounded, since
# a hostile writer could name a new one in each value.
VALID_SERVERS_KEPT = 4096
_valid_servers: set[str] = set()
_encoder = msgspec.json.Encoder()


# A value's JSON: the encoder's own method (no wrapper's call, once per value the hub reads).
encode = _encoder.encode


def parse_timestamp(value: str) -> datetime:
    """Parse an ISO 8601 timestamp; it must name its time zone."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no time zone")
    return parsed


def expires_at(created_at: str, ttl_ms: int | None) -> float | None:
    """Epoch seconds at which a task with this `createdAt` and `ttlMs` expires; None for
    an unlimited one."""
    return _expiry(parse_timestamp(created_at), ttl_ms)


def _expiry(created: datetime, ttl_ms: int | None) -> float | None:
    # A float: a legal ttlMs (up to 2**53 - 1) can pass datetime's year 9999.
    return None if ttl_ms is None else created.timestamp() + ttl_ms / 1000


# Each status carries exactly its own variant field (H39): which of inputRequests, result
# and error it must have.
_VARIANTS = ("inputRequests", "result", "error")
_CARRIES = {
    "working": (False, False, False),
    "input_required": (True, False, False),
    "completed": (False, True, False),
    "failed": (False, False, True),
    "cancelled": (False, False, False),
}


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One stored revision of a task: the KV stream sequence and the envelope's contents."""

    task_id: str
    revision: int
    owner: str
    server: str
    task: DetailedTask


def check_task(task: DetailedTask, *, id_syntax: bool = True) -> None:
    """Raise InvalidEnvelope unless `task` is a well-formed DetailedTask variant; an
    upstream's own task (hub/front_door/kept_tasks.py) may name itself outside our id syntax."""
    _checked_created_at(task, id_syntax)


def _checked_created_at(task: DetailedTask, id_syntax: bool = True) -> datetime:
    """check_task, returning the createdAt it parsed.

    The usual case is checked here without calls (`is_task_id`, `parse_timestamp`): it runs
    for every value the hub reads, a million times in a first read at a million tasks."""
    if id_syntax and TASK_ID_RE.fullmatch(task.taskId) is None:
        raise InvalidEnvelope("taskId does not match [A-Za-z0-9_-]{16,128}")
    try:
        created = datetime.fromisoformat(task.createdAt)
        # A task's first revision was last updated when it was created: parsed once.
        updated = (
            created
            if task.lastUpdatedAt == task.createdAt
            else datetime.fromisoformat(task.lastUpdatedAt)
        )
        zoned = created.tzinfo is not None and updated.tzinfo is not None
    except ValueError:
        zoned = False
    if not zoned:  # parse_timestamp's rule says which field is wrong, and why
        for field in ("createdAt", "lastUpdatedAt"):
            try:
                parse_timestamp(getattr(task, field))
            except ValueError as exc:
                raise InvalidEnvelope(f"{field} is not an ISO 8601 timestamp: {exc}") from None
    carried = (task.inputRequests is not UNSET, task.result is not UNSET, task.error is not UNSET)
    wanted = _CARRIES[task.status]
    if carried != wanted:
        for name, present, expected in zip(_VARIANTS, carried, wanted, strict=True):
            if expected and not present:
                raise InvalidEnvelope(f"status {task.status!r} requires {name!r}")
            if present and not expected:
                raise InvalidEnvelope(f"status {task.status!r} must not carry {name!r}")
    return created


def decode_envelope(key: str, data: bytes) -> Envelope:
    """Decode and validate one KV value stored under `key`."""
    return decode_stored(key, data)[0]


def decode_stored(key: str, data: bytes) -> tuple[Envelope, float | None]:
    """`decode_envelope`, and the task's `expires_at` from the same parse of createdAt."""
    try:
        envelope = _envelope_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidEnvelope(str(exc)) from None
    if not envelope.owner:
        raise InvalidEnvelope("owner is empty")
    server = envelope.server
    if server not in _valid_servers:
        if SERVER_ID_RE.fullmatch(server) is None:
            raise InvalidEnvelope("server does not match [A-Za-z0-9_-]{1,64}")
        if len(_valid_servers) >= VALID_SERVERS_KEPT:
            _valid_servers.clear()
        _valid_servers.add(server)
    task = envelope.task
    created = _checked_created_at(task)
    if task.taskId != key:
        raise KeyMismatch("taskId does not match its key")
    return envelope, _expiry(created, task.ttlMs)


class UpdateMessage(Struct, tag_field="op", tag="update"):
    """hub → server: a client's answers to outstanding input requests."""

    taskId: str
    inputResponses: dict[str, Any]
    principal: str


class CancelMessage(Struct, tag_field="op", tag="cancel"):
    """hub → server: a client asked to cancel the task (cooperative)."""

    taskId: str
    principal: str


ControlMessage = UpdateMessage | CancelMessage
_control_decoder = msgspec.json.Decoder(ControlMessage)


def decode_control(data: bytes) -> ControlMessage:
    try:
        return _control_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidEnvelope(str(exc)) from None


# -- fleet change events (core NATS, not stored): docs/fleet-events.md ------------------------

EVENT_SUBJECT_PREFIX = "mcp.events."
SERVICE_RE = SERVER_ID_RE  # a service names the upstream its servers stand behind
# The subject's last two tokens → (the hub's short name for the kind, the notification a
# listen stream gets). The one table of event kinds.
EVENT_KINDS: dict[str, tuple[str, str]] = {
    "tools.list_changed": ("tools", "notifications/tools/list_changed"),
    "prompts.list_changed": ("prompts", "notifications/prompts/list_changed"),
    "resources.list_changed": ("resources", "notifications/resources/list_changed"),
    "resources.updated": ("resource", "notifications/resources/updated"),
}
MAX_URI_BYTES = 8192


def event_subject(service: str, kind: str) -> str:
    """`mcp.events.<service>.<kind>`, kind one of `EVENT_KINDS`."""
    return f"{EVENT_SUBJECT_PREFIX}{service}.{kind}"


class ResourceUpdated(Struct, omit_defaults=True, forbid_unknown_fields=False):
    """The payload of `mcp.events.<service>.resources.updated`.

    `principals`, when given, is the audience: only streams of these callers learn of the
    update. Absent, every caller the hub's resource rule lets follow the URI does.
    """

    uri: str
    principals: list[str] | UnsetType = UNSET


def decode_resource_updated(data: bytes) -> ResourceUpdated:
    """Raises `InvalidEnvelope` for anything but a valid payload."""
    try:
        event = msgspec.json.decode(data, type=ResourceUpdated)
    except msgspec.DecodeError as exc:
        raise InvalidEnvelope(f"resources.updated payload: {exc}") from None
    if not event.uri or len(event.uri.encode()) > MAX_URI_BYTES:
        raise InvalidEnvelope("resources.updated payload: uri must be 1 to 8192 bytes")
    return event
