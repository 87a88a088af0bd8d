"""deploy/router/nginx.conf: routes by `Mcp-Method` to the compose services and passes SSE
frames on as they come, uncompressed; checked on the text, by `nginx -t`, and run on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from hub.config import Config
from tests.helpers import eventually, free_port
from tests.test_deploy import DEPLOY, compose, hub_services

NGINX_CONF = DEPLOY / "router" / "nginx.conf"


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
