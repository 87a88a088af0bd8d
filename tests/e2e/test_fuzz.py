"""Property-based fuzzing of `POST /mcp` and of the KV bucket, end to end (invariant 4).

Whatever arrives — arbitrary bytes, arbitrary JSON, valid requests with parts mutated,
hostile header values (sent over raw sockets, which refuse nothing), garbage KV values —
the hub answers with a well-formed JSON-RPC error (4xx, or 200 for task-level errors), a
valid result, an SSE stream that starts with its ack, or 202 for a notification; never a
5xx. After every example it still serves a real task exactly as it was written.

pytest-asyncio runs each example of an async `@given` test in the session's event loop,
where the hub of the (function-scoped, so shared by all examples) fixture is serving.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bridge.wire import kv_subject
from tests.helpers import (
    SUB_KEY,
    HubHarness,
    SseStream,
    envelope,
    headers_for,
    mint_token,
    new_task_id,
    rpc,
    start_hub,
)

SECRET = "e2e-fuzz-secret-0123456789-abcdefghijkl"
PUBLIC_URL = "https://hub.test"
DASHBOARD = "https://dash.test"
METHODS = ["server/discover", "tasks/get", "tasks/update", "tasks/cancel", "subscriptions/listen"]
ANSWER = {"q1": {"action": "accept", "content": {"ok": True}}}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --- the hub under fuzz ------------------------------------------------------------------------


@dataclass
class Target:
    """An authenticated hub holding one task of alice's that every example may touch."""

    harness: HubHarness
    task_id: str
    served: dict[str, Any]  # what tasks/get must keep answering for it
    token: str = field(default_factory=lambda: mint_token(SECRET, "alice", ttl=3600))

    @property
    def bearer(self) -> str:
        return f"Bearer {self.token}"


@pytest.fixture
async def target(nats_url: str, bucket: str, js: Any, tmp_path: Path) -> AsyncIterator[Target]:
    harness = await start_hub(
        nats_url,
        bucket,
        tmp_path,
        jwt_secret=SECRET,
        public_url=PUBLIC_URL,
        cors_origins=(DASHBOARD,),
        poll_burst=0,  # the same task is read after every example
        max_body_bytes=64 * 1024,
    )
    await harness.hub.source.wait_caught_up(10)
    task_id = new_task_id()
    data = envelope(
        task_id,
        "input_required",
        owner="alice",
        server=f"srv-fuzz-{uuid.uuid4().hex[:8]}",
        statusMessage="fuzz me",
        pollIntervalMs=500,
    )
    await js.publish(kv_subject(bucket, task_id), data)
    yield Target(harness, task_id, json.loads(data)["task"])
    await harness.stop()


async def assert_task_intact(target: Target) -> None:
    body = rpc("tasks/get", {"taskId": target.task_id}, id="check")
    response = await target.harness.call(body, Authorization=target.bearer)
    assert response.status_code == 200, response.text
    assert_served(response.json()["result"], target.served)


def assert_served(result: dict[str, Any], task: dict[str, Any]) -> None:
    result = dict(result)
    assert result.pop("resultType") == "complete"
    assert result.pop("_meta")["io.modelcontextprotocol/serverInfo"]["name"] == "taskhub"
    assert result == task


# --- what every answer must look like -------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """JSON equality with types kept: `1`, `1.0`, `true` and `"1"` are different ids."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def sent_id(sent: bytes) -> tuple[bool, Any]:
    """Whether the request carried an id, and which."""
    try:
        message = json.loads(sent)
    except (ValueError, RecursionError):
        return False, None
    if isinstance(message, dict) and "id" in message:
        return True, message["id"]
    return False, None


# The HTTP status each JSON-RPC error code travels with (docs/protocol.md#error-codes, D8, D20).
STATUS_OF_CODE = {
    -32700: {400},
    -32600: {400, 403, 408, 413},
    -32601: {404},
    -32602: {200, 400},
    -32020: {400},
    -32021: {400},
    -32022: {400},
    -31401: {400, 401},
    -31429: {429},
}


