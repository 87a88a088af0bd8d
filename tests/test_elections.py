"""bridge/elections.py: an ask raced against a leader's election."""

from __future__ import annotations

import asyncio

import pytest

from bridge.elections import LeaderElected, unless_elected


async def test_the_answer_comes_back_when_no_leader_is_elected() -> None:
    assert await unless_elected(asyncio.sleep(0, "info"), asyncio.Event()) == "info"


async def test_an_error_of_the_ask_is_the_callers() -> None:
    async def fails() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await unless_elected(fails(), asyncio.Event())


async def test_an_election_drops_the_ask_in_flight() -> None:
    elected = asyncio.Event()
    dropped = asyncio.Event()

    async def waits_out_its_timeout() -> str:
        try:
            await asyncio.sleep(60)
        finally:
            dropped.set()
        return "too late"

    asyncio.get_running_loop().call_later(0.01, elected.set)
    async with asyncio.timeout(5):
        with pytest.raises(LeaderElected):
            await unless_elected(waits_out_its_timeout(), elected)
    assert dropped.is_set()  # cancelled and awaited before LeaderElected is raised


async def test_a_cancelled_caller_drops_the_ask_too() -> None:
    started, dropped = asyncio.Event(), asyncio.Event()

    async def long_poll() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            dropped.set()

    caller = asyncio.create_task(unless_elected(long_poll(), asyncio.Event()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    async with asyncio.timeout(5):
        await dropped.wait()
