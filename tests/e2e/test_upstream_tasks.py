"""Tasks an upstream keeps itself, behind the hub (docs/front-door.md#tasks-the-upstream-keeps).

The upstream is `examples/own_store` (a Tasks server that keeps its tasks in memory and
writes nothing to NATS) on a loopback port; the hub fronts it with `--upstream`. Clients are
the `mcp` Python client and httpx; each check polls with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from nats.js.errors import KeyNotFoundError, NotFoundError

from bridge import TaskBridge
from bridge.wire import CONTROL_STREAM
from examples.fleet.tasks_client import CreateTaskResult, HubTasks, TaskCalls
from hub.front_door.kept_bucket import kept_bucket, key_hash
from hub.settings import UpstreamSpec
from tests.cluster import HubProcess
from tests.e2e.own_store import call, fronted, get, hub_before, own_store
from tests.e2e.raw_http import Received, json_reply, kept_alive
from tests.e2e.test_legacy_endpoint import LegacyClient
from tests.helpers import (
    TASKS_EXT,
    HubHarness,
    eventually,
    listening,
    mint_token,
    rpc,
    start_hub,
)

pytestmark = pytest.mark.timeout(60)
SECRET = "s" * 32


async def create(harness: HubHarness, tool: str, args: dict[str, Any], **headers: str) -> str:
    body = rpc("tools/call", {"name": tool, "arguments": args}, id="create")
    response = await call(harness, body, **{"Mcp-Name": tool, **headers})
    assert response.status_code == 200, response.text
    result = _result_of(response)
    assert result["resultType"] == "task", result
    return str(result["taskId"])


def _result_of(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                import json

                return json.loads(line[5:])["result"]  # type: ignore[no-any-return]
    return response.json()["result"]  # type: ignore[no-any-return]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- a client at the hub's URL --------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-hub", "two-replicas"])
@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_the_python_client_follows_a_task_the_upstream_keeps(
    sse: bool, replicas: int, nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(sse=sse, poll_interval_ms=100) as (_, url),
        fronted(nats_url, bucket, tmp_path, url, replicas) as (front, base),
    ):
        async with Client(base + "/mcp", extensions=[TaskCalls()]) as client:
            created = await client.session.call_tool(
                "slow", {"ms": 600, "value": "made upstream"}, allow_claimed=True
            )
        assert isinstance(created, CreateTaskResult), created
        async with HubTasks().connect(base + "/mcp", timeout=10) as tasks:
            states = [state async for state in tasks.follow(created.task_id)]
        assert [s["status"] for s in states][-1] == "completed", states
        assert states[-1]["result"]["content"] == [{"type": "text", "text": "made upstream"}]
        # The steps between were pushed as the hub saw them: more than the first and last.
        assert len({s.get("statusMessage") for s in states}) >= 3, states
        assert front.hub.upstream_tasks.holds(created.task_id)


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-hub", "two-replicas"])
async def test_the_python_client_answers_and_cancels_tasks_the_upstream_keeps(
    replicas: int, nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(poll_interval_ms=100) as (server, url),
        fronted(nats_url, bucket, tmp_path, url, replicas) as (_front, base),
    ):
        async with Client(base + "/mcp", extensions=[TaskCalls()]) as client:
            asked = await client.session.call_tool(
                "ask", {"question": "Ship?", "ms": 100}, allow_claimed=True
            )
            slow = await client.session.call_tool("slow", {"ms": 60_000}, allow_claimed=True)
        assert isinstance(asked, CreateTaskResult) and isinstance(slow, CreateTaskResult)

        async def accept(request: dict[str, Any]) -> dict[str, Any]:
            assert request["params"]["message"] == "Ship?"
            return {"action": "accept", "content": {"ok": True}}

        async with HubTasks().connect(base + "/mcp", timeout=10) as tasks:
            result = await tasks.finish(asked, accept)  # follows, answers when asked
            await tasks.cancel(slow.task_id)
            cancelled = await tasks.get(slow.task_id)
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["confirm"] == {"action": "accept", "content": {"ok": True}}
        assert server.task(asked.task_id)["status"] == "completed"  # type: ignore[index]
        assert cancelled["status"] == "cancelled"
        assert server.task(slow.task_id)["status"] == "cancelled"  # type: ignore[index]


async def test_many_pollers_cost_the_upstream_one_read_per_interval(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(poll_interval_ms=200) as (server, url),
        # The hub's pacing of each caller (D20) off: every poller here is "anonymous".
        hub_before(nats_url, bucket, tmp_path, url, poll_burst=0) as front,
    ):
        task_id = await create(front, "slow", {"ms": 60_000})
        server.reset_stats()
        clients, rounds = 20, 8

        async def poller() -> None:
            for _ in range(rounds):
                answer = await get(front, task_id)
                assert answer["result"]["status"] == "working", answer
                await asyncio.sleep(0.2)  # the client's own pace: its task's pollIntervalMs

        started = time.monotonic()
        await asyncio.gather(*(poller() for _ in range(clients)))
        elapsed = time.monotonic() - started
        reads = server.stats["tasks/get"]
        # 160 polls; the upstream read about once per 200 ms, not once per poll.
        assert reads <= elapsed / 0.2 + 3, (reads, elapsed)
        assert reads * 10 <= clients * rounds, reads


async def test_a_listen_stream_gets_each_change_the_hub_sees_and_ends_at_the_terminal_one(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(poll_interval_ms=100) as (server, url),
        hub_before(nats_url, bucket, tmp_path, url) as front,
    ):
        task_id = await create(front, "slow", {"ms": 60_000})
        async with front.listen([task_id]) as events:
            ack = await events.next()
            assert ack["params"]["notifications"]["taskIds"] == [task_id], ack
            first = await events.next()
            assert first["params"]["taskId"] == task_id and first["params"]["status"] == "working"
            server.set_status(task_id, "working", message="half way")
            seen = await events.until(lambda m: m["params"].get("statusMessage") == "half way")
            assert seen["params"]["status"] == "working"
            server.set_status(task_id, "completed", result={"content": []})
            done = await events.until(lambda m: m["params"]["status"] == "completed")
            assert done["params"]["result"] == {"content": []}
        # Nobody follows it any more: the hub stops reading it.
        await eventually(lambda: not front.hub.upstream_tasks._polling)


async def test_update_and_cancel_reach_the_upstream_and_the_next_get_shows_them(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(poll_interval_ms=5_000) as (server, url),
        hub_before(nats_url, bucket, tmp_path, url, default_poll_interval=5.0) as front,
    ):
        # Made at the upstream itself, and first read through the hub once it asks.
        direct = HubHarness(front.hub, front.server, front.task, url[: -len("/mcp")], front.client)
        asked = await create(direct, "ask", {"question": "Go?", "ms": 60_000})
        await eventually(lambda: server.task(asked)["status"] == "input_required")  # type: ignore[index]
        state = await get(front, asked)
        assert state["result"]["status"] == "input_required"
        answer = {"confirm": {"action": "accept", "content": {"ok": True}}}
        body = rpc("tasks/update", {"taskId": asked, "inputResponses": answer}, id="u")
        acked = await call(front, body)
        result = acked.json()["result"]  # the upstream's own ack, as it came
        assert result["resultType"] == "complete"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "own-store"
        # Read anew after the ack, though the state is younger than its 5 s interval.
        assert (await get(front, asked))["result"]["status"] == "working"

        slow = await create(front, "slow", {"ms": 60_000})
        assert (await get(front, slow))["result"]["status"] == "working"
        cancelled = await call(front, rpc("tasks/cancel", {"taskId": slow}, id="c"))
        assert cancelled.json()["result"]["resultType"] == "complete"
        assert (await get(front, slow))["result"]["status"] == "cancelled"
        assert server.task(slow)["status"] == "cancelled"  # type: ignore[index]


async def test_a_task_the_hub_never_saw_is_asked_of_the_upstream_and_learned(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with own_store() as (_server, url):
        spec = UpstreamSpec("own", url)  # at /servers/own/mcp: /mcp is the hub alone
        harness = await start_hub(nats_url, bucket, tmp_path, upstreams=(spec,))
        try:
            await harness.hub.source.wait_caught_up(10)
            direct = HubHarness(
                harness.hub, harness.server, harness.task, url[: -len("/mcp")], harness.client
            )
            before, other = (
                await create(direct, "slow", {"ms": 60_000}),
                await create(direct, "slow", {"ms": 60_000}),
            )
            # At a plain /mcp (no upstream) the hub knows nothing of it.
            assert (await get(harness, before))["error"]["code"] == -32602
            named = HubHarness(
                harness.hub,
                harness.server,
                harness.task,
                harness.url + "/servers/own",
                harness.client,
            )
            learned = await get(named, before)
            assert (
                learned["result"]["taskId"] == before and learned["result"]["status"] == "working"
            )
            assert harness.hub.upstream_tasks.holds(before)
            # Learned: read at every endpoint by a caller the upstream answered.
            assert (await get(harness, before))["result"]["taskId"] == before
            assert (await get(harness, other))["error"]["code"] == -32602
        finally:
            await harness.stop()


async def test_an_upstreams_not_found_removes_the_task(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(poll_interval_ms=100) as (server, url),
        hub_before(nats_url, bucket, tmp_path, url) as front,
    ):
        task_id = await create(front, "slow", {"ms": 60_000})
        assert front.hub.upstream_tasks.holds(task_id)
        del server.store.entries[task_id]  # the upstream forgot it (a restart, its TTL)
        await eventually(
            lambda: (
                not front.hub.upstream_tasks.kept.get(task_id).fresh(  # type: ignore[union-attr]
                    time.time(), 1.0
                )
            )
        )
        answer = await get(front, task_id)
        assert answer["error"]["code"] == -32602
        assert not front.hub.upstream_tasks.holds(task_id)


# -- credentials never widen access --------------------------------------------------------


async def test_another_credential_never_reads_the_cached_state(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(tokens={"tok-a", "tok-b"}, poll_interval_ms=60_000) as (_server, url),
        hub_before(nats_url, bucket, tmp_path, url) as front,
    ):
        task_id = await create(front, "slow", {"ms": 60_000}, **bearer("tok-a"))
        assert (await get(front, task_id, **bearer("tok-a")))["result"]["taskId"] == task_id
        # Fresh in the cache (60 s interval), yet B is asked of the upstream, which says no.
        refused = await get(front, task_id, **bearer("tok-b"))
        assert refused["error"]["code"] == -32602, refused
        async with listening(front, [task_id], **bearer("tok-b")) as (_, events):
            ack = await events.next()
            assert ack["params"]["notifications"]["taskIds"] == []
        # No credential at all: the upstream's own 401 and challenge, as it sent them.
        response = await call(front, rpc("tasks/get", {"taskId": task_id}))
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")


async def test_with_hub_auth_another_principal_gets_not_found_even_from_an_open_upstream(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    alice, bob = mint_token(SECRET, "alice"), mint_token(SECRET, "bob")
    async with (
        own_store(poll_interval_ms=100) as (server, url),  # open: it would answer anyone
        hub_before(nats_url, bucket, tmp_path, url, jwt_secret=SECRET) as front,
    ):
        task_id = await create(front, "slow", {"ms": 60_000}, **bearer(alice))
        assert (await get(front, task_id, **bearer(alice)))["result"]["status"] == "working"
        refused = await get(front, task_id, **bearer(bob))
        assert refused["error"]["code"] == -32602, refused
        async with listening(front, [task_id], **bearer(bob)) as (_, events):
            ack = await events.next()
            assert ack["params"]["notifications"]["taskIds"] == []
        steer = rpc("tasks/cancel", {"taskId": task_id}, id="c")
        assert (await call(front, steer, **bearer(bob))).json()["error"]["code"] == -32602
        assert server.task(task_id)["status"] == "working"  # type: ignore[index]


async def test_no_credential_reaches_nats_or_the_log(
    nats_url: str, bucket: str, tmp_path: Path, nc: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="taskhub")
    tokens = {"tok-secret-aaaa", "tok-secret-bbbb"}
    js = nc.jetstream()
    control_from = (await js.stream_info(CONTROL_STREAM)).state.last_seq + 1
    async with (
        own_store(tokens=tokens, poll_interval_ms=100) as (_server, url),
        hub_before(nats_url, bucket, tmp_path, url) as front,
    ):
        for token in tokens:
            task_id = await create(front, "ask", {"ms": 100}, **bearer(token))
            await get(front, task_id, **bearer(token))
            async with listening(front, [task_id], **bearer(token)) as (_, events):
                await events.next()
                await events.next()
                body = rpc(
                    "tasks/update",
                    {"taskId": task_id, "inputResponses": {"confirm": {"action": "decline"}}},
                    id="u",
                )
                await call(front, body, **bearer(token))
                await events.until(lambda m: m["params"]["status"] == "completed")
        # Every stream this hub could write: its buckets (tasks, upstream tasks, legacy
        # sessions) whole, and what reached the shared control stream meanwhile.
        stored = b""
        scanned = []
        names = [f"KV_{bucket}", f"KV_{kept_bucket(bucket)}", f"KV_{bucket}-legacy-sessions"]
        for name in [*names, CONTROL_STREAM]:
            try:
                state = (await js.stream_info(name)).state
            except NotFoundError:
                continue  # never made (the legacy door was not used)
            first = state.first_seq
            if name == CONTROL_STREAM:
                first = max(control_from, first)
            scanned.append(name)
            for seq in range(first, state.last_seq + 1):
                with contextlib.suppress(Exception):
                    msg = await js.get_msg(name, seq)
                    stored += (msg.data or b"") + repr(msg.headers).encode()
        assert f"KV_{kept_bucket(bucket)}" in scanned and stored
        logged = caplog.text
        for token in tokens:
            assert token.encode() not in stored
            assert token not in logged


# -- the snapshot's tasks stay the snapshot's ----------------------------------------------


async def test_a_task_written_through_nats_is_never_asked_of_the_upstream(
    nats_url: str, bucket: str, tmp_path: Path, nc: Any
) -> None:
    async with (
        own_store() as (server, url),
        hub_before(nats_url, bucket, tmp_path, url) as front,
    ):
        async with await TaskBridge.attach(nc, "srv-1", bucket=bucket) as bridge:
            record = await bridge.create(owner="anonymous")
        answer = await get(front, record.task_id)
        assert answer["result"]["taskId"] == record.task_id
        assert server.stats["tasks/get"] == 0
        assert not front.hub.upstream_tasks.holds(record.task_id)
        assert TASKS_EXT


# -- two replicas, one lease ---------------------------------------------------------------


async def test_two_replicas_share_the_task_and_one_polls_until_it_dies(
    nats_url: str, bucket: str, tmp_path: Path, nc: Any
) -> None:
    """A client's requests spread over replica A (a `taskhub serve` process) and B; both
    stream the task; only the lease holder reads the upstream; A killed outright, B takes
    the polling over within the lease's bound and its listener sees the task end."""
    async with own_store(poll_interval_ms=200) as (server, url):
        a = HubProcess(tmp_path / "a", nats_url, bucket, "--upstream", url)
        a.start()
        try:
            async with (
                hub_before(nats_url, bucket, tmp_path / "b", url) as b,
                httpx.AsyncClient(timeout=10) as client,
            ):
                await a.wait_ready(client)
                at_a = HubHarness(b.hub, b.server, b.task, a.url, client)
                task_id = await create(at_a, "slow", {"ms": 60_000})
                assert (await get(b, task_id))["result"]["status"] == "working"  # B knows it
                cancel_me = await create(b, "slow", {"ms": 60_000})
                cancelled = await call(at_a, rpc("tasks/cancel", {"taskId": cancel_me}, id="c"))
                assert cancelled.json()["result"]["resultType"] == "complete"
                assert (await get(b, cancel_me))["result"]["status"] == "cancelled"

                lease = await nc.jetstream().key_value(kept_bucket(bucket))
                key = "l." + key_hash(task_id)
                async with at_a.listen([task_id], id="LA") as on_a:
                    await on_a.next()  # the ack
                    await eventually(lambda: _holder(lease, key), timeout=5)
                    assert await _holder(lease, key) != b.hub.upstream_tasks.bucket.holder
                    async with b.listen([task_id], id="LB") as on_b:
                        await on_b.next()
                        await on_b.next()  # the current state
                        server.reset_stats()
                        started = time.monotonic()
                        server.set_status(task_id, "working", message="both see it")
                        for events in (on_a, on_b):
                            await events.until(
                                lambda m: m["params"].get("statusMessage") == "both see it"
                            )
                        await asyncio.sleep(1.0)  # let polling run: one reader, not two
                        reads = server.stats["tasks/get"]
                        assert reads <= (time.monotonic() - started) / 0.2 + 2, reads

                        a.kill()  # no lease given back: NATS expires it
                        killed = time.monotonic()
                        server.set_status(task_id, "completed", result={"content": []})
                        done = await on_b.until(
                            lambda m: m["params"]["status"] == "completed", timeout=10
                        )
                        took = time.monotonic() - killed
                        print(f"takeover: the terminal state came {took:.2f} s after the kill")
                        assert done["params"]["result"] == {"content": []}
                        # The bound: the lease's TTL (2 s at 200 ms) + one interval + NATS's
                        # expiry tick (1 s).
                        assert took <= 2 + 0.2 + 1 + 0.5, took
                assert await _holder(lease, key) in (None, b.hub.upstream_tasks.bucket.holder)
        finally:
            a.kill()
            a.stop()