def check_answer(
    status: int, headers: dict[str, str], body: bytes, sent: bytes, target: Target
) -> None:
    """The properties every answer to every request holds."""
    assert status < 500, (status, body)
    content_type = headers.get("content-type", "")
    has_id, request_id = sent_id(sent)
    if status == 202:  # an accepted notification: no body (H6)
        event("202 accepted")
        assert body == b"" and not has_id
        return
    if content_type == "text/event-stream":  # a listen stream: its first event is the ack
        event("200 stream")
        assert status == 200 and has_id
        ack = json.loads(body.partition(b"data: ")[2].partition(b"\n\n")[0])
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert same(ack["params"]["_meta"][SUB_KEY], request_id)
        assert set(ack["params"]["notifications"].get("taskIds", [])) <= {target.task_id}
        return
    assert content_type == "application/json", (status, headers, body)
    message = json.loads(body)
    assert message["jsonrpc"] == "2.0"
    if "result" in message:
        event("200 result")
        assert status == 200 and set(message) == {"jsonrpc", "id", "result"}
        assert has_id and same(message["id"], request_id)
        result = message["result"]
        assert isinstance(result, dict) and result["resultType"] == "complete"
        if "taskId" in result:  # tasks/get: only ever alice's one task, exactly as written
            assert_served(result, target.served)
        return
    assert set(message) <= {"jsonrpc", "id", "error"} and "error" in message
    error = message["error"]
    code = error["code"]
    event(f"{status} {code}")  # --hypothesis-show-statistics: what the examples reached
    assert type(code) is int and isinstance(error["message"], str) and error["message"]
    assert status in STATUS_OF_CODE.get(code, {200, 400}), (status, message)
    if "id" in message:  # H71: echoed exactly, or left out when unreadable
        assert has_id and same(message["id"], request_id), (message, sent)
    if code == -31401:
        assert headers["www-authenticate"].startswith('Bearer realm="taskhub"')
    if code == -31429:
        assert headers["retry-after"].isdigit()


async def post_httpx(target: Target, content: bytes, headers: dict[str, str]) -> None:
    """Send with httpx (valid header values only) and check the answer."""
    harness = target.harness
    request = harness.client.build_request(
        "POST", harness.url + "/mcp", content=content, headers=headers
    )
    response = await harness.client.send(request, stream=True)
    try:
        if response.headers.get("content-type") == "text/event-stream":
            # Up to the first event, split on bytes: SSE lines end only at CR or LF, while
            # httpx's aiter_lines also splits at U+0085/U+2028, which JSON strings may hold.
            body = b""
            async with asyncio.timeout(5):
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if b"\n\n" in body:
                        break
        else:
            body = await response.aread()
    finally:
        await response.aclose()
    check_answer(response.status_code, dict(response.headers), body, content, target)


def valid_headers(target: Target, body: dict[str, Any]) -> dict[str, str]:
    return {**headers_for(body), "Authorization": target.bearer}


# --- strategies --------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
KEYS = [
    "jsonrpc", "id", "method", "params", "result", "error", "taskId", "_meta",
    "notifications", "taskIds", "inputResponses", "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientCapabilities", "extensions", "io.modelcontextprotocol/tasks",
]  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=15,
)
request_ids = st.integers(min_value=-(2**63), max_value=2**63) | st.text(max_size=12)


