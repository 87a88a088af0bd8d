"""The frame cutter (the first read's and the watch's) and the first read's bookkeeping,
fed the bytes NATS sends."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hub.store.first_read.reader import FirstRead
from hub.store.nats_frames import (
    Frame,
    FrameCutter,
    delivery_sequences,
    removes,
    stream_sequence,
)

V1 = b"$JS.ACK.KV_b.c1.1.%d.%d.1700000000000000000.%d"
V2 = b"$JS.ACK._.ACC.KV_b.c1.1.%d.%d.1700000000000000000.%d.tok"


def msg(subject: bytes, reply: bytes, payload: bytes) -> bytes:
    reply_part = b" " + reply if reply else b""
    return b"MSG %s 1%s %d\r\n%s\r\n" % (subject, reply_part, len(payload), payload)


def hmsg(subject: bytes, reply: bytes, headers: bytes, payload: bytes) -> bytes:
    reply_part = b" " + reply if reply else b""
    sizes = b"%d %d" % (len(headers), len(headers) + len(payload))
    return b"HMSG %s 1%s %s\r\n%s%s\r\n" % (subject, reply_part, sizes, headers, payload)


def frames_and_wire(count: int) -> tuple[list[Frame], bytes]:
    """`count` frames of every shape (with and without reply and headers, empty payloads,
    payloads holding CRLF and protocol words), and the bytes NATS would send for them."""
    frames: list[Frame] = []
    wire = b""
    for i in range(count):
        subject = b"$KV.b.task-%06d-xxxxxxxxxx" % i
        reply = b"" if i % 7 == 3 else V2 % (i + 1, i + 1, count - i - 1)
        payload = [b'{"a":%d}' % i, b"", b"MSG x 1 3\r\nabc\r\n", b"HMSG\r\n\r\n"][i % 4]
        if i % 3 == 0:
            headers = b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n"
            frames.append((subject, reply, headers, payload))
            wire += hmsg(subject, reply, headers, payload)
        else:
            frames.append((subject, reply, None, payload))
            wire += msg(subject, reply, payload)
    return frames, wire


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=40))
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut(cuts: list[int]) -> None:
    expected, wire = frames_and_wire(24)
    got: list[Frame] = []
    cutter = FrameCutter(None, got.extend)  # type: ignore[arg-type]  # no control lines here
    bounds = sorted({min(cut, len(wire)) for cut in cuts} | {0, len(wire)})

    async def feed() -> None:
        for start, end in itertools.pairwise(bounds):
            await cutter.parse(wire[start:end])

    asyncio.run(feed())
    assert got == expected
    assert cutter.unparsed() == b""


class _Inner:
    """nats-py's protocol, as `attach` finds it: what is passed on reaches its reader."""

    def __init__(self) -> None:
        self.passed: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.passed.append(data)


class _Transport:
    def __init__(self) -> None:
        self.protocol: object = _Inner()

    def get_protocol(self) -> object:
        return self.protocol

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol


class _Cutter(FrameCutter):
    """A cutter whose connection's transport is `transport`, holding `unread` bytes nats-py
    had not parsed yet when `attach` came (the adapter's side is pinned against nats-py by
    tests/test_nats_internals.py)."""

    def __init__(self, sink: Callable[[list[Frame]], None], unread: bytes) -> None:
        super().__init__(None, sink)  # type: ignore[arg-type]
        self.transport = _Transport()
        self.unread = unread

    def take_reads(self) -> tuple[Any, bytes] | None:
        return self.transport, self.unread


