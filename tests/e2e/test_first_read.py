"""A hub with nothing cached reads its bucket in bulk first (hub/store/first_read/reader.py), and
loses nothing to it: not the values written meanwhile, not when the read is refused."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.wire import kv_stream, kv_subject
from hub.commands.embedded_nats import NatsServerProcess
from hub.metrics import Metrics
from hub.store.cache import TaskCache
from hub.store.first_read.worker import LaterHalf, cores
from hub.store.source import NatsSource
from tests.helpers import Recorder, envelope, eventually, free_port, new_task_id


async def put_many(nc: Any, js: Any, bucket: str, values: dict[str, bytes]) -> None:
    """Store every value (publishes in flight together), then wait until the stream has."""
    stream = kv_stream(bucket)
    before = (await js.stream_info(stream)).state.last_seq
    for task_id, data in values.items():
        await nc.publish(kv_subject(bucket, task_id), data)
    await nc.flush()

    async def stored() -> bool:
        return bool((await js.stream_info(stream)).state.last_seq >= before + len(values))

    await eventually(stored, timeout=30)


async def latest_revisions(js: Any, bucket: str, task_ids: list[str]) -> dict[str, int]:
    kv = await js.key_value(bucket)
    return {task_id: (await kv.get(task_id)).revision for task_id in task_ids}


def source_for(
    url: str, bucket: str, cache: TaskCache | None = None, split: bool = False, **options: Any
) -> NatsSource:
    """A source whose first read runs in one process, or (`split`) in two from any size."""
    return NatsSource(
        url,
        bucket,
        TaskCache() if cache is None else cache,
        Metrics(),
        nats_options=options,
        split_from=1 if split else 1 << 62,
    )


@pytest.fixture(params=[False, True], ids=["one-process", "two-processes"])
def split(request: pytest.FixtureRequest) -> bool:
    """Each first read twice: in the hub alone, and with a worker process reading the
    later half (hub/store/first_read/worker.py)."""
    if request.param and cores() < 2:
        pytest.skip("a split first read needs two cores")
    return bool(request.param)


def read_in(lines: list[str], count: int, split: bool) -> bool:
    """The first read's log line says it read `count` messages, split or not as asked."""
    worker = "of them in a worker process" in lines[0] if lines else False
    return (
        bool(lines)
        and lines[0].startswith(f"first read: {count} messages in")
        and (worker == split)
    )


async def filled(nc: Any, js: Any, bucket: str, count: int) -> list[str]:
    """`count` new working tasks in the bucket; their ids."""
    ids = [new_task_id() for _ in range(count)]
    await put_many(nc, js, bucket, {tid: envelope(tid) for tid in ids})
    return ids


def first_read_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("first read")]


async def test_a_hub_with_nothing_cached_reads_every_task_in_bulk(
    nc: Any, js: Any, bucket: str, nats_url: str, caplog: pytest.LogCaptureFixture, split: bool
) -> None:
    caplog.set_level(logging.INFO, logger="taskhub.nats")
    ids = await filled(nc, js, bucket, 20_000)
    done, deleted, purged, bad, misplaced = ids[:5]
    kv = await js.key_value(bucket)
    await kv.put(done, envelope(done, "completed"))
    await kv.delete(deleted)
    await kv.purge(purged)
    await kv.put(bad, b"{not json")
    await kv.put(misplaced, envelope(new_task_id()))
    # Pings every 50 ms: their answers reach the reader's parser between the frames.
    heard = Recorder()
    rejected = heard.rejections
    cache = TaskCache(heard)
    source = source_for(
        nats_url, bucket, cache, split, ping_interval=0.05, max_outstanding_pings=20
    )
    await source.start()
    try:
        await source.wait_caught_up(30)
        lines = first_read_lines(caplog)
        assert read_in(lines, len(ids), split), lines
        assert len(cache) == len(ids) - 4
        assert cache.get(done) is not None and cache.get(done).status == "completed"  # type: ignore[union-attr]
        assert [cache.get(tid) for tid in (deleted, purged, bad, misplaced)] == [None] * 4
        assert sorted(reason.value for reason in rejected) == ["key_mismatch", "malformed"]
        wanted = await latest_revisions(js, bucket, ids[5:200])
        assert {tid: cache.get(tid).revision for tid in wanted} == wanted  # type: ignore[union-attr]

        async def only_the_watch_consumer() -> bool:
            return bool((await js.stream_info(kv_stream(bucket))).state.consumer_count == 1)

        await eventually(only_the_watch_consumer, timeout=15)
    finally:
        await source.close()


async def test_a_server_that_cannot_be_reached_first_does_not_end_the_first_read(
    nc: Any, js: Any, bucket: str, nats_url: str, caplog: pytest.LogCaptureFixture, split: bool
) -> None:
    """nats-py reports each server it cannot reach while connecting, then tries the next:
    a cluster node down as the hub starts must not cut its first read short."""
    caplog.set_level(logging.INFO, logger="taskhub.nats")
    ids = await filled(nc, js, bucket, 300)
    down = f"nats://127.0.0.1:{free_port()}"
    source = source_for(f"{down},{nats_url}", bucket, split=split, dont_randomize=True)
    await source.start()
    try:
        await source.wait_caught_up(30)
        lines = first_read_lines(caplog)
        assert read_in(lines, len(ids), split), lines
        assert len(source.cache) == len(ids)
    finally:
        await source.close()


