"""hub/push/subscriber.py: a listen stream's states, its transitions and why it ended."""

from __future__ import annotations

import pytest

from hub.push.subscriber import EndReason, StreamState, Subscriber


class Channel:
    writable = True

    def __init__(self) -> None:
        self.aborted = False
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def abort(self) -> None:
        self.aborted = True


def test_a_stream_opens_goes_live_blocks_and_unblocks() -> None:
    sub = Subscriber(b"1", ["a"])
    assert sub.state is StreamState.OPENING and sub.end_reason is None
    sub.blocking(1.0)  # the ack is being written: still opening
    assert sub.state is StreamState.OPENING and sub.stalled_since() == 1.0
    sub.unblocked(2.0)
    sub.opened()
    assert sub.state is StreamState.LIVE and sub.last_write == 2.0
    assert sub.stalled_since() is None
    sub.blocking(3.0)
    assert sub.state is StreamState.BLOCKED and sub.stalled_since() == 3.0
    sub.unblocked(4.0)
    assert sub.state is StreamState.LIVE


@pytest.mark.parametrize("reason", [EndReason.SHUTDOWN, EndReason.TOKEN_EXPIRED])
def test_a_graceful_end_keeps_its_reason_through_the_goodbye(reason: EndReason) -> None:
    sub = Subscriber(b"1", ["a"])
    sub.opened()
    sub.blocking(1.0)
    sub.finish(reason)
    assert sub.state is StreamState.ENDING
    sub.unblocked(2.0)  # the write in progress ends: still ending, not live
    assert sub.state is StreamState.ENDING
    sub.finish(EndReason.SHUTDOWN)  # a second end changes nothing
    assert sub.closed() is reason and sub.state is StreamState.ENDED


def test_a_client_that_goes_ends_the_stream_as_client() -> None:
    sub = Subscriber(b"1", ["a"])
    sub.opened()
    sub.lose()
    assert sub.ended and sub.end_reason is EndReason.CLIENT
    sub.finish(EndReason.SHUTDOWN)  # too late: nothing is written after the end
    assert sub.state is StreamState.ENDED and sub.closed() is EndReason.CLIENT


def test_a_client_gone_during_the_goodbye_leaves_the_graceful_reason() -> None:
    sub = Subscriber(b"1", ["a"])
    sub.finish(EndReason.SHUTDOWN)
    sub.lose()
    assert sub.ended and sub.closed() is EndReason.SHUTDOWN


def test_a_stalled_stream_is_dropped_even_during_its_goodbye() -> None:
    sub = Subscriber(b"1", ["a"])
    channel = Channel()
    sub.channel = channel  # type: ignore[assignment]
    sub.opened()
    sub.blocking(1.0)
    sub.finish(EndReason.SHUTDOWN)
    sub.drop_stalled()
    assert channel.aborted and sub.ended and sub.end_reason is EndReason.SEND_TIMEOUT
    sub.lose()  # the abort's connection loss arrives afterwards
    assert sub.closed() is EndReason.SEND_TIMEOUT


def test_a_writer_that_fails_before_any_end_counts_as_the_client() -> None:
    sub = Subscriber(b"1", ["a"])
    assert sub.closed() is EndReason.CLIENT and sub.ended


def test_only_a_live_stream_is_written_by_the_flush() -> None:
    channel = Channel()
    for state in StreamState:
        sub = Subscriber(b"1", ["a"])
        sub.channel = channel  # type: ignore[assignment]
        sub.state = state
        sub.backlog["a"] = object()  # type: ignore[assignment]
        if state is StreamState.LIVE:
            continue  # written: covered with real frames in tests/test_fanout.py
        assert sub.flush(0.0) == 0 and "a" in sub.backlog, state
    assert channel.chunks == []


def test_end_reasons_label_the_closed_streams_metric_as_before() -> None:
    assert [reason.value for reason in EndReason] == [
        "client",
        "shutdown",
        "token_expired",
        "send_timeout",
    ]
