"""What one caller may take of the front door (docs/front-door.md, "Limits").

Its forwarded requests in flight (429 past `--max-forwards-per-caller`, counted by
principal or, behind trusted proxies, by the address they vouch for), and the bytes of
upstream answers the hub holds at once: endless answers, JSON or one SSE `data:` line
read by the legacy door, end at their limits with the hub's memory bounded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from hub.settings import UpstreamSpec, parse_trusted_proxies
from tests.e2e.raw_http import (
    Answer,
    Received,
    call,
    endless,
    hub_in_front,
    hub_process,
    json_reply,
    kept_alive,
    result,
)
from tests.e2e.test_legacy_endpoint import LegacyClient
from tests.helpers import eventually, mint_token, rpc

pytestmark = pytest.mark.timeout(90)

# -- 3. one caller cannot take every upstream connection, nor the hub's memory ------------


def held_open(release: asyncio.Event) -> Answer:
    """An SSE answer that starts, then holds its connection until `release`."""

    async def answer(request: Received) -> bytes | None:
        if request.body and json.loads(request.body).get("method") == "tools/call":
            await release.wait()
            return None
        return json_reply(result(request))

    return answer


async def test_one_caller_holds_at_most_its_share_of_forwarded_requests(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """alice's 101st held call is refused with 429 (the default limit is 100); bob's goes
    through at once."""
    secret = "s" * 32
    release = asyncio.Event()
    async with kept_alive(held_open(release)) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(nats_url, bucket, tmp_path, spec, jwt_secret=secret) as front:
            alice = {"Authorization": f"Bearer {mint_token(secret, 'alice')}"}
            held = [asyncio.create_task(call(front.url + "/mcp", **alice)) for _ in range(100)]
            await eventually(lambda: len(upstream.received) == 100, timeout=20)
            refused = await call(front.url + "/mcp", **alice)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == -31429
            assert len(upstream.received) == 100  # it never reached the upstream
            bob = {"Authorization": f"Bearer {mint_token(secret, 'bob')}"}
            assert (await call(front.url + "/mcp", rpc("tools/list", {}, id=1), **bob)).json()[
                "result"
            ] == {}
            release.set()
            await asyncio.gather(*held)
            again = await call(front.url + "/mcp", rpc("tools/list", {}, id=2), **alice)
            assert again.status_code == 200  # the slots came back


async def test_an_open_hub_counts_callers_by_address_behind_a_trusted_proxy(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    release = asyncio.Event()
    async with kept_alive(held_open(release)) as upstream:
        spec = UpstreamSpec(None, upstream.url())
        async with hub_in_front(
            nats_url,
            bucket,
            tmp_path,
            spec,
            max_forwards_per_caller=2,
            trusted_proxies=parse_trusted_proxies("127.0.0.1"),
        ) as front:
            first = {"X-Forwarded-For": "203.0.113.1"}
            held = [asyncio.create_task(call(front.url + "/mcp", **first)) for _ in range(2)]
            await eventually(lambda: len(upstream.received) == 2)
            assert (await call(front.url + "/mcp", **first)).status_code == 429
            # A client that lies about its address to a trusted proxy is still the
            # proxy's last hop: the address the proxy saw, appended last, counts.
            spoof = {"X-Forwarded-For": "198.51.100.9, 203.0.113.1"}
            assert (await call(front.url + "/mcp", **spoof)).status_code == 429
            other = {"X-Forwarded-For": "203.0.113.2"}
            assert (
                await call(front.url + "/mcp", rpc("tools/list", {}, id=1), **other)
            ).status_code == 200
            release.set()
            await asyncio.gather(*held)


async def test_answers_read_whole_hold_at_most_the_budget(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """Sixteen endless JSON answers at once, with a budget of 16 MiB: none can reach the
    64 MiB a single answer may have, so each ends as `overloaded` (503). The hub's RSS
    grows by the budget and what the HTTP client's read buffers hold per connection (up to
    a few MiB each: libuv reads up to 8 MiB at one wake-up), less than 160 MiB; each
    answer read to its 64 MiB took a GiB."""
    async with kept_alive(endless("json")) as upstream:
        args = ("--upstream", upstream.url(), "--max-upstream-buffer-bytes", str(16 << 20))
        async with hub_process(nats_url, bucket, tmp_path, *args) as hub:
            before = hub.rss()
            answers = await asyncio.gather(*(call(hub.url + "/mcp") for _ in range(16)))
            grown = hub.rss() - before
            assert len(upstream.received) == 16
            for answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["data"]["fault"] == "overloaded"
                assert answer.headers["retry-after"] == "1"
            assert grown < 160 << 20, f"RSS grew by {grown >> 20} MiB"


# -- 4. the legacy door reads an upstream's SSE answer with the same caps ------------------


async def test_the_legacy_door_stops_an_endless_event_at_the_json_limit(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    """One `data:` line that never ends: the legacy door's `tools/call` gets the same
    `invalid` fault a JSON answer over 64 MiB gets, well inside its timeout, and the hub
    holds at most that line (it grew by 1.3 GiB)."""
    async with (
        kept_alive(endless("sse")) as upstream,
        hub_process(nats_url, bucket, tmp_path, "--upstream", upstream.url()) as hub,
        httpx.AsyncClient(timeout=30) as client,
    ):
        before = hub.rss()
        legacy = LegacyClient(client, hub.url + "/legacy/mcp")
        await legacy.initialize()
        answer = await legacy.post("tools/call", {"name": "echo", "arguments": {}})
        grown = hub.rss() - before
    error = answer.json()["error"]
    assert error["data"] == {"upstream": "default", "fault": "invalid"}
    assert str(64 << 20) in error["message"]
    assert grown < 200 << 20, f"RSS grew by {grown >> 20} MiB"
