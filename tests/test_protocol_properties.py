"""hub/rpc/request.py, for any input: parse_request returns a Request or a Notification, or
raises a RequestError whose code and HTTP status agree and whose reply encodes; and
whatever plain_tasks_get recognises, parse_request reads as the same tasks/get."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.vocabulary import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY
from hub.rpc import jsonrpc
from hub.rpc.request import (
    METHODS,
    Notification,
    RequestError,
    parse_request,
    plain_tasks_get,
)
from hub.rpc.routing_headers import encode_header_value
from tests.test_protocol import (
    MISSING,
    OTHER_ID,
    TASK_ID,
    TASK_METHODS,
    TASKS,
    VERSION,
    encode,
    headers,
    message,
)

CODE_STATUS = {
    -32700: {400},
    -32600: {400},
    -32601: {404},
    -32602: {200, 400},
    -32020: {400},
    -32021: {400},
    -32022: {400},
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
METHOD_NAMES = [*sorted(METHODS), "tasks/result", "Tasks/Get", "notifications/x"]


header_values = st.one_of(
    st.sampled_from([VERSION, TASK_ID, OTHER_ID, "text/event-stream", "application/json"]),
    st.sampled_from(METHOD_NAMES),
    st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=12),
    st.text(max_size=8).map(encode_header_value),
)
header_maps = st.dictionaries(
    st.sampled_from(["mcp-protocol-version", "mcp-method", "mcp-name", "accept"]),
    header_values,
)


def check_outcome(hdrs: dict[str, str], body: bytes) -> None:
    plain = plain_tasks_get(hdrs, body)
    try:
        result = parse_request(hdrs, body)
    except RequestError as exc:
        assert plain is None, (hdrs, body)
        err = exc.error
        assert err.http_status in CODE_STATUS[err.code]
        assert exc.request_id is None or (
            type(exc.request_id) in (str, int) and not isinstance(exc.request_id, bool)
        )
        msgspec.json.decode(jsonrpc.encode_error(exc.request_id, err))
        return
    if isinstance(result, Notification):
        assert plain is None, (hdrs, body)
        return
    if plain is not None:  # the one-pass read gives what the full one gives
        assert (result.method, result.id, result.task_id) == ("tasks/get", *plain)
        assert type(result.id) is type(plain[0])
    assert result.method in METHODS
    assert type(result.id) in (str, int)
    if result.method in TASK_METHODS:
        assert result.declared_tasks and isinstance(result.task_id, str)
        assert result.task_id == hdrs["mcp-name"] or hdrs["mcp-name"].startswith("=?base64?")
    if result.method == "tasks/update":
        assert isinstance(result.input_responses, dict)
    if result.task_ids is not None:
        assert result.declared_tasks
        assert all(isinstance(t, str) for t in result.task_ids)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64), header_maps)
def test_arbitrary_bytes(body: bytes, hdrs: dict[str, str]) -> None:
    check_outcome(hdrs, body)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, header_maps)
def test_arbitrary_json(body: Any, hdrs: dict[str, str]) -> None:
    check_outcome(hdrs, encode(body))


BODY_PATHS: list[tuple[str, ...]] = [
    ("jsonrpc",),
    ("id",),
    ("method",),
    ("params",),
    ("params", "_meta"),
    ("params", "_meta", PROTOCOL_VERSION_KEY),
    ("params", "_meta", CLIENT_CAPABILITIES_KEY),
    ("params", "_meta", CLIENT_CAPABILITIES_KEY, "extensions"),
    ("params", "_meta", CLIENT_CAPABILITIES_KEY, "extensions", "io.modelcontextprotocol/tasks"),
    ("params", "taskId"),
    ("params", "inputResponses"),
    ("params", "notifications"),
    ("params", "notifications", "taskIds"),
]
HEADER_NAMES = ["mcp-protocol-version", "mcp-method", "mcp-name", "accept"]
# A replacement: drop the member, or set a plausible or an arbitrary value.
replacements = st.one_of(
    st.just(MISSING),
    st.sampled_from([*METHOD_NAMES, VERSION, "2025-11-25", TASK_ID, [TASK_ID], {}, TASKS, 1]),
    json_values,
)


def mutate(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    *parents, last = path
    target: Any = body
    for key in parents:
        target = target.get(key) if isinstance(target, dict) else None
    if not isinstance(target, dict):
        return
    if value is MISSING:
        target.pop(last, None)
    else:
        target[last] = value


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(METHODS)),
    st.lists(st.tuples(st.sampled_from(BODY_PATHS), replacements), max_size=2),
    st.lists(st.tuples(st.sampled_from(HEADER_NAMES), st.none() | header_values), max_size=1),
)
def test_mutated_valid_requests(
    method: str,
    body_changes: list[tuple[tuple[str, ...], Any]],
    header_changes: list[tuple[str, str | None]],
) -> None:
    """One or two edits to a good request: reaches every step, not just the first ones."""
    body = copy.deepcopy(message(method))  # shared constants must not be edited (or cycled)
    for path, value in body_changes:
        mutate(body, path, value if value is MISSING else copy.deepcopy(value))
    hdrs = headers(method)
    for name, header_value in header_changes:
        if header_value is None:
            hdrs.pop(name, None)
        else:
            hdrs[name] = header_value
    check_outcome(hdrs, encode(body))
