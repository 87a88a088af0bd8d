"""deploy/ checked offline: every file parses, agrees with the code, and passes the tools.

Each tool judges its files when it is installed and needs no daemon or cluster (`docker
compose config`, `nginx -t`, `kubectl kustomize`, `nats-server -t`); without it, that one
check is skipped with the reason. Kubernetes objects are validated against the schemas
bundled in the `kubernetes-validate` package. The NATS cluster config and the router
config are also run for real on loopback: three nats-server nodes form a JetStream
cluster, and nginx routes by `Mcp-Method` and passes SSE frames on as they come, uncompressed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import nats
import pytest
import yaml

from bridge import TaskBridge
from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.wire import DEFAULT_BUCKET, kv_stream
from hub.cache import TaskCache
from hub.config import Config, add_serve_options
from hub.embedded_nats import NatsServerProcess, nats_server_binary
from hub.metrics import Counter, Gauge, Metrics
from hub.nats_source import NatsSource
from tests.helpers import HubHarness, eventually

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / "env.example"
NGINX_CONF = DEPLOY / "router" / "nginx.conf"
NATS_CONFIGS = sorted((DEPLOY / "nats").glob("*.conf"))
K8S_MANIFESTS = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIGS = sorted((DEPLOY / "prometheus").glob("prometheus*.yml"))
DASHBOARD = DEPLOY / "grafana" / "taskhub-dashboard.json"
# Kubernetes versions the manifests must fit: the oldest supported here, and the newest
# the validator knows.
K8S_VERSIONS = ("1.29", "latest")

# Every file under deploy/ and the test that checks it: a new file needs a check.
CHECKED = {
    "README.md": "test_readme_names_every_file",
    "Dockerfile": "test_dockerfile_*",
    "Dockerfile.dockerignore": "test_dockerignore_sends_what_the_build_copies",
    "docker-compose.yml": "test_compose_*",
    "env.example": "test_env_example_defines_every_variable",
    "router/nginx.conf": "test_router_*",
    "nats/cluster.conf": "test_nats_*",
    "nats/accounts.conf": "test_nats_* and tests/e2e/test_nats_permissions.py",
    "prometheus/prometheus.yml": "test_prometheus_configs",
    "prometheus/prometheus-kubernetes.yml": "test_prometheus_configs",
    "prometheus/alerts.yml": "test_alert_rules",
    "grafana/taskhub-dashboard.json": "test_dashboard_*",
    **{f"k8s/{p.name}": "test_k8s_*" for p in K8S_MANIFESTS},
    "k8s/kustomization.yaml": "test_k8s_kustomization_*",
}


# -- helpers ---------------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    return [doc for path in K8S_MANIFESTS for doc in load_yaml_docs(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def env_example(include_commented: bool = False) -> dict[str, str]:
    """KEY=VALUE lines of deploy/env.example (and `# KEY=VALUE` ones, if asked)."""
    pattern = r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$"
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(pattern, line.strip())
        if match and (include_commented or not match.group(1)):
            values[match.group(2)] = match.group(3)
    return values


def nats_conf_variables(path: Path) -> set[str]:
    """Variables a NATS config takes from the environment: referenced, not defined."""
    text = re.sub(r'"[^"]*"', '""', path.read_text())  # "$JS.API..." is not a variable
    text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    referenced = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", text))
    defined = set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", text, re.MULTILINE))
    return referenced - defined


def nats_environment() -> dict[str, str]:
    """What each NATS config needs from its environment, with env.example's passwords."""
    env = env_example()
    password = env["NATS_ROUTE_PASSWORD"]
    env["SERVER_NAME"] = "nats-1"
    for i in (1, 2, 3):
        env[f"NATS_ROUTE_{i}"] = f"nats://route:{password}@nats-{i}:6222"
    return env


def serve_option_variables() -> set[str]:
    """Every TASKHUB_* variable `taskhub serve` reads."""
    parser = argparse.ArgumentParser()
    add_serve_options(parser, {})
    return {
        "TASKHUB_" + option[2:].upper().replace("-", "_")
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def metric_names() -> set[str]:
    return {m.name for m in vars(Metrics()).values() if isinstance(m, Counter | Gauge)}


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\btaskhub_[a-z0-9_]+\b", expr))


def balanced(expr: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"[^"]*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


# -- every file ------------------------------------------------------------------------


def test_every_deploy_file_is_checked() -> None:
    files = {str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*") if p.is_file()}
    files = {f for f in files if "__pycache__" not in f and f != ".env"}  # a local secret
    assert files == set(CHECKED)


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(DEPLOY.rglob("*")) if p.suffix in (".yml", ".yaml")],
    ids=lambda p: str(p.relative_to(DEPLOY)),
)
def test_yaml_parses(path: Path) -> None:
    assert load_yaml_docs(path)