async def test_values_written_during_the_first_read_are_not_lost(
    nc: Any, js: Any, bucket: str, nats_url: str, caplog: pytest.LogCaptureFixture, split: bool
) -> None:
    caplog.set_level(logging.INFO, logger="taskhub.nats")
    ids = await filled(nc, js, bucket, 30_000)
    kv = await js.key_value(bucket)
    source = source_for(nats_url, bucket, split=split)
    rng = random.Random(7)
    created: list[str] = []
    finished: set[str] = set()

    async def write_meanwhile() -> None:
        while not source._caught_up.is_set():
            for _ in range(20):
                task_id = rng.choice(ids)
                if task_id not in finished:
                    finished.add(task_id)
                    await kv.put(task_id, envelope(task_id, "completed"))
                fresh = new_task_id()
                created.append(fresh)
                await kv.put(fresh, envelope(fresh))
            await asyncio.sleep(0)

    await source.start()
    writer = asyncio.create_task(write_meanwhile())
    try:
        await source.wait_caught_up(60)
        await writer
        assert first_read_lines(caplog), "no first read happened"
        assert finished and created, "nothing was written during the first read"
        everything = ids + created
        wanted = await latest_revisions(js, bucket, sorted(finished) + created)

        def current() -> bool:
            cache = source.cache
            return len(cache) == len(everything) and all(
                (s := cache.get(tid)) is not None and s.revision == rev
                for tid, rev in wanted.items()
            )

        await eventually(current, timeout=15)
        assert all(source.cache.get(tid).status == "completed" for tid in finished)  # type: ignore[union-attr]
    finally:
        writer.cancel()
        await source.close()


@pytest.fixture
async def no_pulls(tmp_path: Path) -> AsyncIterator[str]:
    """A nats-server whose user `hub` may do all but pull from a consumer."""
    config = tmp_path / "auth.conf"
    config.write_text(
        'authorization { users = [ { user: "hub", password: "pw", permissions: '
        '{ publish: { deny: ["$JS.API.CONSUMER.MSG.NEXT.>"] } } } ] }\n'
    )
    server = NatsServerProcess(tmp_path / "nats", extra_args=["-c", str(config)])
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


async def test_a_refused_first_read_leaves_the_reading_to_the_watch(
    no_pulls: str, caplog: pytest.LogCaptureFixture, split: bool
) -> None:
    caplog.set_level(logging.INFO, logger="taskhub.nats")
    bucket = "refused"
    nc = await nats.connect(no_pulls, user="hub", password="pw")
    try:
        js = nc.jetstream()
        await ensure_bucket(js, bucket)
        await ensure_control_stream(js)
        ids = await filled(nc, js, bucket, 500)
        source = source_for(no_pulls, bucket, split=split, user="hub", password="pw")
        await source.start()
        try:
            await source.wait_caught_up(30)
            assert sorted(source.cache.task_ids()) == sorted(ids)
            lines = first_read_lines(caplog)
            assert len(lines) == 1 and "ended early after 0 messages" in lines[0], lines
            assert "permissions violation" in lines[0]
        finally:
            await source.close()
    finally:
        await nc.close()


def workers_of(pid: int) -> list[int]:
    """The first-read worker processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        parent = next(line for line in status.splitlines() if line.startswith("PPid:"))
        if b"hub.store.first_read.worker" in cmdline and int(parent.split()[1]) == pid:
            found.append(int(entry.name))
    return found


async def test_a_worker_process_that_fails_costs_speed_not_a_task(
    nc: Any, js: Any, bucket: str, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its half is read by the watch instead: a worker told of credentials that do not
    exist cannot connect, and exits with an error."""
    if cores() < 2:
        pytest.skip("a split first read needs two cores")
    caplog.set_level(logging.INFO, logger="taskhub.nats")
    ids = await filled(nc, js, bucket, 2_000)
    source = NatsSource(
        nats_url,
        bucket,
        TaskCache(),
        Metrics(),
        plain_options={"user_credentials": "/nonexistent/taskhub.creds"},
        split_from=1,
    )
    await source.start()
    try:
        await source.wait_caught_up(30)
        assert sorted(source.cache.task_ids()) == sorted(ids)
        lines = first_read_lines(caplog)
        assert len(lines) == 1 and "the worker process failed" in lines[0], lines
        assert workers_of(os.getpid()) == []
    finally:
        await source.close()


async def test_a_hub_that_stops_mid_read_leaves_no_worker_behind(
    nc: Any, js: Any, bucket: str, nats_url: str
) -> None:
    if cores() < 2:
        pytest.skip("a split first read needs two cores")
    await filled(nc, js, bucket, 30_000)
    source = source_for(nats_url, bucket, split=True)
    await source.start()
    try:
        await eventually(lambda: bool(workers_of(os.getpid())), timeout=10, interval=0.005)
    finally:
        await source.close()
    assert workers_of(os.getpid()) == []


async def test_a_worker_whose_hub_is_gone_exits() -> None:
    """The hub killed (SIGKILL: no chance to stop its worker) closes the worker's stdin;
    the worker, here still connecting to a server that never answers, exits."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        job = {
            "servers": [f"nats://127.0.0.1:{silent.getsockname()[1]}"],
            "options": {"connect_timeout": 60},
            "stream": "KV_x",
            "bucket": "x",
            "start_seq": 1,
            "stop_seq": 10,
        }
        worker = await LaterHalf.start(job)
        assert worker.process.stdin is not None
        worker.process.stdin.close()  # what the kernel does for a killed hub
        async with asyncio.timeout(10):
            assert await worker.process.wait() == 3
    finally:
        silent.close()
