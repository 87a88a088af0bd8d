"""hub/front_door/upstream.py's pure part: the SSE reader the legacy door reads an upstream's
answer with."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.front_door.event_reader import EventReader, EventTooLarge
from hub.front_door.upstream_pool import READ_SIZE, Pool

STREAM = (
    b": a comment\r\n"
    b"event: message\r\n"
    b'data: {"a":\r\n'
    b"data:1}\r\n"
    b"\r\n"
    b"id: 7\n"
    b'data: {"b":2}\n'
    b"\n"
    b'data: {"c":3}\r'
    b"\r\n"
    b"\n"  # a blank line with no data: no event
)
EVENTS = [b'{"a":\n1}', b'{"b":2}', b'{"c":3}']


def read(chunks: list[bytes], limit: int = 1 << 20) -> list[bytes]:
    reader = EventReader(limit)
    return [event for chunk in chunks for event in reader.feed(chunk)]


def test_events_with_every_line_ending_and_multi_line_data() -> None:
    assert read([STREAM]) == EVENTS


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=6))
def test_any_split_of_the_stream_reads_the_same(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    assert read([STREAM[a:b] for a, b in itertools.pairwise(points)]) == EVENTS


def test_a_line_or_an_event_over_the_limit_raises_and_holds_no_more() -> None:
    reader = EventReader(100)
    with pytest.raises(EventTooLarge):
        for _ in range(10):
            reader.feed(b"data: " + b"x" * 30)  # one line that never ends
    reader = EventReader(100)
    with pytest.raises(EventTooLarge):
        for _ in range(10):
            reader.feed(b"data: " + b"y" * 30 + b"\n")  # an event that never ends
    reader = EventReader(100)
    for _ in range(10):  # small events, each ended: nothing is held between them
        assert reader.feed(b"data: " + b"z" * 30 + b"\n\n") == [b"z" * 30]
        assert reader.held == 0


async def test_a_caller_is_admitted_while_it_has_slots_and_the_budget_has_room() -> None:
    pool = Pool(5.0, max_per_caller=2, buffer_bytes=1 << 20)
    try:
        assert pool.admit("alice") is None and pool.admit("alice") is None
        refusal = pool.admit("alice")
        assert refusal is not None and refusal.http_status == 429
        assert refusal.headers == {"Retry-After": "1"}
        assert pool.admit("bob") is None
        pool.release("alice")
        held = (1 << 20) - READ_SIZE + 1
        assert pool.buffer.take(held)  # less than one read left
        refusal = pool.admit("alice")
        assert refusal is not None and "answer bytes" in refusal.message
        pool.buffer.give(held)
        assert pool.admit("alice") is None
    finally:
        await pool.close()