def test_readme_names_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    missing = [name for name in CHECKED if name != "README.md" and name not in readme]
    assert missing == []


# -- the image -------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_from_a_wheel() -> None:
    instructions = dockerfile_instructions()
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith("AS builder")
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim") in instructions
    assert froms[-1] == "${PYTHON_IMAGE}"
    runs = " ".join(args for keyword, args in instructions if keyword == "RUN")
    assert "pip wheel ." in runs and "python -m venv" in runs
    assert any(k == "COPY" and a.startswith("--from=builder") for k, a in final_stage())


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    stage = dict(final_stage())
    user = stage["USER"].split(":")[0]
    assert user not in ("", "root", "0")
    assert stage["EXPOSE"] == "8080"
    assert json.loads(stage["ENTRYPOINT"]) == ["taskhub", "serve"]
    interval, _, command = stage["HEALTHCHECK"].partition("CMD ")
    assert "--interval" in interval
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"] and "/healthz" in argv[2]
    compile(argv[2], "HEALTHCHECK", "exec")
    env = dict(
        pair.split("=", 1)
        for keyword, args in final_stage()
        if keyword == "ENV"
        for pair in args.split()
    )
    assert env["TASKHUB_HOST"] == "0.0.0.0"
    assert {k for k in env if k.startswith("TASKHUB_")} <= serve_option_variables()


async def test_dockerfile_healthcheck_probes_a_live_hub(hub: HubHarness) -> None:
    argv = json.loads(dict(final_stage())["HEALTHCHECK"].partition("CMD ")[2])
    port = urlsplit(hub.url).port

    async def exit_code(target_port: int | None) -> int:
        env = {**os.environ, "TASKHUB_PORT": str(target_port)}
        process = await asyncio.create_subprocess_exec(sys.executable, *argv[1:], env=env)
        return await asyncio.wait_for(process.wait(), timeout=10)

    assert await exit_code(port) == 0
    assert await exit_code(free_port()) != 0  # nobody listens there


def test_dockerignore_sends_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"  # an allow-list: nothing else reaches the builder
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for keyword, args in dockerfile_instructions()
        if keyword == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert copied and copied <= included
    assert all((ROOT / path).exists() for path in copied)


# -- docker compose --------------------------------------------------------------------


def nats_nodes(services: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in services.items() if str(s.get("image", "")).startswith("nats:")}


def hub_services(services: dict[str, Any]) -> dict[str, Any]:
    return {
        n: s
        for n, s in services.items()
        if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile" and "entrypoint" not in s
    }


def test_compose_runs_three_jetstream_nodes() -> None:
    nodes = nats_nodes(compose()["services"])
    assert sorted(nodes) == ["nats-1", "nats-2", "nats-3"]
    for name, node in nodes.items():
        major, minor = (int(x) for x in node["image"].split(":")[1].split("-")[0].split(".")[:2])
        assert (major, minor) >= (2, 11), node["image"]
        assert "--jetstream" in node["command"] or "-js" in node["command"]
        assert any(v.endswith(":/data") for v in node["volumes"]), name
        assert node["environment"]["SERVER_NAME"] == name
        assert nats_conf_variables(DEPLOY / "nats" / "cluster.conf") | nats_conf_variables(
            DEPLOY / "nats" / "accounts.conf"
        ) <= set(node["environment"])
        routes = [node["environment"][f"NATS_ROUTE_{i}"] for i in (1, 2, 3)]
        assert sorted(urlsplit(r).hostname for r in routes) == sorted(nodes)


