"""Server-sent events read from an upstream's answer: each event's `data`, within a limit.

The front door reads an upstream's SSE answer itself where the hub needs its messages (the
legacy door's one answer, a `CreateTaskResult` on the way through, the hub's own listen at
an upstream), always through `EventReader`, which holds at most `limit` bytes of the line
and event being read.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import msgspec


class EventTooLarge(Exception):
    """An SSE line or event of the upstream's over the limit."""


_LINE_END = re.compile(rb"\r\n|\r|\n")


class EventReader:
    """The `data` of each SSE event in a byte stream (multi-line data joined), holding
    at most `limit` bytes of the line and event being read. Each byte is looked at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._line: list[bytes] = []  # the pieces of the line being read
        self._line_size = 0
        self._data: list[bytes] = []  # the data lines of the event being read
        self._data_size = 0
        self._after_cr = False  # the last chunk ended in CR: a LF first is its pair

    @property
    def held(self) -> int:
        return self._line_size + self._data_size

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events `chunk` completes; raises EventTooLarge past the limit."""
        events: list[bytes] = []
        if not chunk:
            return events
        start = 1 if self._after_cr and chunk.startswith(b"\n") else 0
        self._after_cr = False
        while (end := _LINE_END.search(chunk, start)) is not None:
            piece = chunk[start : end.start()]
            line = b"".join((*self._line, piece)) if self._line else piece
            self._line, self._line_size = [], 0
            start = end.end()
            self._after_cr = start == len(chunk) and end.group() == b"\r"
            self._read(line, events)
        if start < len(chunk):
            self._line.append(chunk[start:])
            self._line_size += len(chunk) - start
        if self.held > self.limit:
            raise EventTooLarge
        return events

    def _read(self, line: bytes, events: list[bytes]) -> None:
        if line.startswith(b"data:"):
            value = line[6:] if line[5:6] == b" " else line[5:]
            self._data.append(value)
            self._data_size += len(value) + 1
        elif not line and self._data:
            events.append(b"\n".join(self._data))
            self._data, self._data_size = [], 0


def json_message(data: bytes) -> dict[str, Any] | None:
    with contextlib.suppress(msgspec.DecodeError):
        message = msgspec.json.decode(data)
        if isinstance(message, dict):
            return message
    return None
