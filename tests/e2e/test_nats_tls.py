"""The hub on a nats-server that requires TLS (`--nats-tls-ca`): every connection, the
watch's and the first read's (its worker process's too) among them, reads its frames
through TLS; changes reach a listen stream in order, first read, watch and express lane
alike."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.wire import kv_subject
from hub.commands.embedded_nats import NatsServerProcess
from hub.config import Config, connect_options
from hub.metrics import Metrics
from hub.store.cache import TaskCache
from hub.store.first_read.worker import cores
from hub.store.source import NatsSource
from tests.helpers import envelope, eventually, new_task_id, start_hub


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "taskhub test nats")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "nats.pem", directory / "nats-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[tuple[NatsServerProcess, Path]]:
    cert, key = _self_signed(tmp_path)
    server = NatsServerProcess(
        tmp_path / "nats", extra_args=["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
    )
    server.start()
    yield server, cert
    server.stop()


async def test_a_hub_reads_every_change_over_tls(
    tls_nats: tuple[NatsServerProcess, Path], bucket: str, tmp_path: Path
) -> None:
    server, ca = tls_nats
    context = ssl.create_default_context(cafile=str(ca))
    nc = await nats.connect(server.url, tls=context)
    try:
        js = nc.jetstream()
        await ensure_bucket(js, bucket)
        await ensure_control_stream(js)
        before = new_task_id()  # stored before the hub starts: its first read finds it
        await js.publish(kv_subject(bucket, before), envelope(before, statusMessage="early"))
        hub = await start_hub(server.url, bucket, tmp_path / "hub", nats_tls_ca=ca)
        try:
            await hub.hub.source.wait_caught_up(10)
            # The watch reads in the TLS transport's protocol, not through nats-py's reader.
            watch = hub.hub.source._feed
            assert watch is not None and watch._cutter is not None and watch._cutter.attached
            assert (await hub.get_task(before)).json()["result"]["statusMessage"] == "early"
            tid = new_task_id()
            await js.publish(kv_subject(bucket, tid), envelope(tid, statusMessage="step 0"))
            await eventually(lambda: hub.hub.cache.get(tid) is not None)
            async with hub.listen([tid]) as stream:
                await stream.next()  # the ack
                assert (await stream.next())["params"]["statusMessage"] == "step 0"
                for step in range(1, 6):  # from the second on, through the express lane
                    data = envelope(tid, statusMessage=f"step {step}")
                    await js.publish(kv_subject(bucket, tid), data)
                    assert (await stream.next())["params"]["statusMessage"] == f"step {step}"
        finally:
            await hub.stop()
    finally:
        await nc.close()


async def test_a_first_read_worker_reads_over_tls_too(
    tls_nats: tuple[NatsServerProcess, Path], bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker process is told of the TLS files (a context cannot be sent) and makes
    its own context from them."""
    if cores() < 2:
        pytest.skip("a split first read needs two cores")
    caplog.set_level(logging.INFO, logger="taskhub.nats")
    server, ca = tls_nats
    plain = Config(nats_tls_ca=ca).nats_plain_options()
    nc = await nats.connect(server.url, tls=connect_options(plain)["tls"])
    try:
        js = nc.jetstream()
        await ensure_bucket(js, bucket)
        await ensure_control_stream(js)
        ids = [new_task_id() for _ in range(200)]
        for tid in ids:
            await js.publish(kv_subject(bucket, tid), envelope(tid))
        source = NatsSource(
            server.url,
            bucket,
            TaskCache(),
            Metrics(),
            nats_options=connect_options(plain),
            plain_options=plain,
            split_from=1,
        )
        await source.start()
        try:
            await source.wait_caught_up(30)
            assert sorted(source.cache.task_ids()) == sorted(ids)
            lines = [r.getMessage() for r in caplog.records if "first read" in r.getMessage()]
            assert len(lines) == 1 and "of them in a worker process" in lines[0], lines
        finally:
            await source.close()
    finally:
        await nc.close()