def valid_body(method: str, task_id: str, request_id: Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if method.startswith("tasks/"):
        params["taskId"] = task_id
    if method == "tasks/update":
        params["inputResponses"] = ANSWER
    if method == "subscriptions/listen":
        params["notifications"] = {"taskIds": [task_id]}
    return rpc(method, params, id=request_id)


# Where a mutation may land, as a path of keys into the request body.
PATHS = [
    ("jsonrpc",), ("id",), ("method",), ("params",), ("result",), ("x",),
    ("params", "taskId"), ("params", "_meta"), ("params", "notifications"),
    ("params", "inputResponses"), ("params", "name"),
    ("params", "_meta", "io.modelcontextprotocol/protocolVersion"),
    ("params", "_meta", "io.modelcontextprotocol/clientCapabilities"),
    ("params", "_meta", "io.modelcontextprotocol/clientCapabilities", "extensions"),
    ("params", "_meta", "io.modelcontextprotocol/clientCapabilities", "extensions",
     "io.modelcontextprotocol/tasks"),
    ("params", "notifications", "taskIds"),
]  # fmt: skip


@st.composite
def mutated_requests(draw: st.DrawFn, task_id: str) -> tuple[dict[str, Any], Any]:
    """A valid request for some method, then up to three parts replaced or removed."""
    original = valid_body(draw(st.sampled_from(METHODS)), task_id, draw(request_ids))
    body: Any = copy.deepcopy(original)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = body
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        if draw(st.booleans()):
            parent[path[-1]] = draw(json_values | st.sampled_from(["2026-07-28", task_id, {}]))
        else:
            parent.pop(path[-1], None)
    if draw(st.integers(0, 9)) == 0:
        body = draw(json_values)  # now and then, not a request at all
    return original, body


def header_value(valid: str, *specials: str) -> st.SearchStrategy[bytes | None]:
    """None (header absent), the valid value, or something hostile, as raw bytes."""
    visible = st.binary(max_size=40).map(  # what an HTTP parser lets through: no CTLs
        lambda raw: bytes(c for c in raw if c == 0x09 or 0x20 <= c != 0x7F)
    )
    unicode = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20).map(
        lambda s: s.encode("utf-8")
    )
    sentinels = (st.binary(max_size=30) | st.just(valid.encode())).map(
        lambda raw: b"=?base64?" + base64.b64encode(raw) + b"?="
    )
    fixed = [valid, "", " ", "=?base64??=", "=?base64?@@?=", "=?BASE64?YQ==?=", *specials]
    return (
        st.none()
        | st.just(valid.encode())
        | st.sampled_from([value.encode() for value in fixed])
        | visible
        | unicode
        | sentinels
    )


@st.composite
def fuzzed_headers(draw: st.DrawFn, target: Target, body: dict[str, Any]) -> list[bytes]:
    """Header lines for `body`: most as a conforming client sends them (so that requests get
    past auth and Origin), up to three missing or hostile, sometimes one doubled."""
    valid: dict[str, str | None] = {
        **valid_headers(target, body),
        "Origin": None,
        "Cookie": None,
        "Sec-Fetch-Site": None,
    }
    cookie = f"taskhub_token={target.token}"
    hostile = {
        "MCP-Protocol-Version": header_value("2026-07-28", "2025-11-25"),
        "Mcp-Method": header_value(body["method"], "tasks/list", "Tasks/Get"),
        "Mcp-Name": header_value(target.task_id, new_task_id()),
        "Authorization": header_value(
            target.bearer, "Bearer", "Bearer a b", "Basic eDp5", target.bearer[:-2]
        ),
        "Cookie": header_value(cookie, f"{cookie}; {cookie}", "taskhub_token="),
        "Origin": header_value(PUBLIC_URL, DASHBOARD, "null", "http://localhost:1", "https://x"),
        "Content-Type": header_value("application/json", "text/plain", "application/JSON"),
        "Accept": header_value(valid["Accept"] or "", "application/json", "text/*", "*/*"),
        "Sec-Fetch-Site": header_value("same-origin", "cross-site"),
    }
    changed = draw(st.sets(st.sampled_from(sorted(hostile)), min_size=1, max_size=3))
    doubled = draw(st.none() | st.sampled_from(sorted(hostile)))
    lines = []
    for name in sorted(valid.keys() | hostile.keys()):
        default = valid.get(name)
        value = draw(hostile[name]) if name in changed else default and default.encode()
        spelled = draw(st.sampled_from([name, name.lower(), name.upper()]))
        if value is not None:
            lines.append(spelled.encode() + b": " + value)
        if name == doubled:
            lines.append(spelled.encode() + b": " + (draw(hostile[name]) or b""))
    return lines


# --- a raw HTTP/1.1 client: sends any header bytes, reads any answer --------------------------