async def _holder(kv: Any, key: str) -> str | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return None if entry.value is None else bytes(entry.value).decode()


# -- an upstream that answers badly ----------------------------------------------------------

TASK_STATE = {
    "taskId": "raw-task-0000000001",
    "status": "working",
    "createdAt": "2026-12-06T10:00:00+00:00",
    "lastUpdatedAt": "2026-12-06T10:00:00+00:00",
    "ttlMs": 60_000,
}
BAD_STATES = {
    "unknown status": {**TASK_STATE, "status": "exploded"},
    "completed without a result": {**TASK_STATE, "status": "completed"},
    "another task": {**TASK_STATE, "taskId": "raw-task-0000000002"},
    "no timestamps": {"taskId": TASK_STATE["taskId"], "status": "working"},
    "not an object": ["working"],
}


@pytest.mark.parametrize("bad", sorted(BAD_STATES))
async def test_a_state_that_breaks_the_wire_rules_is_an_invalid_fault_never_recorded(
    bad: str, nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async def answer(request: Received) -> bytes:
        return json_reply(
            {"jsonrpc": "2.0", "id": json.loads(request.body)["id"], "result": BAD_STATES[bad]}
        )

    async with (
        kept_alive(answer) as upstream,
        hub_before(nats_url, bucket, tmp_path, upstream.url()) as front,
    ):
        task_id = str(TASK_STATE["taskId"])
        answered = await get(front, task_id)
        assert answered["error"]["data"] == {"upstream": "default", "fault": "invalid"}, answered
        assert not front.hub.upstream_tasks.holds(task_id)
        # Nor through a tools/call: a CreateTaskResult that breaks the rules passes on
        # untouched (the client judges it) and is not recorded.
        body = rpc("tools/call", {"name": "x", "arguments": {}}, id="t")
        response = await call(front, body, **{"Mcp-Name": "x"})
        assert response.status_code == 200
        assert not front.hub.upstream_tasks.holds(task_id)


# -- the 2025-11-25 door -------------------------------------------------------------------


async def test_a_legacy_client_follows_answers_cancels_and_lists_tasks_the_upstream_keeps(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        own_store(tokens={"tok-a", "tok-b"}, poll_interval_ms=100) as (server, url),
        hub_before(nats_url, bucket, tmp_path, url) as front,
    ):
        client = LegacyClient(front.client, front.url + "/legacy/mcp")
        other = LegacyClient(front.client, front.url + "/legacy/mcp")
        for legacy, token in ((client, "tok-a"), (other, "tok-b")):
            legacy.extra = bearer(token)
            await legacy.initialize()
        created = await client.call(
            "tools/call", {"name": "ask", "arguments": {"question": "Go?", "ms": 100}, "task": {}}
        )
        asked = created["task"]["taskId"]
        assert server.task(asked) is not None  # made at the upstream, kept by the hub
        got = await client.call("tasks/get", {"taskId": asked})
        assert got["taskId"] == asked
        async with client.stream("tasks/result", {"taskId": asked}) as messages:
            async for message in messages:
                if message.get("method") == "elicitation/create":
                    assert message["params"]["message"] == "Go?"
                    answer = {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "result": {"action": "accept", "content": {"ok": True}},
                    }
                    posted = await client.http.post(
                        client.url, json=answer, headers=client.headers()
                    )
                    assert posted.status_code == 202
                elif "result" in message or "error" in message:
                    final = message
                    break
        assert final["result"]["structuredContent"]["confirm"]["content"] == {"ok": True}
        assert server.task(asked)["status"] == "completed"  # type: ignore[index]

        slow = await client.call(
            "tools/call", {"name": "slow", "arguments": {"ms": 60_000}, "task": {}}
        )
        slow_id = slow["task"]["taskId"]
        cancelled = await client.call("tasks/cancel", {"taskId": slow_id})
        assert cancelled["status"] == "cancelled"
        assert server.task(slow_id)["status"] == "cancelled"  # type: ignore[index]

        listed = {t["taskId"] for t in (await client.call("tasks/list"))["tasks"]}
        assert {asked, slow_id} <= listed
        # Another credential: nothing listed, nothing read, nothing cancelled.
        assert (await other.call("tasks/list"))["tasks"] == []
        refused = (await other.post("tasks/get", {"taskId": asked})).json()
        assert refused["error"]["code"] == -32602
