"""A hub restarted with `--checkpoint` starts from its saved snapshot and reads from NATS
only what changed meanwhile, and still answers exactly what the bucket holds."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError

from bridge.jetstream import ensure_bucket
from bridge.wire import kv_stream, kv_subject
from hub.store import checkpoint_file
from tests.e2e.test_serve import taskhub_command
from tests.helpers import HubHarness, envelope, eventually, free_port, new_task_id, start_hub


async def put(js: Any, bucket: str, task_id: str, data: bytes) -> None:
    await js.publish(kv_subject(bucket, task_id), data)


async def put_tasks(js: Any, bucket: str, count: int) -> list[str]:
    """`count` new working tasks in the bucket; their ids."""
    ids = [new_task_id() for _ in range(count)]
    for tid in ids:
        await put(js, bucket, tid, envelope(tid))
    return ids


async def running(
    nats_url: str, bucket: str, tmp_path: Path, saved: Path, every: float
) -> HubHarness:
    """A hub that writes its checkpoint to `saved` every `every` seconds."""
    return await start_hub(
        nats_url, bucket, tmp_path / "a", checkpoint=saved, checkpoint_every=every
    )


async def started(nats_url: str, bucket: str, data_dir: Path, saved: Path) -> HubHarness:
    harness = await start_hub(nats_url, bucket, data_dir, checkpoint=saved)
    await harness.hub.source.wait_caught_up(10)
    return harness


async def checkpointed(
    js: Any, bucket: str, nats_url: str, tmp_path: Path, count: int
) -> tuple[Path, list[str]]:
    """`count` tasks in the bucket, and the checkpoint a hub wrote of them at its stop."""
    saved = tmp_path / "snapshot"
    ids = await put_tasks(js, bucket, count)
    first = await started(nats_url, bucket, tmp_path / "a", saved)
    await first.stop()
    return saved, ids


def accepted_from_watch(harness: HubHarness) -> int:
    return int(sum(harness.hub.metrics.kv_updates.values.values()))


async def status_of(harness: HubHarness, task_id: str) -> str | None:
    answer = (await harness.get_task(task_id)).json()
    return None if "error" in answer else str(answer["result"]["status"])


async def test_a_restart_reads_only_the_changes_made_while_it_was_down(
    js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    saved = tmp_path / "snapshot"
    kept, finished, deleted = new_task_id(), new_task_id(), new_task_id()
    for tid in (kept, finished, deleted):
        await put(js, bucket, tid, envelope(tid))
    first = await started(nats_url, bucket, tmp_path / "a", saved)
    assert len(first.hub.cache) == 3
    await first.stop()
    assert saved.stat().st_size > 0

    # While no hub runs: one task finishes, one is deleted, one is created.
    await put(js, bucket, finished, envelope(finished, "completed"))
    await (await js.key_value(bucket)).delete(deleted)
    created = new_task_id()
    await put(js, bucket, created, envelope(created, "input_required"))

    second = await started(nats_url, bucket, tmp_path / "b", saved)
    try:
        # Two values and one delete marker came from NATS; the unchanged task from the file.
        assert accepted_from_watch(second) == 2
        assert second.hub.metrics.read_through.values == {}
        assert await status_of(second, kept) == "working"
        assert await status_of(second, finished) == "completed"
        assert await status_of(second, created) == "input_required"
        assert await status_of(second, deleted) is None
        assert len(second.hub.cache) == 3
        # The restored task still follows the bucket: its next change is pushed.
        async with second.listen([kept]) as stream:
            await stream.next()  # acknowledged
            assert (await stream.next())["params"]["status"] == "working"
            await put(js, bucket, kept, envelope(kept, "completed"))
            assert (await stream.next())["params"]["status"] == "completed"
    finally:
        await second.stop()


async def test_a_checkpoint_of_a_bucket_made_anew_is_not_trusted(
    js: Any, bucket: str, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved, old = await checkpointed(js, bucket, nats_url, tmp_path, 5)

    # The bucket is deleted and made again, with as many messages as before and more:
    # its sequence alone would not tell the streams apart.
    await js.delete_key_value(bucket)
    await ensure_bucket(js, bucket)
    new = await put_tasks(js, bucket, 6)

    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        second = await started(nats_url, bucket, tmp_path / "b", saved)
    try:
        assert "another bucket stream" in caplog.text
        assert sorted(second.hub.cache.packed()[0]) == sorted(new)
        assert await status_of(second, old[0]) is None
    finally:
        await second.stop()


async def test_a_damaged_checkpoint_costs_a_full_read_not_a_task(
    js: Any, bucket: str, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved, ids = await checkpointed(js, bucket, nats_url, tmp_path, 20)
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) - 40])  # a power cut while copying it, say

    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        second = await started(nats_url, bucket, tmp_path / "b", saved)
    try:
        assert "cut short or corrupt" in caplog.text
        assert accepted_from_watch(second) == 20  # every task read from the bucket
        assert all([await status_of(second, tid) == "working" for tid in ids])
    finally:
        await second.stop()
    # Its clean stop wrote a whole checkpoint again.
    third = await started(nats_url, bucket, tmp_path / "c", saved)
    try:
        assert accepted_from_watch(third) == 0 and len(third.hub.cache) == 20
    finally:
        await third.stop()


async def test_a_hub_cut_off_mid_run_restarts_from_its_last_checkpoint_exactly(
    js: Any, bucket: str, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints written while tasks change, a slice per loop turn: the file as a power
    cut would leave it, with the writes after it, gives back exactly what the bucket holds."""
    monkeypatch.setattr(checkpoint_file, "SLICE", 1)  # a loop turn per task: writes land between
    saved = tmp_path / "snapshot"
    ids = await put_tasks(js, bucket, 400)
    first = await running(nats_url, bucket, tmp_path, saved, 0.05)
    kv = await js.key_value(bucket)
    stop = asyncio.Event()

    async def keep_writing() -> None:
        # Updates, deletes and new tasks, all the while checkpoints are written.
        for round_ in itertools.count():
            if stop.is_set():
                return
            tid = random.choice(ids)
            if round_ % 7 == 0:
                await kv.delete(tid)
            elif round_ % 5 == 0:
                ids.append(new_task_id())
                await put(js, bucket, ids[-1], envelope(ids[-1]))
            else:
                await put(js, bucket, tid, envelope(tid, "input_required"))

    writing = asyncio.create_task(keep_writing())
    try:
        await first.hub.source.wait_caught_up(10)
        written = first.hub.metrics.checkpoint_written
        await eventually(lambda: written.value() > 0, timeout=20)
        since = written.value()
        await eventually(lambda: written.value() > since, timeout=20)  # one more, mid-writes
        cut = tmp_path / "as-the-power-cut-left-it"
        shutil.copyfile(saved, cut)
    finally:
        stop.set()
        await writing
    try:
        # What the cut loses: a few writes after the file.
        for tid in random.sample(ids, 5):
            await put(js, bucket, tid, envelope(tid, "completed"))
    finally:
        await first.stop()

    second = await started(nats_url, bucket, tmp_path / "b", cut)
    try:
        truth: dict[str, str] = {}
        for tid in set(ids):
            with contextlib.suppress(KeyNotFoundError):
                entry = await kv.get(tid)
                truth[tid] = json.loads(entry.value)["task"]["status"]
        held = {tid: snapshot.status for tid in ids if (snapshot := second.hub.cache.get(tid))}
        assert held == truth
        assert accepted_from_watch(second) < len(truth)  # not a full read of the bucket
    finally:
        await second.stop()


