"""deploy/nats/: the configs pass `nats-server -t`, take every password from the environment,
and run for real: three nodes on loopback form the JetStream cluster a bridge and a hub use."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from bridge import TaskBridge
from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.wire import DEFAULT_BUCKET, kv_stream
from hub.commands.embedded_nats import NatsServerProcess, nats_server_binary
from hub.config import Config
from hub.metrics import Metrics
from hub.store.cache import TaskCache
from hub.store.durability import read_sync_policy
from hub.store.source import NatsSource
from tests.helpers import eventually, free_port
from tests.test_deploy import DEPLOY, NATS_CONFIGS, env_example


def nats_environment() -> dict[str, str]:
    """What each NATS config needs from its environment, with env.example's passwords."""
    env = env_example()
    password = env["NATS_ROUTE_PASSWORD"]
    env["SERVER_NAME"] = "nats-1"
    for i in (1, 2, 3):
        env[f"NATS_ROUTE_{i}"] = f"nats://route:{password}@nats-{i}:6222"
    return env


@pytest.mark.parametrize("path", NATS_CONFIGS, ids=lambda p: p.name)
def test_nats_config_is_valid(path: Path) -> None:
    result = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(path)],
        env={**os.environ, **nats_environment()},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_nats_config_has_no_default_passwords() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    result = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(DEPLOY / "nats" / "accounts.conf")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0 and "variable reference" in result.stdout + result.stderr


def test_nats_cluster_conf_sets_its_durability_policy() -> None:
    """R3 plus an fsync before every ack, explained beside the setting; compose and
    Kubernetes both run this file (the running cluster below shows the server took it)."""
    conf = (DEPLOY / "nats" / "cluster.conf").read_text()
    jetstream = re.search(r"^jetstream \{(.*?)^\}", conf, re.S | re.M)
    assert jetstream is not None
    settings = re.findall(r"^\s*sync_interval:\s*(\S+)\s*$", jetstream.group(1), re.M)
    assert settings == ["always"], settings
    assert "R3" in jetstream.group(1) and "power cut" in jetstream.group(1)
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert '"--config", "/etc/nats/cluster.conf"' in compose
    assert '"--config", "/etc/nats/cluster.conf"' in (DEPLOY / "k8s" / "nats.yaml").read_text()
    assert 'TASKHUB_REPLICAS: "3"' in compose


@pytest.fixture
def nats_cluster(nats_nodes: list[NatsServerProcess]) -> list[str]:
    return [node.url for node in nats_nodes]


@pytest.fixture
def nats_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[NatsServerProcess]]:
    """Three nodes on loopback running deploy/nats/cluster.conf."""
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    # NatsServerProcess passes -sd (and the config may not name the store twice).
    conf, count = re.subn(
        r"^\s*store_dir:.*$", "", (DEPLOY / "nats" / "cluster.conf").read_text(), flags=re.M
    )
    assert count == 1
    (conf_dir / "cluster.conf").write_text(conf)
    shutil.copy(DEPLOY / "nats" / "accounts.conf", conf_dir)  # includes are relative
    env = nats_environment()
    routes = [free_port() for _ in range(3)]
    for i, port in enumerate(routes, 1):
        env[f"NATS_ROUTE_{i}"] = f"nats://route:{env['NATS_ROUTE_PASSWORD']}@127.0.0.1:{port}"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nodes: list[NatsServerProcess] = []
    try:
        for i, port in enumerate(routes, 1):
            monkeypatch.setenv("SERVER_NAME", f"nats-{i}")  # read when the node starts
            node = NatsServerProcess(
                tmp_path / f"nats-{i}",
                extra_args=[
                    *("-c", str(conf_dir / "cluster.conf")),
                    *("--cluster", f"nats://127.0.0.1:{port}", "-m", "-1"),
                    *("-P", str(tmp_path / f"nats-{i}.pid")),
                ],
            )
            nodes.append(node)
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def with_user(urls: list[str], user: str) -> list[str]:
    password = env_example()[f"NATS_{user.upper().replace('-', '_')}_PASSWORD"]
    return [url.replace("nats://", f"nats://{user}:{password}@") for url in urls]


async def test_nats_cluster_conf_forms_a_jetstream_cluster(
    nats_cluster: list[str], nats_nodes: list[NatsServerProcess]
) -> None:
    stream = kv_stream(DEFAULT_BUCKET)

    async def provisioned() -> bool:
        """As compose's nats-provision does: R3, once the meta leader is elected."""
        try:
            nc = await nats.connect(with_user(nats_cluster, "admin"), allow_reconnect=False)
        except Exception:
            return False
        try:
            js = nc.jetstream(timeout=2)
            await ensure_bucket(js, DEFAULT_BUCKET, replicas=3)
            await ensure_control_stream(js, replicas=3)
            info = await js.stream_info(stream)
            return info.cluster is not None and len(info.cluster.replicas or []) == 2
        except Exception:
            return False
        finally:
            await nc.close()

    await eventually(provisioned, timeout=30, interval=0.5)
    # a server on one node writes; the hub, given every node as compose does, reads
    passwords = env_example()
    bridge = await TaskBridge.connect(
        nats_cluster[1],
        "srv-1",
        user="srv-1",
        password=passwords["NATS_SRV_1_PASSWORD"],
        inbox_prefix="_INBOX_srv-1",
    )
    try:
        task = await bridge.create(owner="alice")
        config = Config(nats_user="hub", nats_password=passwords["NATS_HUB_PASSWORD"])
        metrics = Metrics()
        source = NatsSource(
            ",".join(nats_cluster),
            DEFAULT_BUCKET,
            TaskCache(),
            metrics,
            nats_options=config.nats_options(),
            monitor_url=nats_nodes[0].monitor_url,
        )
        await source.start()
        try:
            await source.wait_caught_up(10)
            assert await source.read_through(task.task_id) is not None
            # the durability the hub sees: R3, and the node fsyncs before every ack
            assert metrics.bucket_replicas.value() == 3
            assert metrics.control_replicas.value() == 3
            assert metrics.nats_sync_always.value() == 1
            for node in nats_nodes:
                assert node.monitor_url is not None
                assert read_sync_policy(node.monitor_url, 5) == "always"
        finally:
            await source.close()
    finally:
        await bridge.close()
