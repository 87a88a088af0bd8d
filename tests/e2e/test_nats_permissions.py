"""deploy/nats/accounts.conf on a real nats-server: what each user may and may not do.

The hub and a server run their real code (NatsSource, TaskBridge) under their NATS users,
which proves the permissions are enough; raw publishes, subscriptions and JetStream API
requests then show what each user is refused. A refused publish or subscription is not
an exception in nats-py: the server answers `-ERR 'Permissions Violation ...'`, which
arrives at the connection's error callback, so each check waits for that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from bridge import FleetEvents, TaskBridge
from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.wire import CONTROL_STREAM, DEFAULT_BUCKET, control_subject, kv_stream, kv_subject
from hub.commands.embedded_nats import NatsServerProcess
from hub.config import Config
from hub.front_door.kept_bucket import KeptBucket, ensure_kept_bucket
from hub.front_door.kept_tasks import CredentialHasher, KeptTasks, task_from_result
from hub.legacy.sessions import Sessions, ensure_sessions_bucket
from hub.metrics import Metrics
from hub.store.cache import TaskCache
from hub.store.source import NatsSource
from tests.helpers import envelope, eventually, new_task_id

ACCOUNTS_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "accounts.conf"
USERS = ("admin", "hub", "srv-1", "srv-2")
BUCKET = DEFAULT_BUCKET  # accounts.conf names the default bucket's subjects
KV_STREAM = kv_stream(BUCKET)


def password_variable(user: str) -> str:
    return "NATS_" + user.upper().replace("-", "_") + "_PASSWORD"


@dataclass
class Cluster:
    """One nats-server running accounts.conf, its users' passwords, and its URL."""

    url: str
    passwords: dict[str, str]

    def user_url(self, user: str) -> str:
        return self.url.replace("nats://", f"nats://{user}:{self.passwords[user]}@")


@dataclass
class Conn:
    """A connection whose NATS errors (permission violations) are collected in order."""

    nc: Client
    errors: asyncio.Queue[Exception] = field(default_factory=asyncio.Queue)

    async def violation(self, *fragments: str) -> None:
        """The next error is a permissions violation naming every fragment."""
        error = await asyncio.wait_for(self.errors.get(), timeout=5)
        text = str(error).lower()  # nats-py lower-cases the server's -ERR text
        assert "permissions violation" in text, text
        for fragment in fragments:
            assert fragment.lower() in text, text

    async def refused(self, request: Awaitable[Any], *fragments: str) -> None:
        """Start a request the server will never answer, see it refused, then drop it."""
        task = asyncio.ensure_future(request)
        try:
            await self.violation(*fragments)
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # nats-server parses a variable's value as config: a bare `12-x…` is a date, `3K` a size,
    # `true` a bool, and the server refuses to start. A letter first keeps it a string.
    passwords = {user: "pw-" + secrets.token_urlsafe(16) for user in USERS}
    server = NatsServerProcess(
        tmp_path_factory.mktemp("nats-accounts"), extra_args=["-c", str(ACCOUNTS_CONF)]
    )
    # accounts.conf reads the passwords from nats-server's environment.
    with pytest.MonkeyPatch.context() as env:
        for user, password in passwords.items():
            env.setenv(password_variable(user), password)
        server.start()
    try:
        yield Cluster(server.url, passwords)
    finally:
        server.stop()


@pytest.fixture(scope="module")
async def provisioned(cluster: Cluster) -> Cluster:
    """The bucket and control stream exist, made by admin (no other user may create them)."""
    nc = await nats.connect(cluster.user_url("admin"))
    try:
        js = nc.jetstream()
        await ensure_bucket(js, BUCKET)
        await ensure_control_stream(js)
        await ensure_sessions_bucket(js, BUCKET)
        await ensure_kept_bucket(js, BUCKET, 3600)
    finally:
        await nc.close()
    return cluster


