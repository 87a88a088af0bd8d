"""The checkpoint: the snapshot cache kept in a file across restarts (`--checkpoint`).

The hub writes every cached task together with the bucket stream's sequence its watch
had applied: now and then while it runs (`--checkpoint-every`), and at shutdown. At start
it reads them back and the watch resumes after that sequence. With history 1 the stream
holds each key's latest value (or delete marker), so what it delivers from there is
exactly what changed since: a restart, after a clean stop or a power cut, reads that
instead of every task in the bucket.

The file is only a head start; the bucket stays the truth. It is used only whole and only
for the stream it was written from: the same bucket, the same stream creation time (a
bucket deleted and made anew is another stream), a sequence the stream has reached. A
file that is missing, cut short, corrupt, of another format or of another stream is set
aside with one log line, and the hub reads the whole bucket as it would without one.

The format is records, each its length, its CRC-32 and a msgpack payload, after MAGIC: a
head (bucket, stream, sequence, layout), then the tasks a slice per record, then an end
record with their count. So a running hub writes a slice per event-loop turn and never
holds the loop for the whole cache (hub/store/checkpointer.py), and a file missing its end is
known to be cut short.

Written atomically (a temporary file beside it, fsync, rename), mode 0600: it holds every
task's owner and state. Processes sharing one path (`--workers`) each write a whole file;
the last rename wins, and any whole file is a valid start for each of them.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from hub.store.cache import LAYOUT  # the cache's packed layout: values in another are not read

log = logging.getLogger("taskhub.checkpoint")

MAGIC = b"taskhub checkpoint 3\n"  # the format's version is part of it
_RECORD = struct.Struct(">II")  # a record's payload length and CRC-32
SLICE = 2048  # tasks per record: a running hub writes one per loop turn, so a turn stays short
_temporaries = itertools.count()  # each write its own temporary file


class _Head(msgspec.Struct, array_like=True):
    bucket: str
    stream_created: str
    seq: int
    layout: str


class _Tasks(msgspec.Struct, array_like=True, tag=1):
    task_ids: list[str]
    packed: list[bytes]  # each task as the cache holds it (hub/store/cache.py `pack`)


class _End(msgspec.Struct, array_like=True, tag=2):
    count: int  # tasks in all the records before


_head_decoder = msgspec.msgpack.Decoder(_Head)
_body_decoder = msgspec.msgpack.Decoder(_Tasks | _End)
_encode = msgspec.msgpack.Encoder().encode


@dataclass(frozen=True)
class Checkpoint:
    seq: int  # every bucket message up to this stream sequence is in the tasks
    task_ids: list[str]
    packed: list[bytes]


class Writer:
    """One checkpoint file on its way: the head at once, then `add` the tasks a slice at
    a time, then `commit` (the file replaces the one at `path`) or `abandon`."""

    def __init__(self, path: Path, *, bucket: str, stream_created: str, seq: int) -> None:
        self.path = path
        self.count = 0
        self.size = 0
        self._temporary = path.with_name(f".{path.name}.{os.getpid()}.{next(_temporaries)}.tmp")
        fd = os.open(self._temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._out = os.fdopen(fd, "wb")
        try:
            self._write(MAGIC)
            self._record(_encode(_Head(bucket, stream_created, seq, LAYOUT)))
        except BaseException:
            self.abandon()
            raise

    def add(self, task_ids: list[str], packed: list[bytes]) -> None:
        """One record of tasks (at most a few thousand: each is encoded in one go)."""
        self._record(_encode(_Tasks(task_ids, packed)))
        self.count += len(task_ids)

    def commit(self) -> int:
        """End the file, make it durable and put it in place; returns its size. Blocks on
        the disk (fsync): a running hub calls it in a thread."""
        try:
            self._record(_encode(_End(self.count)))
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()
            os.replace(self._temporary, self.path)
        except BaseException:
            self.abandon()
            raise
        with contextlib.suppress(OSError):  # the rename itself, durable too
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return self.size

    def abandon(self) -> None:
        """Leave the file at `path` as it was."""
        with contextlib.suppress(OSError):
            self._out.close()
        with contextlib.suppress(OSError):
            self._temporary.unlink()

    def _record(self, payload: bytes) -> None:
        self._write(_RECORD.pack(len(payload), zlib.crc32(payload)))
        self._write(payload)

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self.size += len(data)


def write(
    path: Path,
    *,
    bucket: str,
    stream_created: str,
    seq: int,
    task_ids: list[str],
    packed: list[bytes],
) -> int:
    """Replace the file at `path` with these tasks as of `seq`, at once; returns its size."""
    writer = Writer(path, bucket=bucket, stream_created=stream_created, seq=seq)
    try:
        for start in range(0, len(task_ids), SLICE):
            writer.add(task_ids[start : start + SLICE], packed[start : start + SLICE])
    except BaseException:
        writer.abandon()
        raise
    return writer.commit()


def read(path: Path, *, bucket: str, stream_created: str, last_seq: int) -> Checkpoint | None:
    """The tasks saved at `path`, if the file is whole and was written from this stream;
    None (with a log line saying why) otherwise."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        log.info("checkpoint: no file at %s yet; reading the whole bucket", path)
        return None
    except OSError as exc:
        set_aside(path, f"cannot be read ({exc.strerror or exc})")
        return None
    if not data.startswith(MAGIC):
        set_aside(path, "is not a checkpoint of this format")
        return None
    records = _records(memoryview(data), len(MAGIC))
    try:
        head = _head_decoder.decode(next(records))
        if head.layout != LAYOUT:
            set_aside(path, "holds tasks in another layout")
            return None
        if head.bucket != bucket or head.stream_created != stream_created:
            set_aside(path, "was written from another bucket stream")
            return None
        if head.seq > last_seq:
            set_aside(path, f"is ahead of the stream (seq {head.seq} > {last_seq})")
            return None
        task_ids: list[str] = []
        packed: list[bytes] = []
        for payload in records:
            body = _body_decoder.decode(payload)
            if isinstance(body, _End):
                if body.count != len(task_ids) or next(records, None) is not None:
                    raise _Damaged
                return Checkpoint(head.seq, task_ids, packed)
            if len(body.task_ids) != len(body.packed):
                raise msgspec.DecodeError("a record with more ids than tasks or fewer")
            task_ids += body.task_ids
            packed += body.packed
        raise _Damaged  # no end record
    except (_Damaged, StopIteration):
        set_aside(path, "is cut short or corrupt (checksum or length mismatch)")
    except msgspec.DecodeError as exc:
        set_aside(path, f"cannot be decoded ({exc})")
    return None


class _Damaged(Exception):
    """A record that is cut short or fails its checksum, or a missing end."""


def _records(data: memoryview, at: int) -> Iterator[memoryview]:
    """Each record's payload from `at` on; raises _Damaged at a damaged one."""
    while at < len(data):
        if at + _RECORD.size > len(data):
            raise _Damaged
        length, crc = _RECORD.unpack_from(data, at)
        at += _RECORD.size
        payload = data[at : at + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            raise _Damaged
        at += length
        yield payload


def remove_leftovers(path: Path) -> int:
    """Delete the temporary files that writers of `path` left when they died mid-write
    (each would be as large as the file); a live process's are kept. Returns how many."""
    removed = 0
    for temporary in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = temporary.name[len(path.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            with contextlib.suppress(OSError):
                temporary.unlink()
                removed += 1
    if removed:
        log.info("checkpoint: %d temporary files of writers gone since removed", removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def set_aside(path: Path, why: str) -> None:
    """Log why the file at `path` is not used; the hub reads the whole bucket instead."""
    log.warning("checkpoint %s %s; reading the whole bucket instead", path, why)