def test_compose_hubs_use_every_nats_node() -> None:
    services = compose()["services"]
    hubs = hub_services(services)
    assert sorted(hubs) == ["hub-1", "hub-2"]
    assert (ROOT / "deploy" / "Dockerfile").is_file()
    for hub in hubs.values():
        assert (DEPLOY / hub["build"]["context"]).resolve() == ROOT
        env = hub["environment"]
        assert set(env) <= serve_option_variables()
        # nats-py takes a list; the hub splits TASKHUB_NATS_URL on commas (nats_source.py)
        urls = [urlsplit(u.strip()) for u in env["TASKHUB_NATS_URL"].split(",")]
        assert sorted(u.hostname for u in urls) == sorted(nats_nodes(services))
        assert {(u.scheme, u.username, u.port) for u in urls} == {("nats", None, 4222)}
        assert env["TASKHUB_NATS_USER"] == "hub"
        assert env["TASKHUB_NATS_PASSWORD"] == "${NATS_HUB_PASSWORD}"
        # auth is passed through only when set, so an unset secret is never ""
        assert env["TASKHUB_JWT_SECRET"] is None and env["TASKHUB_INSECURE_NO_AUTH"] is None
        assert hub["read_only"] is True


def test_compose_mounts_existing_files() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {volume}"


def test_env_example_defines_every_variable() -> None:
    text = COMPOSE.read_text()
    interpolated = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", text))
    passed_through = {
        key
        for service in hub_services(compose()["services"]).values()
        for key, value in service["environment"].items()
        if value is None
    }
    documented = env_example(include_commented=True)
    assert interpolated | passed_through <= set(documented)
    assert set(documented) <= interpolated | passed_through


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    return [docker, "compose"] if probe.returncode == 0 else None


MONITORING = ("--profile", "monitoring")  # validate the opt-in services too