async def post_raw(url: str, header_lines: list[bytes], body: bytes) -> tuple[int, dict, bytes]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = [
            b"POST /mcp HTTP/1.1",
            b"Host: " + host.encode(),
            b"Connection: close",
            b"Content-Length: %d" % len(body),
            *header_lines,
        ]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(10):
            status = int((await reader.readline()).split()[1])
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            answer = await _read_body(reader, headers)
    finally:
        writer.close()
    return status, headers, answer


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """The body (de-chunked); for an event stream, only up to its first event."""
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") != "chunked":
        return await reader.read()
    data = b""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            return data
        data += await reader.readexactly(size)
        await reader.readline()
        if headers.get("content-type") == "text/event-stream" and b"\n\n" in data:
            return data


# --- the properties ----------------------------------------------------------------------------


@FUZZ
@given(content=st.binary(max_size=300))
async def test_arbitrary_bytes(target: Target, content: bytes) -> None:
    await post_httpx(target, content, valid_headers(target, rpc("tasks/get")))
    await assert_task_intact(target)


@FUZZ
@given(value=json_values)
async def test_arbitrary_json(target: Target, value: Any) -> None:
    content = json.dumps(value).encode()
    method = value.get("method") if isinstance(value, dict) else None
    routable = isinstance(method, str) and re.fullmatch(r"[\x21-\x7e]+", method)
    body = rpc(method if routable else "tasks/get")
    await post_httpx(target, content, valid_headers(target, body))
    await assert_task_intact(target)


@FUZZ
@given(data=st.data())
async def test_mutated_requests(target: Target, data: st.DataObject) -> None:
    original, body = data.draw(mutated_requests(target.task_id))
    headers = valid_headers(target, original)
    for name in data.draw(st.sets(st.sampled_from(sorted(headers)), max_size=2)):
        del headers[name]
    await post_httpx(target, json.dumps(body).encode(), headers)
    await assert_task_intact(target)


@FUZZ
@given(data=st.data())
async def test_hostile_headers(target: Target, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from([*METHODS, "notifications/initialized"]))
    body = valid_body(method, target.task_id, data.draw(request_ids))
    if method.startswith("notifications/"):
        del body["id"]
    lines = data.draw(fuzzed_headers(target, body))
    content = json.dumps(body).encode()
    status, headers, answer = await post_raw(target.harness.url, lines, content)
    check_answer(status, headers, answer, content, target)
    await assert_task_intact(target)


# --- KV values: whatever a writer stores, a terminal task stays as it was ---------------------


@dataclass
class KvTarget:
    harness: HubHarness
    js: Any
    bucket: str
    done: str  # a completed task that fuzzed values are written over
    served: dict[str, Any]
    barrier: str  # a task whose changes prove the watch has applied everything before
    stream: SseStream
    writes: int = 0

    async def put(self, task_id: str, data: bytes) -> None:
        await self.js.publish(kv_subject(self.bucket, task_id), data)


@pytest.fixture
async def kv_target(nats_url: str, bucket: str, js: Any, tmp_path: Path) -> AsyncIterator[KvTarget]:
    harness = await start_hub(nats_url, bucket, tmp_path, poll_burst=0)
    await harness.hub.source.wait_caught_up(10)
    done, barrier = new_task_id(), new_task_id()
    data = envelope(done, "completed", result={"resultType": "complete", "content": []})
    await js.publish(kv_subject(bucket, done), data)
    await js.publish(kv_subject(bucket, barrier), envelope(barrier))
    async with harness.listen([done, barrier], id="watch") as stream:
        assert (await stream.next())["params"]["notifications"]["taskIds"] == [done, barrier]
        await stream.next()
        await stream.next()
        yield KvTarget(harness, js, bucket, done, json.loads(data)["task"], barrier, stream)
    await harness.stop()


