"""The bytes the load generators send and how they read the answers, without an HTTP library.

Requests are prebuilt HTTP/1.1 keep-alive messages (one per task), so a load generator
spends its time on sockets, not on building requests. Answers are read byte-wise:
`ResponseReader` splits keep-alive responses (Content-Length or chunked, as uvicorn
sends them), and `SseScanner` counts `notifications/tasks` frames and pulls the publish
stamp out of each without decoding JSON, so the client stays cheaper than any server.

Every task the bench writes carries `statusMessage: "t=<time_ns at publish>"`: the
stamp is how a client measures publish→client latency and staleness.
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec

from bridge.vocabulary import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
)

PROTOCOL = PROTOCOL_VERSION
_META: dict[str, Any] = {
    PROTOCOL_VERSION_KEY: PROTOCOL,
    CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}},
    CLIENT_INFO_KEY: {"name": "taskhub-bench", "version": "0"},
}

# The stamp: 19 digits of time.time_ns() (good until 2286), so the pattern is fixed-length.
STAMP_MARK = b'"statusMessage":"t='
_SSE_STAMP = re.compile(rb'"statusMessage":"t=(\d{19})"')
# Servers built on other JSON encoders may put a space after the colon.
_BODY_STAMP = re.compile(rb'"statusMessage":\s?"t=(\d{19})"')
ACK_MARK = b"notifications/subscriptions/acknowledged"
# The operator stream's named events (docs/dashboard.md): one `event:` line per frame.
TASK_EVENT = b"event: task\n"
HELLO_EVENT = b"event: hello\n"
SYNCED_EVENT = b"event: synced\n"


def stamp() -> str:
    """A statusMessage carrying the current wall-clock time, for latency at the client."""
    return f"t={time.time_ns():019d}"


def rpc_body(method: str, params: dict[str, Any], request_id: int | str = 1) -> bytes:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": _META},
    }
    return msgspec.json.encode(body)


def post(port: int, method: str, body: bytes, name: str | None = None, path: str = "/mcp") -> bytes:
    """A complete `POST <path>` with the routing headers a conforming client sends."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"MCP-Protocol-Version: {PROTOCOL}\r\nMcp-Method: {method}\r\n"
        + (f"Mcp-Name: {name}\r\n" if name is not None else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def tasks_get(port: int, task_id: str, request_id: int = 1) -> bytes:
    return post(port, "tasks/get", rpc_body("tasks/get", {"taskId": task_id}, request_id), task_id)


def tools_call(
    port: int,
    tool: str,
    arguments: dict[str, Any],
    request_id: int = 1,
    *,
    progress: bool = False,
    path: str = "/mcp",
) -> bytes:
    """A `tools/call` (Mcp-Name: the tool); with `progress`, a progressToken in `_meta`."""
    meta = {**_META, "progressToken": f"p{request_id}"} if progress else _META
    params = {"name": tool, "arguments": arguments, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return post(port, "tools/call", msgspec.json.encode(body), tool, path)


def listen(port: int, task_ids: list[str], request_id: int | str) -> bytes:
    params = {"notifications": {"taskIds": task_ids}}
    return post(port, "subscriptions/listen", rpc_body("subscriptions/listen", params, request_id))


def get(port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


def event_source(port: int, path: str) -> bytes:
    """`GET <path>` as a browser's EventSource sends it (no credentials)."""
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
    ).encode()


def operator_stream(port: int) -> bytes:
    """`GET /operator/stream`, as a dashboard opens it."""
    return event_source(port, "/operator/stream")


def body_stamp(body: bytes) -> int | None:
    """The publish stamp in a tasks/get answer, or None."""
    found = _BODY_STAMP.search(body)
    return None if found is None else int(found.group(1))


def content_length(head: bytes) -> int | None:
    """The Content-Length of a lower-cased HTTP head, None when it has none."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return None
    eol = head.find(b"\r\n", at + 2)
    return int(head[at + 17 : eol if eol >= 0 else len(head)])


class ProtocolError(RuntimeError):
    """The server answered something a load generator cannot read."""


class ResponseReader:
    """Incremental reader of HTTP/1.1 keep-alive responses: feed bytes, get (status, body)s."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        done: list[tuple[int, bytes]] = []
        while True:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = bytes(buf[:head_end]).lower()
            if not head.startswith(b"http/1.1 "):
                raise ProtocolError(f"not an HTTP/1.1 response: {head[:40]!r}")
            status = int(head[9:12])
            length = content_length(head)
            if length is not None:
                end = head_end + 4 + length
                if len(buf) < end:
                    break
                body = bytes(buf[head_end + 4 : end])
            elif b"\r\ntransfer-encoding: chunked" in head:
                parsed = _dechunk(buf, head_end + 4)
                if parsed is None:
                    break
                body, end = parsed
            else:
                body, end = b"", head_end + 4
            del buf[:end]
            done.append((status, body))
        return done


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """A whole chunked body starting at `pos`: (body, end offset), or None if incomplete."""
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        if size == 0:
            if len(buf) < eol + 4:
                return None
            return b"".join(parts), eol + 4
        if len(buf) < eol + 2 + size + 2:
            return None
        parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
        pos = eol + 2 + size + 2


class SseScanner:
    """Reads one listen response: the status line, then whole SSE events, byte-wise.

    Chunked framing is left in place: frames never straddle a chunk (each server write is
    whole frames), so splitting at the last blank line yields whole events plus chunk
    headers, which contain neither marker.
    """

    __slots__ = ("_buf", "status", "streaming")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.status = 0
        self.streaming = False

    def feed(self, data: bytes) -> bytes:
        """Whole events received so far (plus framing bytes); b"" until there are some."""
        buf = self._buf
        buf += data
        if not self.streaming:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return b""
            self.status = int(bytes(buf[9:12]))
            self.streaming = True
            del buf[: head_end + 4]
        last = buf.rfind(b"\n\n")
        if last < 0:
            return b""
        complete = bytes(buf[: last + 2])
        del buf[: last + 2]
        return complete


def frame_stamps(events: bytes) -> list[bytes]:
    """The publish stamps of the task frames in `events`, one per frame."""
    return _SSE_STAMP.findall(events)
