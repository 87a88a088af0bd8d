"""The checkpoint: the snapshot cache kept in a file across restarts (`--checkpoint`).

At shutdown the hub writes every cached task together with the bucket stream's sequence
its watch had applied; at start it reads them back and the watch resumes after that
sequence. With history 1 the stream holds each key's latest value (or delete marker), so
what it delivers from there is exactly what changed while the hub was down: a restart reads
that instead of every task in the bucket.

The file is only a head start; the bucket stays the truth. It is used only whole and only
for the stream it was written from: the same bucket, the same stream creation time (a
bucket deleted and made anew is another stream), a sequence the stream has reached. A
file that is missing, cut short, corrupt, of another format or of another stream is set
aside with one log line, and the hub reads the whole bucket as it would without one.

Written atomically (a temporary file beside it, fsync, rename), mode 0600: it holds every
task's owner and state. Processes sharing one path (`--workers`) each write a whole file;
the last rename wins, and any whole file is a valid start for each of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from hub.cache import LAYOUT  # the cache's packed layout: values in another are not read

log = logging.getLogger("taskhub.checkpoint")

MAGIC = b"taskhub checkpoint 2\n"  # the format's version is part of it
_CRC = struct.Struct(">I")


class _File(msgspec.Struct, array_like=True):
    bucket: str
    stream_created: str
    seq: int
    layout: str
    task_ids: list[str]
    packed: list[bytes]  # each task as the cache holds it (hub/cache.py `pack`)


@dataclass(frozen=True)
class Checkpoint:
    seq: int  # every bucket message up to this stream sequence is in the tasks
    task_ids: list[str]
    packed: list[bytes]


def write(
    path: Path,
    *,
    bucket: str,
    stream_created: str,
    seq: int,
    task_ids: list[str],
    packed: list[bytes],
) -> int:
    """Replace the file at `path` with these tasks as of `seq`; returns its size."""
    payload = msgspec.msgpack.encode(_File(bucket, stream_created, seq, LAYOUT, task_ids, packed))
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC)
            out.write(_CRC.pack(zlib.crc32(payload)))
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself, durable too
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return len(MAGIC) + _CRC.size + len(payload)


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
    head = len(MAGIC) + _CRC.size
    if not data.startswith(MAGIC):
        set_aside(path, "is not a checkpoint of this format")
        return None
    payload = memoryview(data)[head:]
    if len(data) < head or _CRC.unpack_from(data, len(MAGIC))[0] != zlib.crc32(payload):
        set_aside(path, "is cut short or corrupt (checksum mismatch)")
        return None
    try:
        saved = msgspec.msgpack.decode(payload, type=_File)
    except msgspec.DecodeError as exc:
        set_aside(path, f"cannot be decoded ({exc})")
        return None
    if saved.layout != LAYOUT:
        set_aside(path, "holds tasks in another layout")
        return None
    if saved.bucket != bucket or saved.stream_created != stream_created:
        set_aside(path, "was written from another bucket stream")
        return None
    if saved.seq > last_seq:
        set_aside(path, f"is ahead of the stream (seq {saved.seq} > {last_seq})")
        return None
    return Checkpoint(saved.seq, saved.task_ids, saved.packed)


def set_aside(path: Path, why: str) -> None:
    """Log why the file at `path` is not used; the hub reads the whole bucket instead."""
    log.warning("checkpoint %s %s; reading the whole bucket instead", path, why)
