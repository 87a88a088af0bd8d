"""A hub restarted with `--checkpoint` starts from its saved snapshot and reads from NATS
only what changed meanwhile, and still answers exactly what the bucket holds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from bridge.jetstream import ensure_bucket
from bridge.wire import kv_subject
from tests.helpers import HubHarness, envelope, new_task_id, start_hub


async def put(js: Any, bucket: str, task_id: str, data: bytes) -> None:
    await js.publish(kv_subject(bucket, task_id), data)


async def started(nats_url: str, bucket: str, data_dir: Path, saved: Path) -> HubHarness:
    harness = await start_hub(nats_url, bucket, data_dir, checkpoint=saved)
    await harness.hub.source.wait_caught_up(10)
    return harness


async def checkpointed(
    js: Any, bucket: str, nats_url: str, tmp_path: Path, count: int
) -> tuple[Path, list[str]]:
    """`count` tasks in the bucket, and the checkpoint a hub wrote of them at its stop."""
    saved = tmp_path / "snapshot"
    ids = [new_task_id() for _ in range(count)]
    for tid in ids:
        await put(js, bucket, tid, envelope(tid))
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
    new = [new_task_id() for _ in range(6)]
    for tid in new:
        await put(js, bucket, tid, envelope(tid))

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