@settings(max_examples=200, deadline=None)
@given(
    split=st.integers(min_value=0, max_value=10_000),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_attached_frames_come_out_whole_and_control_lines_go_on_to_nats_py(
    split: int, cuts: list[int]
) -> None:
    """Bytes the reader held unread when `attach` came (`split`) are cut first, then every
    read the transport delivers to the protocol, however cut; the lines that are not
    frames reach nats-py's reader whole and in order."""
    expected, _ = frames_and_wire(24)
    pieces = [
        msg(subject, reply, payload) if headers is None else hmsg(subject, reply, headers, payload)
        for subject, reply, headers, payload in expected
    ]
    control = [b"PING\r\n", b'INFO {"server_id":"x"}\r\n', b"-ERR 'Permissions'\r\n"]
    for at, line in ((24, control[2]), (12, control[1]), (8, control[0])):
        pieces.insert(at, line)  # between frames, as the server sends them
    wire = b"".join(pieces)
    split = min(split, len(wire))
    got: list[Frame] = []
    cutter = _Cutter(got.extend, wire[:split])
    transport = cutter.transport
    inner = transport.protocol
    assert cutter.attach() and transport.protocol is not inner
    bounds = sorted({split, len(wire)} | {min(max(cut, split), len(wire)) for cut in cuts})
    for start, end in itertools.pairwise(bounds):
        transport.protocol.data_received(wire[start:end])  # type: ignore[attr-defined]
    assert got == expected
    assert inner.passed == control  # type: ignore[attr-defined]


def test_with_a_sid_set_only_that_subscriptions_frames_come_out() -> None:
    old = msg(b"$KV.b.k1", V1 % (1, 1, 1), b"old") + hmsg(
        b"_INBOX.a", b"", b"NATS/1.0 100 x\r\n\r\n", b""
    )
    new = msg(b"$KV.b.k1", V1 % (2, 1, 0), b"new")
    got: list[Frame] = []
    cutter = FrameCutter(None, got.extend)  # type: ignore[arg-type]
    cutter.sid = b"2"
    asyncio.run(cutter.parse(old + new.replace(b" 1 ", b" 2 ", 1)))
    assert got == [(b"$KV.b.k1", V1 % (2, 1, 0), None, b"new")]
    assert cutter.unparsed() == b""


def test_both_reply_subject_forms_give_the_sequences() -> None:
    assert delivery_sequences(V1 % (50, 7, 3)) == (50, 7, 3)
    assert delivery_sequences(V2 % (50, 7, 3)) == (50, 7, 3)
    assert stream_sequence(V1 % (50, 7, 3)) == stream_sequence(V2 % (50, 7, 3)) == 50
    assert stream_sequence(b"") is None  # a status message has no reply subject


PUT = b"NATS/1.0\r\nNats-Expected-Stream: KV_b\r\nNats-TTL: 60\r\n\r\n"
DEL = b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n"
PURGE = b"NATS/1.0\r\nKV-Operation: PURGE\r\nNats-Rollup: sub\r\n\r\n"
MARKER = b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\n\r\n"


def test_removals_are_told_from_puts_by_their_headers() -> None:
    assert [removes(raw) for raw in (None, PUT, DEL, PURGE, MARKER)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    applied: list[tuple[str, int, bool]] = []
    first = FirstRead(
        None, "KV_b", "b", lambda key, seq, removed, data: applied.append((key, seq, removed))
    )
    first._stop_seq = 1_000
    first._take(
        [
            (b"$KV.b.k%d" % i, V1 % (10 + i, i + 1, 9 - i), headers, b"{}")
            for i, headers in enumerate((None, PUT, DEL, PURGE, MARKER))
        ]
    )
    assert applied == [
        ("k0", 10, False),
        ("k1", 11, False),
        ("k2", 12, True),
        ("k3", 13, True),
        ("k4", 14, True),
    ]
    assert (first.applied, first.count, first._delivered) == (14, 5, 5)


def reader(applied: list[tuple[str, int]]) -> FirstRead:
    first = FirstRead(None, "KV_b", "b", lambda key, seq, removed, data: applied.append((key, seq)))
    first._stop_seq = 1_000
    return first


def test_both_reply_subject_forms_give_sequence_and_pending() -> None:
    for form in (V1, V2):
        applied: list[tuple[str, int]] = []
        first = reader(applied)
        first._take([(b"$KV.b.k1", form % (5, 1, 2), None, b"{}")])
        first._take([(b"$KV.b.k2", form % (9, 2, 1), None, b"{}")])
        first._take([(b"$KV.b.k3", form % (12, 3, 0), None, b"{}")])
        assert applied == [("k1", 5), ("k2", 9), ("k3", 12)]
        assert (first.applied, first.count, first.ended_early) == (12, 3, "")
        assert first._done.is_set()  # nothing pending after the third


def test_the_stream_sequence_it_was_made_at_ends_the_read() -> None:
    applied: list[tuple[str, int]] = []
    first = reader(applied)
    first._stop_seq = 9
    first._take(
        [(b"$KV.b.k1", V2 % (9, 1, 40), None, b"{}"), (b"$KV.b.k2", V2 % (50, 2, 39), None, b"")]
    )
    assert applied == [("k1", 9)]
    assert first._done.is_set() and first.ended_early == ""


def test_a_gap_in_the_consumer_sequence_ends_the_read_before_it() -> None:
    applied: list[tuple[str, int]] = []
    first = reader(applied)
    first._take(
        [
            (b"$KV.b.k1", V2 % (5, 1, 9), None, b"{}"),
            (b"$KV.b.k3", V2 % (8, 3, 7), None, b"{}"),  # the second was lost
            (b"$KV.b.k4", V2 % (9, 4, 6), None, b"{}"),
        ]
    )
    # Seen at the batch's end: what came after the gap was applied too, but the read
    # counts as stopped before it, so the watch resumes there and reads them again.
    assert applied == [("k1", 5), ("k3", 8), ("k4", 9)]
    assert (first.applied, first.count, first._delivered) == (5, 1, 1)
    assert first.ended_early == "consumer sequence 3 after 1"
    first._take([(b"$KV.b.k5", V2 % (10, 5, 5), None, b"{}")])
    assert len(applied) == 3  # nothing after the end


def test_a_status_message_ends_the_read() -> None:
    applied: list[tuple[str, int]] = []
    first = reader(applied)
    status = b"NATS/1.0 409 Consumer Deleted\r\n\r\n"
    first._take([(b"_INBOX.x", b"", status, b""), (b"$KV.b.k1", V2 % (5, 1, 0), None, b"")])
    assert applied == []
    assert first.ended_early == "status 'NATS/1.0 409 Consumer Deleted'"


def test_a_failing_apply_ends_the_read_and_keeps_what_came_before() -> None:
    seen: list[int] = []

    def apply(key: str, seq: int, removed: bool, data: bytes) -> None:
        if data == b"boom":
            raise RuntimeError("boom")
        seen.append(seq)

    first = FirstRead(None, "KV_b", "b", apply)
    first._stop_seq = 100
    first._take(
        [(b"$KV.b.k1", V1 % (3, 1, 5), None, b"{}"), (b"$KV.b.k2", V1 % (4, 2, 4), None, b"boom")]
    )
    assert seen == [3] and (first.applied, first.count) == (3, 1)
    assert first.ended_early == "RuntimeError: boom"
