"""Poll-rate and stream limits, with time passed in."""

from __future__ import annotations

import pytest

from hub.admission.limits import ByteBudget, PollLimiter, StreamLimiter, retry_after


def test_a_burst_is_admitted_then_polls_are_paced_by_the_interval() -> None:
    limiter = PollLimiter(burst=3, default_interval_s=1.0)
    assert [limiter.admit("p", "t", 2.0, now=0.0) for _ in range(3)] == [0, 0, 0]
    wait = limiter.admit("p", "t", 2.0, now=0.0)
    assert wait == pytest.approx(2.0)
    assert limiter.admit("p", "t", 2.0, now=1.0) == pytest.approx(1.0)
    assert limiter.admit("p", "t", 2.0, now=2.0) == 0  # one token refilled


def test_buckets_are_per_principal_and_task() -> None:
    limiter = PollLimiter(burst=1, default_interval_s=1.0)
    assert limiter.admit("alice", "t1", 5.0, 0.0) == 0
    assert limiter.admit("alice", "t1", 5.0, 0.0) > 0
    assert limiter.admit("bob", "t1", 5.0, 0.0) == 0
    assert limiter.admit("alice", "t2", 5.0, 0.0) == 0


def test_tasks_without_an_interval_use_the_default_and_zero_disables() -> None:
    limiter = PollLimiter(burst=1, default_interval_s=0.5)
    assert limiter.admit("p", "t", None, 0.0) == 0
    assert limiter.admit("p", "t", None, 0.0) == pytest.approx(0.5)
    assert all(limiter.admit("p", "u", 0.0, 0.0) == 0 for _ in range(100))


def test_refill_never_exceeds_the_burst() -> None:
    limiter = PollLimiter(burst=2, default_interval_s=1.0)
    limiter.admit("p", "t", 1.0, 0.0)
    admitted = [limiter.admit("p", "t", 1.0, 1_000.0) for _ in range(3)]
    assert admitted[:2] == [0, 0] and admitted[2] > 0


def test_memory_is_bounded() -> None:
    limiter = PollLimiter(burst=1, default_interval_s=1.0, max_keys=100)
    for n in range(1_000):
        limiter.admit("p", f"task-{n}", 1.0, 0.0)
    assert len(limiter) == 100


def test_buckets_that_refilled_are_forgotten_so_old_pairs_hold_no_memory() -> None:
    limiter = PollLimiter(burst=2, default_interval_s=1.0)
    for n in range(1_000):  # a caller polling a new task every 10 ms, once each
        assert limiter.admit("p", f"task-{n}", 1.0, now=n / 100) == 0
    # A bucket refills 1 s after its one poll: only the last second's are held.
    assert len(limiter) <= 101


def test_a_forgotten_bucket_was_full_so_pacing_is_unchanged() -> None:
    limiter = PollLimiter(burst=2, default_interval_s=1.0)
    assert [limiter.admit("p", "t", 1.0, now=0.0) for _ in range(2)] == [0, 0]
    for n in range(10):  # other pairs come and go; "t" is not full until t=2
        limiter.admit("p", f"other-{n}", 1.0, now=n / 10)
    assert limiter.admit("p", "t", 1.0, now=1.0) == 0  # one token back, not two
    assert limiter.admit("p", "t", 1.0, now=1.0) == pytest.approx(1.0)
    for n in range(20):  # long after every bucket so far refilled, 20 new pairs
        assert limiter.admit("q", f"u-{n}", 1.0, now=10.0) == 0
    assert len(limiter) == 20  # the eleven old ones forgotten, two a poll


def test_stream_limits_per_principal_and_total() -> None:
    streams = StreamLimiter(max_total=3, max_per_principal=2)
    assert streams.acquire("a") is None and streams.acquire("a") is None
    assert "per caller" in (streams.acquire("a") or "")
    assert streams.acquire("b") is None
    assert "3 open streams" in (streams.acquire("c") or "")
    streams.release("a")
    assert streams.open_for("a") == 1 and streams.acquire("c") is None
    for principal in ("a", "b", "c"):
        streams.release(principal)
    assert streams.total == 0 and streams.open_for("a") == 0


@pytest.mark.parametrize(("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2")])
def test_retry_after_is_whole_seconds(seconds: float, header: str) -> None:
    assert retry_after(seconds) == header


def test_forwards_in_flight_are_counted_per_caller() -> None:
    in_flight = StreamLimiter(10, max_per_principal=2, what="forwarded requests in flight")
    assert in_flight.acquire("alice") is None and in_flight.acquire("alice") is None
    refusal = in_flight.acquire("alice")  # refused: nothing taken
    assert refusal == "limit of 2 forwarded requests in flight per caller reached"
    assert in_flight.acquire("bob") is None
    in_flight.release("alice")
    assert in_flight.open_for("alice") == 1 and in_flight.acquire("alice") is None
    for _ in range(2):
        in_flight.release("alice")
    in_flight.release("bob")
    assert in_flight.open_for("alice") == in_flight.open_for("bob") == 0


def test_the_byte_budget_never_holds_more_than_its_limit() -> None:
    budget = ByteBudget(100)
    assert budget.take(60) and not budget.take(41)  # refused: nothing held
    assert budget.held == 60 and budget.take(40) and budget.held == 100
    budget.give(100)
    assert budget.held == 0 and budget.take(100)
