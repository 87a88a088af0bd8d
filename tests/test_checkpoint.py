"""The checkpoint file (hub/store/checkpoint_file.py): what is written is read back whole, and a
file that is not whole, or not of this stream, is set aside rather than trusted."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.store import checkpoint_file
from hub.store.cache import STATUSES, TaskCache, pack, unpack
from hub.store.snapshot import TaskSnapshot
from tests.helpers import Recorder, envelope, new_task_id

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STREAM = {"bucket": "tasks", "stream_created": "2026-01-01T00:00:00+00:00"}


def cache_of(*values: tuple[str, bytes]) -> TaskCache:
    cache = TaskCache(clock=lambda: NOW)
    for revision, (task_id, value) in enumerate(values, start=1):
        assert cache.apply_put(task_id, revision, value) is not None
    return cache


def task(status: str = "working", **fields: object) -> tuple[str, bytes]:
    task_id = new_task_id()
    return task_id, envelope(task_id, status, **fields)  # type: ignore[arg-type]


def write(path: Path, cache: TaskCache, seq: int = 10) -> None:
    task_ids, packed = cache.packed()
    checkpoint_file.write(path, seq=seq, task_ids=task_ids, packed=packed, **STREAM)


def read(
    path: Path, last_seq: int = 10, stream: dict[str, str] | None = None
) -> checkpoint_file.Checkpoint | None:
    at = {**STREAM, **(stream or {})}
    return checkpoint_file.read(
        path, bucket=at["bucket"], stream_created=at["stream_created"], last_seq=last_seq
    )


def restored(saved: checkpoint_file.Checkpoint | None, now: float = NOW) -> TaskCache:
    assert saved is not None
    cache = TaskCache(clock=lambda: now)
    cache.restore(saved.task_ids, saved.packed)
    return cache


def test_tasks_come_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    values = [task(), task("completed", owner="bob"), task(ttl_ms=60_000, pollIntervalMs=250)]
    cache = cache_of(*values)
    write(path, cache, seq=9)
    saved = read(path)
    assert saved is not None and saved.seq == 9
    again = restored(saved)
    assert [again.get(t) for t, _ in values] == [cache.get(t) for t, _ in values]
    assert again.owned_by("bob") == cache.owned_by("bob") != []
    assert again.server_counts() == cache.server_counts()


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=40),
            st.text(max_size=20),
            st.sampled_from(STATUSES),
            st.one_of(st.none(), st.floats(min_value=NOW + 1, max_value=NOW + 1e9)),
            st.binary(max_size=300),
            st.one_of(st.none(), st.integers(min_value=0, max_value=2**53)),
            st.integers(min_value=1, max_value=2**63),
            st.booleans(),
        ),
        max_size=30,
        unique_by=lambda row: row[0],
    )
)
def test_any_packed_tasks_come_back_equal(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, str, str, float | None, bytes, int | None, int, bool]],
) -> None:
    path = tmp_path_factory.mktemp("cp") / "snapshot"
    snapshots = [
        TaskSnapshot(
            tid,
            owner or "o",
            "srv-\u00e9",
            revision,
            status,
            exp,
            # As the cache's bodies begin: the id, left out of what is held, and put back.
            b'{"taskId":"%s",%s' % (tid.encode(), body) if opens_with_id else body,
            poll,
        )
        for tid, owner, status, exp, body, poll, revision, opens_with_id in rows
    ]
    packed = [pack(s) for s in snapshots]
    assert [unpack(s.task_id, p) for s, p in zip(snapshots, packed, strict=True)] == snapshots
    checkpoint_file.write(
        path, seq=1, task_ids=[s.task_id for s in snapshots], packed=packed, **STREAM
    )
    again = restored(read(path))
    assert [again.get(s.task_id) for s in snapshots] == snapshots


def test_tasks_expired_while_down_are_left_behind(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    short, long = task(ttl_ms=1_000), task(ttl_ms=60_000)
    write(path, cache_of(short, long))
    again = restored(read(path), now=NOW + 1)
    assert again.get(short[0]) is None and again.get(long[0]) is not None
    assert len(again) == 1


def test_the_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    write(path, cache_of(task()))
    write(path, cache_of(task(), task()))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["snapshot"]  # no temporary file left
    assert len(restored(read(path))) == 2


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    first = task()
    write(path, cache_of(first))
    with pytest.raises(TypeError):  # not bytes: the encoder fails half-way
        checkpoint_file.write(path, seq=10, task_ids=["x"], packed=[object()], **STREAM)  # type: ignore[list-item]
    again = restored(read(path))
    assert again.get(first[0]) is not None
    assert sorted(os.listdir(tmp_path)) == ["snapshot"]


def test_values_that_are_not_packed_tasks_are_refused_whole() -> None:
    cache = cache_of(task())
    task_ids, packed = cache.packed()
    fresh = TaskCache(clock=lambda: NOW)
    for bad in (b"", packed[0][:20], b"\xff" * 40, packed[0][:33] + b"\xff\xfe" + packed[0][35:]):
        with pytest.raises(ValueError):
            fresh.restore([*task_ids, "other"], [*packed, bad])
        assert len(fresh) == 0
    with pytest.raises(ValueError):
        fresh.restore(task_ids, [])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda data: data[: len(data) // 2], "cut short or corrupt"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "cut short or corrupt"),
        (lambda data: data[:10], "not a checkpoint"),
        (lambda data: b"", "not a checkpoint"),
        (lambda data: b"taskhub checkpoint 0\n" + data[21:], "not a checkpoint"),
        (lambda data: data + b"\x00", "cut short or corrupt"),
    ],
)
def test_a_damaged_file_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, why: str
) -> None:
    path = tmp_path / "snapshot"
    write(path, cache_of(*(task() for _ in range(5))))
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        assert read(path) is None
    assert why in caplog.text and "reading the whole bucket" in caplog.text


def test_a_file_of_another_layout_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "snapshot"
    monkeypatch.setattr(checkpoint_file, "LAYOUT", "<QdqBHH working")  # as an older hub wrote
    write(path, cache_of(task()))
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        assert read(path) is None
    assert "another layout" in caplog.text


def record(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload


def test_a_checksummed_file_of_the_wrong_shape_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "snapshot"
    path.write_bytes(checkpoint_file.MAGIC + record(b"\x93\x01\x02\x03"))  # msgpack, not a head
    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        assert read(path) is None
    assert "cannot be decoded" in caplog.text


def test_tasks_written_a_slice_at_a_time_come_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_file, "SLICE", 2)
    path = tmp_path / "snapshot"
    cache = cache_of(*(task() for _ in range(7)))
    write(path, cache)
    again = restored(read(path))
    assert again.packed() == cache.packed()
    # Four records of tasks and the end: any one missing is a file cut short.
    data = path.read_bytes()
    records = []
    at = len(checkpoint_file.MAGIC)
    while at < len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        records.append(data[at : at + 8 + length])
        at += 8 + length
    assert len(records) == 1 + 4 + 1
    for missing in range(1, len(records)):
        kept = records[:missing] + records[missing + 1 :]
        path.write_bytes(checkpoint_file.MAGIC + b"".join(kept))
        assert read(path) is None, f"record {missing} left out went unnoticed"


def test_an_abandoned_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    first = cache_of(task())
    write(path, first)
    writer = checkpoint_file.Writer(path, seq=11, **STREAM)
    writer.add(*cache_of(task(), task()).packed())
    writer.abandon()
    assert restored(read(path)).packed() == first.packed()
    assert sorted(os.listdir(tmp_path)) == ["snapshot"]


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        ({"bucket": "other"}, "another bucket stream"),
        ({"stream_created": "2026-02-01T00:00:00+00:00"}, "another bucket stream"),
    ],
)
def test_a_file_of_another_stream_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: dict[str, str], why: str
) -> None:
    path = tmp_path / "snapshot"
    write(path, cache_of(task()))
    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        assert read(path, stream=stream) is None
    assert why in caplog.text


def test_a_file_ahead_of_the_stream_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "snapshot"
    write(path, cache_of(task()), seq=11)
    with caplog.at_level(logging.WARNING, "taskhub.checkpoint"):
        assert read(path, last_seq=10) is None
    assert "ahead of the stream" in caplog.text


def test_no_file_is_no_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "taskhub.checkpoint"):
        assert read(tmp_path / "absent") is None
    assert "no file" in caplog.text


def test_a_restored_cache_answers_and_expires_like_a_watched_one(tmp_path: Path) -> None:
    now = [NOW]
    values = [task(ttl_ms=5_000) for _ in range(3)]
    watched = cache_of(*values)
    path = tmp_path / "snapshot"
    write(path, watched)
    saved = read(path)
    assert saved is not None
    heard = Recorder()
    changes = heard.changes
    again = TaskCache(heard, clock=lambda: now[0])
    assert again.restore(saved.task_ids, saved.packed) == 3
    assert changes == []  # nobody listens before the hub has started
    now[0] += 5
    assert again.sweep() == 3 and len(again) == 0
    with pytest.raises(RuntimeError):
        watched.restore([], [])


@pytest.mark.parametrize("owner_length", [0xFFFE, 0xFFFF, 70_000])
def test_owners_of_any_length_are_packed_whole(owner_length: int) -> None:
    owner = "ü" * (owner_length // 2) + "o" * (owner_length % 2)
    tid = new_task_id()
    cache = cache_of((tid, envelope(tid, owner=owner, server="s" * 3)))
    snapshot = cache.get(tid)
    assert snapshot is not None and snapshot.owner == owner and snapshot.server == "sss"
    assert cache.owned_by(owner) == [snapshot] and cache.owned_by(owner[:-1]) == []
    again = TaskCache(clock=lambda: NOW)
    again.restore(*cache.packed())
    assert again.get(tid) == snapshot


def test_a_slice_holds_its_tasks_as_they_are_when_it_is_written() -> None:
    (gone, gone_value), (changed, changed_value), kept = task(), task(), task()
    cache = cache_of((gone, gone_value), (changed, changed_value), kept)
    task_ids = cache.task_ids()  # as a checkpoint under way copied them
    cache.apply_delete(gone, 10)
    assert cache.apply_put(changed, 11, envelope(changed, "completed")) is not None
    ids, packed = cache.packed_of(task_ids)
    assert ids == [changed, kept[0]]
    assert [unpack(tid, value).status for tid, value in zip(ids, packed, strict=True)] == [
        "completed",
        "working",
    ]


def test_temporary_files_of_dead_writers_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    write(path, cache_of(task()))
    dead = subprocess.Popen(["true"])  # its PID is free once it is reaped
    dead.wait()
    mine = tmp_path / f".snapshot.{os.getpid()}.0.tmp"  # this process has not written yet
    theirs = tmp_path / f".snapshot.{dead.pid}.7.tmp"
    living = tmp_path / f".snapshot.{os.getppid()}.3.tmp"  # a live writer's: kept
    other = tmp_path / ".other.1.0.tmp"
    for leftover in (mine, theirs, living, other):
        leftover.write_bytes(b"half a checkpoint")
    assert checkpoint_file.remove_leftovers(path) == 2
    assert sorted(os.listdir(tmp_path)) == sorted(["snapshot", living.name, other.name])
    assert read(path) is not None