@contextlib.asynccontextmanager
async def connect(cluster: Cluster, user: str) -> AsyncIterator[Conn]:
    errors: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        await errors.put(exc)

    # A server's replies and pulled messages come to its own inbox prefix (accounts.conf).
    inbox = "_INBOX" if user in ("admin", "hub") else f"_INBOX_{user}"
    nc = await nats.connect(
        cluster.url,
        user=user,
        password=cluster.passwords[user],
        inbox_prefix=inbox,
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield Conn(nc, errors)
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def running_hub(cluster: Cluster) -> AsyncIterator[NatsSource]:
    """The hub's NATS side, authenticated as `taskhub serve --nats-user hub` would be."""
    config = Config(nats_user="hub", nats_password=cluster.passwords["hub"])
    source = NatsSource(
        cluster.url, BUCKET, TaskCache(), Metrics(), nats_options=config.nats_options()
    )
    await source.start()
    try:
        await source.wait_caught_up(5)
        yield source
    finally:
        await source.close()


def no_violations_logged(caplog: pytest.LogCaptureFixture) -> None:
    logged = [r.getMessage() for r in caplog.records if "violation" in r.getMessage().lower()]
    assert logged == []


async def test_server_writes_tasks_and_the_hub_reads_them(
    provisioned: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="taskhub.nats")
    async with connect(provisioned, "srv-1") as srv:
        bridge = await TaskBridge.attach(srv.nc, "srv-1", bucket=BUCKET)
        before = await bridge.create(owner="alice", ttl_ms=600_000)
        async with running_hub(provisioned) as hub:
            # the watch delivered the task written before the hub started...
            assert hub.cache.get(before.task_id) is not None
            after = await bridge.create(owner="alice")
            await bridge.working(after.task_id, status_message="step 2")
            # ...and a read-through (STREAM.MSG.GET) finds one written just now
            found = await hub.read_through(after.task_id)
            assert found is not None
            await eventually(lambda: hub.cache.get(after.task_id) is not None, timeout=5)
        await bridge.close()
        assert srv.errors.empty()
    no_violations_logged(caplog)


async def test_hub_control_message_reaches_only_the_owning_servers_consumer(
    provisioned: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="taskhub.nats")
    task_id = new_task_id()
    message = json.dumps({"op": "cancel", "taskId": task_id, "principal": "alice"}).encode()
    async with running_hub(provisioned) as hub:
        await hub.publish_control("srv-1", message, msg_id=task_id)
    async with connect(provisioned, "srv-1") as srv:
        # the durable consumer named after the server, filtered to its own subject
        js = srv.nc.jetstream(timeout=2)
        sub = await js.pull_subscribe(control_subject("srv-1"), "srv-1", stream=CONTROL_STREAM)
        received = await sub.fetch(1, timeout=5)
        while json.loads(received[0].data)["taskId"] != task_id:  # earlier tests' leftovers
            await received[0].ack()
            received = await sub.fetch(1, timeout=5)
        await received[0].ack_sync()
        assert srv.errors.empty()
    no_violations_logged(caplog)


async def test_server_cannot_consume_another_servers_control_subject(
    provisioned: Cluster,
) -> None:
    other = control_subject("srv-2")
    async with connect(provisioned, "srv-1") as srv:
        js = srv.nc.jetstream(timeout=2)
        # bind to or create srv-2's durable consumer
        await srv.refused(
            js.pull_subscribe(other, "srv-2", stream=CONTROL_STREAM),
            "$JS.API.CONSUMER.INFO.MCP_TASKS_CTL.srv-2",
        )
        # pull from it directly
        await srv.nc.publish("$JS.API.CONSUMER.MSG.NEXT.MCP_TASKS_CTL.srv-2", b"{}")
        await srv.nc.flush()
        await srv.violation("publish", "MSG.NEXT.MCP_TASKS_CTL.srv-2")
        # its own create subject, with srv-2's filter in the config: JetStream refuses
        for config in (
            {"filter_subject": other},
            {"filter_subjects": [other]},
        ):
            request = {
                "stream_name": CONTROL_STREAM,
                "config": {"name": "srv-1", "durable_name": "srv-1", "ack_policy": "explicit"}
                | config,
            }
            reply = await srv.nc.request(
                f"$JS.API.CONSUMER.CREATE.{CONTROL_STREAM}.srv-1.{control_subject('srv-1')}",
                json.dumps(request).encode(),
                timeout=2,
            )
            assert json.loads(reply.data)["error"]["err_code"] in (10131, 10137)
        # nor listen in on the subject, srv-2's inbox or the hub's inbox (pulled messages
        # and the hub's bucket watch are delivered there)
        for subject in (other, "_INBOX_srv-2.>", "_INBOX.>"):
            await srv.nc.subscribe(subject)
            await srv.nc.flush()
            await srv.violation("subscription", subject)


async def test_server_cannot_send_control_messages(provisioned: Cluster) -> None:
    async with connect(provisioned, "admin") as admin:
        js = admin.nc.jetstream()
        before = (await js.stream_info(CONTROL_STREAM)).state.last_seq
        async with connect(provisioned, "srv-1") as srv:
            for server in ("srv-1", "srv-2"):
                await srv.nc.publish(control_subject(server), b'{"op":"cancel"}')
                await srv.nc.flush()
                await srv.violation("publish", control_subject(server))
        assert (await js.stream_info(CONTROL_STREAM)).state.last_seq == before


async def test_server_cannot_list_the_bucket(provisioned: Cluster) -> None:
    """A server reads a task by id (compare-and-set); it cannot enumerate everyone's tasks."""
    async with connect(provisioned, "srv-1") as srv:
        js = srv.nc.jetstream(timeout=2)
        await srv.refused(
            js.subscribe(f"$KV.{BUCKET}.>", stream=KV_STREAM, ordered_consumer=True),
            f"$JS.API.CONSUMER.CREATE.{KV_STREAM}",
        )


async def test_hub_cannot_write_the_bucket_or_consume_control(provisioned: Cluster) -> None:
    task_id = new_task_id()
    async with connect(provisioned, "hub") as hub:
        await hub.nc.publish(kv_subject(BUCKET, task_id), envelope(task_id))
        await hub.nc.flush()
        await hub.violation("publish", f"$KV.{BUCKET}.{task_id}")
        js = hub.nc.jetstream(timeout=2)
        await hub.refused(
            js.pull_subscribe(control_subject("srv-1"), "srv-1", stream=CONTROL_STREAM),
            "$JS.API.CONSUMER.INFO.MCP_TASKS_CTL.srv-1",
        )
        # nor make streams (a stream config can republish into the bucket's subjects)
        await hub.refused(js.add_stream(name="SNEAKY", subjects=["sneaky.>"]), "STREAM.CREATE")
    async with connect(provisioned, "admin") as admin:
        with pytest.raises(NotFoundError):
            await admin.nc.jetstream().get_msg(KV_STREAM, subject=kv_subject(BUCKET, task_id))


async def test_hub_keeps_legacy_sessions_in_their_provisioned_bucket(
    provisioned: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_hub(provisioned) as source:

        class HubLike:  # what Sessions needs of the hub: its NATS side
            pass

        hub = HubLike()
        hub.source = source  # type: ignore[attr-defined]
        sessions = Sessions(hub, BUCKET, 1)
        await sessions.start()
        assert sessions.kv is not None  # opened, not made: the hub may make no stream
        session = await sessions.open("alice", {}, None)
        assert await sessions.find(session.id, "alice") == session
        await sessions.end(session)
        assert await sessions.find(session.id, "alice") is None
    no_violations_logged(caplog)


async def test_hub_shares_upstream_tasks_and_leases_in_their_provisioned_bucket(
    provisioned: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    seen: list[Any] = []
    async with running_hub(provisioned) as source:
        kept = KeptTasks(retention=60, limit=10, on_change=seen.append, on_remove=seen.append)
        bucket = KeptBucket(kept, BUCKET, 60, 1)
        key = await bucket.start(source.js)
        try:
            assert bucket.shared  # opened, not made: the hub may make no stream
            task = task_from_result(
                {
                    "taskId": "upstream-task-1",
                    "status": "working",
                    "createdAt": "2026-12-06T10:00:00+00:00",
                    "lastUpdatedAt": "2026-12-06T10:00:00+00:00",
                    "ttlMs": None,
                }
            )
            credential = CredentialHasher(key).of({"authorization": "Bearer t"})
            record = kept.record(task, "default", "anonymous", credential)
            revision = await bucket.observe(task.taskId, record)
            await eventually(lambda: kept.get(task.taskId) is not None)  # through the watch
            assert kept.get(task.taskId).snapshot.revision == revision  # type: ignore[union-attr]
            assert await bucket.lease(task.taskId, 2)
            assert await bucket.lease(task.taskId, 2)  # renewed
            await bucket.release(task.taskId)
        finally:
            await bucket.stop()
    no_violations_logged(caplog)


async def test_limit_any_server_may_write_any_task_key(provisioned: Cluster) -> None:
    """What NATS cannot enforce: task ids are one random token, so no subject permission
    separates one server's keys from another's (deploy/README.md, security model)."""
    async with connect(provisioned, "srv-1") as one, connect(provisioned, "srv-2") as two:
        task = await (await TaskBridge.attach(one.nc, "srv-1", bucket=BUCKET)).create(owner="a")
        ack = await two.nc.jetstream().publish(
            kv_subject(BUCKET, task.task_id),
            envelope(task.task_id, "cancelled", owner="a", server="srv-2"),
            stream=KV_STREAM,
        )
        assert ack.seq > task.revision
        assert one.errors.empty() and two.errors.empty()


async def test_a_server_announces_its_services_events_and_no_other(
    provisioned: Cluster,
) -> None:
    async with connect(provisioned, "hub") as hub, connect(provisioned, "srv-1") as srv:
        heard: asyncio.Queue[str] = asyncio.Queue()

        async def on_event(msg: Any) -> None:
            await heard.put(msg.subject)

        await hub.nc.subscribe("mcp.events.>", cb=on_event)  # what hub/push/fleet_events.py does
        await hub.nc.flush()
        await FleetEvents(srv.nc, "other").tools_changed()
        await srv.violation("publish", "mcp.events.other.tools.list_changed")
        await FleetEvents(srv.nc).tools_changed()
        assert await asyncio.wait_for(heard.get(), 5) == "mcp.events.default.tools.list_changed"
        assert heard.empty() and hub.errors.empty()