TID = "{TASK_ID}"  # replaced with the key the value is written under
timestamps = st.sampled_from(
    ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00+14:00", "2026-01-01", "yesterday", ""]
)
ENVELOPE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "owner": st.sampled_from(["anonymous", "alice", "", None, 5]),
    "server": st.sampled_from(["srv-1", "bad server", "", None]),
    "task": json_values,
    "extra": json_values,
}
TASK_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "taskId": st.sampled_from([TID, "short", "", None, 7, TID + "!"]),
    "status": st.sampled_from(
        ["working", "input_required", "completed", "failed", "cancelled", "done", None]
    ),
    "createdAt": timestamps,
    "lastUpdatedAt": timestamps,
    "ttlMs": st.none() | st.integers(min_value=-(2**60), max_value=2**60) | st.just("1"),
    "pollIntervalMs": st.integers(min_value=-(2**60), max_value=2**60) | st.floats(),
    "statusMessage": json_values,
    "inputRequests": json_values,
    "result": json_values,
    "error": json_values | st.fixed_dictionaries({"code": st.integers(), "message": st.text()}),
    "x-unknown": json_values,
}


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    """A well-formed envelope (any status) with some fields replaced, removed or added."""
    value: dict[str, Any] = json.loads(envelope(TID, draw(TASK_FIELDS["status"]) or "working"))
    for name in draw(st.sets(st.sampled_from(sorted(TASK_FIELDS)), max_size=3)):
        if draw(st.booleans()):
            value["task"][name] = draw(TASK_FIELDS[name])
        else:
            value["task"].pop(name, None)
    for name in draw(st.sets(st.sampled_from(sorted(ENVELOPE_FIELDS)), max_size=1)):
        value[name] = draw(ENVELOPE_FIELDS[name])
    return value


# Raw bytes are stored as they are; text is JSON in which TID stands for the key.
kv_values = st.binary(max_size=300) | json_values.map(json.dumps) | envelopes().map(json.dumps)


def stored(value: bytes | str, key: str) -> bytes:
    return value if isinstance(value, bytes) else value.replace(TID, key).encode()


@settings(FUZZ, max_examples=120)
@given(value=kv_values)
async def test_kv_values_never_change_a_terminal_task_nor_crash_the_hub(
    kv_target: KvTarget, value: bytes | str
) -> None:
    t = kv_target
    await t.put(t.done, stored(value, t.done))
    # The same value under a key nobody has read yet: served by read-through, or not found.
    fresh = new_task_id()
    await t.put(fresh, stored(value, fresh))
    response = await t.harness.get_task(fresh, id="fresh")
    assert response.status_code == 200, response.text
    answer = response.json()
    event("fresh key: " + ("served" if "result" in answer else "not found"))
    if "result" in answer:
        assert answer["result"]["taskId"] == fresh
    else:
        assert answer["error"] == {
            "code": -32602,
            "message": "Failed to retrieve task: Task not found",
        }
    # A write after them, seen on the stream, proves the watch has taken both in.
    t.writes += 1
    await t.put(t.barrier, envelope(t.barrier, statusMessage=f"barrier {t.writes}"))
    frame = await t.stream.next(timeout=10)
    assert frame["params"]["taskId"] == t.barrier  # nothing for the terminal task
    assert frame["params"]["statusMessage"] == f"barrier {t.writes}"
    response = await t.harness.get_task(t.done, id="done")
    assert response.status_code == 200
    assert_served(response.json()["result"], t.served)


@pytest.mark.parametrize(
    ("created_at", "ttl_ms"),
    [("2026-01-01T00:00:00Z", 2**53 - 1), ("9999-12-31T00:00:00Z", 86_400_000)],
    ids=["max-safe-ttl", "year-9999"],
)
async def test_a_task_with_a_far_future_expiry_is_served(
    hub: HubHarness, js: Any, bucket: str, created_at: str, ttl_ms: int
) -> None:
    tid = new_task_id()
    data = envelope(tid, created_at=created_at, ttl_ms=ttl_ms)
    await js.publish(kv_subject(bucket, tid), data)
    response = await hub.get_task(tid, id=1)
    assert response.status_code == 200, response.text
    assert_served(response.json()["result"], json.loads(data)["task"])