async def test_taskhub_serve_killed_outright_restarts_from_its_checkpoint(
    js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    saved = tmp_path / "snapshot"
    ids = await put_tasks(js, bucket, 30)
    port = free_port()
    args = ["serve", "--port", str(port), "--nats-url", nats_url, "--bucket", bucket]
    args += ["--data-dir", str(tmp_path / "a"), "--checkpoint", str(saved)]
    args += ["--checkpoint-every", "0.1"]
    proc = await asyncio.create_subprocess_exec(*taskhub_command(), *args)
    try:
        await eventually(saved.exists, timeout=20)
    finally:
        proc.kill()  # SIGKILL: no stop, no checkpoint at shutdown
        await proc.wait()
    await put(js, bucket, ids[0], envelope(ids[0], "completed"))

    second = await started(nats_url, bucket, tmp_path / "b", saved)
    try:
        assert accepted_from_watch(second) == 1  # the one change, not the 30 tasks
        assert await status_of(second, ids[0]) == "completed"
        assert await status_of(second, ids[1]) == "working"
    finally:
        await second.stop()


async def test_a_checkpoint_the_disk_refuses_is_counted_and_the_next_one_written(
    js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    saved = folder / "snapshot"
    tid = new_task_id()
    await put(js, bucket, tid, envelope(tid))
    folder.rmdir()  # gone after start-up checked it: every write fails
    harness = await running(nats_url, bucket, tmp_path, saved, 0.05)
    try:
        metrics = harness.hub.metrics
        await eventually(lambda: metrics.checkpoint_failures.value() >= 2, timeout=20)
        assert metrics.checkpoint_written.value() == 0
        assert await status_of(harness, tid) == "working"  # the hub goes on serving
        folder.mkdir()
        await eventually(lambda: metrics.checkpoint_written.value() > 0, timeout=20)
        assert saved.exists()
    finally:
        await harness.stop()


async def test_a_bucket_made_anew_while_running_is_what_the_next_checkpoint_holds(
    js: Any, bucket: str, nats_url: str, tmp_path: Path
) -> None:
    saved = tmp_path / "snapshot"
    await put_tasks(js, bucket, 5)  # the old stream's
    first = await running(nats_url, bucket, tmp_path, saved, 0.05)
    try:
        await first.hub.source.wait_caught_up(10)
        written = first.hub.metrics.checkpoint_written
        await eventually(lambda: written.value() > 0, timeout=20)
        # As many messages as before: the new stream reaches the sequence the file holds.
        await js.delete_key_value(bucket)
        await ensure_bucket(js, bucket)
        new = await put_tasks(js, bucket, 5)
        info = await js.stream_info(kv_stream(bucket))
        assert info.created is not None

        def holds_the_new_stream() -> bool:
            saved_now = checkpoint_file.read(
                saved,
                bucket=bucket,
                stream_created=info.created.isoformat(),
                last_seq=info.state.last_seq,
            )
            return saved_now is not None and sorted(saved_now.task_ids) == sorted(new)

        await eventually(holds_the_new_stream, timeout=30)
    finally:
        await first.stop()
    second = await started(nats_url, bucket, tmp_path / "b", saved)
    try:
        assert accepted_from_watch(second) == 0  # the file was of the new stream
        assert sorted(second.hub.cache.task_ids()) == sorted(new)
    finally:
        await second.stop()


async def test_a_stop_during_a_checkpoint_leaves_one_whole_file(
    js: Any, bucket: str, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_file, "SLICE", 1)  # a write takes hundreds of loop turns
    saved = tmp_path / "snapshot"
    ids = await put_tasks(js, bucket, 300)
    first = await running(nats_url, bucket, tmp_path, saved, 0.01)
    changing = True

    async def keep_changing() -> None:  # so that checkpoints keep coming
        while changing:
            await put(js, bucket, ids[0], envelope(ids[0], "input_required"))
            await asyncio.sleep(0.005)

    writer = asyncio.create_task(keep_changing())
    try:
        await first.hub.source.wait_caught_up(10)
        await eventually(lambda: any(tmp_path.glob(".snapshot.*.tmp")), timeout=20, interval=0)
    finally:
        changing = False
        await writer
        await first.stop()  # most likely with a write under way
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []
    second = await started(nats_url, bucket, tmp_path / "b", saved)
    try:
        assert accepted_from_watch(second) == 0 and len(second.hub.cache) == 300
    finally:
        await second.stop()