def test_compose_config_is_valid() -> None:
    command = compose_command()
    if command is None:
        pytest.skip("no `docker compose` client here (the check needs no daemon)")
    result = subprocess.run(
        [*command, "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE), *MONITORING, "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# -- the router ------------------------------------------------------------------------


def test_router_config_is_sse_safe() -> None:
    conf = NGINX_CONF.read_text()
    for directive in (
        "proxy_buffering off;",
        "proxy_cache off;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "gzip off;",
    ):
        assert directive in conf
    timeout = re.search(r"proxy_read_timeout (\d+)([smh]);", conf)
    assert timeout is not None
    seconds = int(timeout.group(1)) * {"s": 1, "m": 60, "h": 3600}[timeout.group(2)]
    assert seconds > 10 * Config().keepalive  # many keep-alives fit before a timeout
    routing = re.search(r"map \$http_mcp_method \$mcp_upstream \{(.*?)\}", conf, re.DOTALL)
    assert routing is not None
    rules = dict(line.split() for line in routing.group(1).strip().rstrip(";").split(";\n"))
    rules = {key: value.rstrip(";") for key, value in rules.items()}
    assert rules == {
        "default": "mcp_servers",
        "~^tasks/": "taskhub",
        '"subscriptions/listen"': "taskhub",
    }


def test_router_upstreams_are_compose_services() -> None:
    conf = NGINX_CONF.read_text()
    services = compose()["services"]
    upstreams = dict(re.findall(r"upstream (\w+) \{(.*?)\}", conf, re.DOTALL))
    hubs = set(re.findall(r"server ([\w-]+):8080", upstreams["taskhub"]))
    assert hubs == set(hub_services(services))
    servers = set(re.findall(r"server ([\w-]+):\d+", upstreams["mcp_servers"]))
    assert servers == {"mcp-servers"} and servers <= set(services)
    assert NGINX_CONF.name in " ".join(services["router"]["volumes"])


def local_router_config(tmp: Path, listen: int, hub: int, servers: int) -> Path:
    """deploy/router/nginx.conf with loopback upstreams and paths under `tmp`."""
    conf = NGINX_CONF.read_text()
    for pattern, replacement in (
        (r"server hub-\d+:8080", f"server 127.0.0.1:{hub}"),
        (r"server mcp-servers:8000", f"server 127.0.0.1:{servers}"),
        (r"listen 8080;", f"listen 127.0.0.1:{listen};"),
        (r" /tmp/", f" {tmp}/"),
    ):
        conf, count = re.subn(pattern, replacement, conf)
        assert count, f"{pattern} not in {NGINX_CONF}"
    path = tmp / "nginx.conf"
    path.write_text(conf)
    return path


def nginx_binary() -> str:
    found = shutil.which("nginx")
    if found is None:
        pytest.skip("no nginx binary here (apt-get install nginx-light to run this check)")
    return found


def test_router_config_syntax(tmp_path: Path) -> None:
    nginx = nginx_binary()
    conf = local_router_config(tmp_path, free_port(), free_port(), free_port())
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class FakeUpstream:
    """An HTTP/1.1 upstream that says who it is; a listen call gets an SSE stream whose
    second frame waits for `release`, to prove the router passes the first one at once."""

    name: str
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # the router keeps upstream connections alive
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in head[1:] if line)
                }
                await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((head[0], headers))
                if headers.get("mcp-method") == "subscriptions/listen":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b"data: first\n\n")
                    )
                    await writer.drain()
                    await self.release.wait()
                    writer.write(chunk(b"data: last\n\n") + b"0\r\n\r\n")
                else:
                    body = json.dumps({"upstream": self.name}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def serving(upstream: FakeUpstream) -> AsyncIterator[int]:
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        upstream.release.set()
        server.close()


@contextlib.asynccontextmanager
async def nginx_running(conf: Path, port: int) -> AsyncIterator[str]:
    log = (conf.parent / "nginx.out").open("wb")
    process = await asyncio.create_subprocess_exec(
        nginx_binary(),
        *["-p", str(conf.parent), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    async def accepting() -> bool:
        assert process.returncode is None, (conf.parent / "nginx.out").read_text()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    try:
        await eventually(accepting, timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), timeout=10)
        log.close()


async def test_router_routes_by_mcp_method_and_streams_sse(tmp_path: Path) -> None:
    nginx_binary()
    hub, servers = FakeUpstream("hub"), FakeUpstream("servers")
    port = free_port()
    async with serving(hub) as hub_port, serving(servers) as servers_port:
        conf = local_router_config(tmp_path, port, hub_port, servers_port)
        async with (
            nginx_running(conf, port) as url,
            httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as client,
        ):
            for method, expected in (
                ("tasks/get", "hub"),
                ("tasks/update", "hub"),
                ("tasks/cancel", "hub"),
                ("tools/call", "servers"),
                ("initialize", "servers"),
                ("notasks/get", "servers"),
                (None, "servers"),
            ):
                headers = {"Mcp-Method": method} if method else {}
                response = await client.post("/mcp", json={"method": method}, headers=headers)
                assert response.json() == {"upstream": expected}, method

            headers = {"Mcp-Method": "subscriptions/listen", "Accept-Encoding": "gzip"}
            async with client.stream("POST", "/mcp", json={}, headers=headers) as response:
                assert response.headers["content-type"] == "text/event-stream"
                assert "content-encoding" not in response.headers
                lines = response.aiter_lines()
                # the first frame arrives while the upstream still holds the stream open
                assert await asyncio.wait_for(anext(lines), timeout=5) == "data: first"
                assert not hub.release.is_set()
                hub.release.set()
                assert "data: last" in [line async for line in lines]

    for request_line, headers in hub.requests + servers.requests:
        assert request_line.endswith("HTTP/1.1")  # keep-alive upstream connections
        assert "connection" not in headers and "x-forwarded-for" in headers


# -- NATS ------------------------------------------------------------------------------


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


@pytest.fixture
def nats_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Three nodes on loopback running deploy/nats/cluster.conf; yields their URLs."""
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
        yield [node.url for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def with_user(urls: list[str], user: str) -> list[str]:
    password = env_example()[f"NATS_{user.upper().replace('-', '_')}_PASSWORD"]
    return [url.replace("nats://", f"nats://{user}:{password}@") for url in urls]


async def test_nats_cluster_conf_forms_a_jetstream_cluster(nats_cluster: list[str]) -> None:
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
        source = NatsSource(
            ",".join(nats_cluster),
            DEFAULT_BUCKET,
            TaskCache(),
            Metrics(),
            nats_options=config.nats_options(),
        )
        await source.start()
        try:
            await source.wait_caught_up(10)
            assert await source.read_through(task.task_id) is not None
        finally:
            await source.close()
    finally:
        await bridge.close()


# -- Kubernetes ------------------------------------------------------------------------


def validate_k8s(objects: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="add kubernetes-validate to the [dev] extra"
    )
    for version in K8S_VERSIONS:
        if version == "latest":
            version = kubernetes_validate.latest_version()
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


def test_k8s_manifests_match_the_schemas() -> None:
    validate_k8s(k8s_objects())


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in K8S_MANIFESTS]
    files = kustomization["configMapGenerator"][0]["files"]
    assert sorted((DEPLOY / "k8s" / f).resolve() for f in files) == NATS_CONFIGS


def test_k8s_kustomization_renders() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (`kubectl kustomize` renders offline)")
    result = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(DEPLOY / "k8s")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    config = next(o for o in rendered if o["kind"] == "ConfigMap")
    assert config["data"] == {p.name: p.read_text() for p in NATS_CONFIGS}
    assert all(
        o["metadata"].get("namespace") == "taskhub" for o in rendered if o["kind"] != "Namespace"
    )
    if importlib.util.find_spec("kubernetes_validate") is not None:  # else the test above skips
        validate_k8s(rendered)


def container(obj: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_k8s_hub_deployment() -> None:
    deployment = k8s_object("Deployment", "taskhub")
    pod = deployment["spec"]["template"]["spec"]
    hub = container(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert hub["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert hub["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= set(hub["resources"]["requests"])
    assert "memory" in hub["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == dict(final_stage())["USER"].split(":")[0]
    assert hub["securityContext"]["readOnlyRootFilesystem"] is True
    assert hub["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in hub["env"]}
    assert set(env) <= serve_option_variables()
    for secret in ("TASKHUB_JWT_SECRET", "TASKHUB_NATS_PASSWORD"):
        assert "secretKeyRef" in env[secret]["valueFrom"]
    assert env["TASKHUB_NATS_USER"]["value"] == "hub"
    nats_host = urlsplit(env["TASKHUB_NATS_URL"]["value"]).hostname
    assert k8s_object("Service", str(nats_host))["spec"]["selector"] == {
        "app.kubernetes.io/name": "nats"
    }
    # listen streams' goodbye, then uvicorn's graceful stop, then the NATS drain
    shutdown = Config().shutdown_grace + int(Config().shutdown_grace) + 1
    assert pod["terminationGracePeriodSeconds"] > shutdown


def test_k8s_hub_service_pdb_and_autoscaler() -> None:
    deployment = k8s_object("Deployment", "taskhub")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = k8s_object("Service", "taskhub")
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    pdb = k8s_object("PodDisruptionBudget", "taskhub")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = k8s_object("HorizontalPodAutoscaler", "taskhub")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "taskhub",
    }
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def test_k8s_nats_statefulset() -> None:
    statefulset = k8s_object("StatefulSet", "nats")
    headless = k8s_object("Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["replicas"] == 3
    node = container(statefulset)
    env = {e["name"]: e for e in node["env"]}
    required = set().union(*(nats_conf_variables(p) for p in NATS_CONFIGS))
    assert required <= set(env)
    for ordinal in range(3):
        route = urlsplit(env[f"NATS_ROUTE_{ordinal + 1}"]["value"])
        assert route.hostname == f"nats-{ordinal}.{headless['metadata']['name']}"
    volumes = statefulset["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "nats-config"}} in volumes
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    pdb = k8s_object("PodDisruptionBudget", "nats")
    assert pdb["spec"]["maxUnavailable"] == 1


# -- Prometheus and Grafana -------------------------------------------------------------


def test_alert_rules() -> None:
    known = metric_names()
    rules = [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["labels"]["severity"] in ("page", "warning")
        assert rule["annotations"]["summary"]
        assert balanced(rule["expr"]), rule["alert"]
        assert metrics_in(rule["expr"]) <= known, rule["alert"]
        assert metrics_in(rule["expr"]) or rule["expr"].startswith("up{")
    exprs = " ".join(rule["expr"] for rule in rules)
    for watched in ("taskhub_ready", "taskhub_kv_rejected_total", "taskhub_open_streams"):
        assert watched in exprs
    assert re.search(r'taskhub_requests_total\{outcome!~?"', exprs)


def test_prometheus_configs() -> None:
    services = compose()["services"]
    for path in PROMETHEUS_CONFIGS:
        config = yaml.safe_load(path.read_text())
        assert all((path.parent / rules).is_file() for rules in config["rule_files"])
        (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "taskhub"]
        if "static_configs" in job:  # compose
            targets = {t for group in job["static_configs"] for t in group["targets"]}
            assert targets == {f"{name}:8080" for name in hub_services(services)}
        else:  # kubernetes: the pod annotations of the hub deployment
            annotations = k8s_object("Deployment", "taskhub")["spec"]["template"]["metadata"]
            assert annotations["annotations"]["prometheus.io/scrape"] == "true"
            assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]


def dashboard_targets() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels) > 0
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        assert panel["type"] in ("stat", "timeseries", "gauge", "table", "bargauge")
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"


def test_dashboard_uses_only_real_metrics() -> None:
    known = metric_names()
    for target in dashboard_targets():
        used = metrics_in(target["expr"])
        assert used and used <= known, target["expr"]
        assert balanced(target["expr"]), target["expr"]
