"""The hubs' shared record of upstream-kept tasks: a JetStream bucket only hubs write.

`<bucket>-upstream-tasks` (history 1, entries gone `retention` after their last write):

- `s.<h>`: the last observation of one task (`KeptRecord`: the upstream's name, the owner,
  the keyed hashes of the credentials the upstream answered, when, and the state). Every
  replica watches these and takes each into its `KeptTasks`; the stream sequence is the
  state's revision, so all replicas order observations alike.
- `l.<h>`: the lease of the one replica polling the task on its listeners' behalf: its
  name, written with a per-message TTL. Taking it is a create (it must not exist),
  keeping it an update at its last revision, so NATS arbitrates both; a replica that
  dies stops renewing and the TTL frees it (docs/front-door.md#polling-and-the-lease).
- `key`: the key of the credential hashes, made once by the first hub, never expiring.

`<h>` is a hash of the task id: an upstream's ids need not be valid NATS subject tokens.
Without the bucket (a NATS account that may not make it), each hub keeps its own record
and polls for its own listeners: it works, alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from bridge.jetstream import ensure_hub_bucket
from hub.front_door.kept_tasks import KeptRecord, KeptTasks

log = logging.getLogger("taskhub.kept")

_decode_record = msgspec.json.Decoder(KeptRecord).decode
KEY_ENTRY = "key"


def kept_bucket(bucket: str) -> str:
    return f"{bucket}-upstream-tasks"


def key_hash(task_id: str) -> str:
    return hashlib.blake2b(task_id.encode(), digest_size=16).hexdigest()


async def ensure_kept_bucket(js: Any, bucket: str, retention: float, replicas: int = 1) -> Any:
    """The shared bucket of task bucket `bucket` (made unless it exists)."""
    return await ensure_hub_bucket(js, kept_bucket(bucket), retention, replicas)


class KeptBucket:
    """This hub's side of the shared bucket: observations out and in, leases, the key."""

    def __init__(self, kept: KeptTasks, bucket: str, retention: float, replicas: int) -> None:
        self.kept = kept
        self.name = kept_bucket(bucket)
        self.bucket = bucket
        self.retention = retention
        self.replicas = replicas
        self.holder = secrets.token_hex(8)  # this replica, in the leases it holds
        self.kv: Any = None
        self.js: Any = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        return self.kv is not None

    async def start(self, js: Any) -> bytes:
        """Open (or make) the bucket and start taking observations in; the credential
        hash key, shared when the bucket is, else this process's own."""
        self.js = js
        try:
            self.kv = await ensure_kept_bucket(js, self.bucket, self.retention, self.replicas)
            key = await self._key()
        except Exception as exc:
            self.kv = None
            log.warning(
                "upstream tasks bucket %s unavailable (%s): each hub keeps and polls the "
                "upstream's tasks alone; provision it as in deploy/README.md",
                self.name,
                exc,
            )
            return secrets.token_bytes(32)
        watcher = await self.kv.watch("s.>")
        self._watch = asyncio.create_task(self._take_in(watcher))
        return key

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def _key(self) -> bytes:
        with contextlib.suppress(KeyNotFoundError):
            return bytes((await self.kv.get(KEY_ENTRY)).value)
        key = secrets.token_bytes(32)
        subject = f"$KV.{self.name}.{KEY_ENTRY}"
        headers = {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-TTL": "never"}
        with contextlib.suppress(Exception):  # another hub's came first: read it below
            await self.js.publish(subject, key, headers=headers)
        return bytes((await self.kv.get(KEY_ENTRY)).value)

    async def _take_in(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue  # the end of the values held at the start
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                # Rare (an upstream forgot a task): found by its hash among those held.
                task_hash = entry.key[2:]
                for task_id in self.kept.ids():
                    if key_hash(task_id) == task_hash:
                        self.kept.remove(task_id)
                continue
            with contextlib.suppress(msgspec.DecodeError):
                self.kept.apply(entry.revision, _decode_record(entry.value))

    async def observe(self, task_id: str, record: KeptRecord) -> int:
        """Share an observation; its revision (the bucket's sequence, or a local one
        when the bucket is away)."""
        if self.kv is not None:
            try:
                return int(await self.kv.put("s." + key_hash(task_id), msgspec.json.encode(record)))
            except Exception as exc:
                log.debug("upstream task %s not shared: %s", task_id, exc)
        return self.kept.local_revision()

    async def forget(self, task_id: str) -> None:
        """The upstream no longer has the task: gone for every replica."""
        self.kept.remove(task_id)
        if self.kv is not None:
            with contextlib.suppress(Exception):
                await self.kv.delete("s." + key_hash(task_id))

    async def lease(self, task_id: str, ttl: float) -> bool:
        """Take or renew the lease to poll `task_id`; False while another replica holds it."""
        if self.kv is None:
            return True  # alone: this hub polls for its own listeners
        key = "l." + key_hash(task_id)
        holder = self.holder.encode()
        try:
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                await self.kv.create(key, holder, msg_ttl=ttl)
                return True
            if entry.value != holder:
                return False
            # KeyValue.update takes no TTL: the same compare-and-set, published by hand.
            await self.js.publish(
                f"$KV.{self.name}.{key}",
                holder,
                headers={"Nats-Expected-Last-Subject-Sequence": str(entry.revision)},
                msg_ttl=ttl,
            )
            return True
        except KeyWrongLastSequenceError:
            return False  # another replica took it between the read and the write
        except Exception as exc:
            log.debug("lease of upstream task %s not taken: %s", task_id, exc)
            return False

    async def release(self, task_id: str) -> None:
        """Let another replica poll it now (this one has no listener left for it)."""
        if self.kv is None:
            return
        key = "l." + key_hash(task_id)
        with contextlib.suppress(Exception):
            entry = await self.kv.get(key)
            if entry.value == self.holder.encode():
                await self.kv.delete(key, last=entry.revision)
