"""Pushpin as a peer: its proxy on a bench port in front of the bench's GRIP origin.

Pushpin's runner starts condure (client connections), zurl (requests to the origin),
pushpin-proxy (routing) and pushpin-handler (the publish API and fan-out); the bench
counts CPU and RSS over all of them. The config is the bench's own: the client port and
the publish API on 127.0.0.1, IPC sockets, run and log dirs under the run's work dir
(the package's internal.conf is inlined with its /var paths moved there), every other
setting Pushpin's default, written out. Streams are `GET /sub?id=<topic>`, answered by
bench/peers/grip_origin.py with a hold on the topic's channel.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import io
import time
from pathlib import Path

from bench.harness import Harness, HarnessError
from bench.peers import server
from bench.peers.server import PeerServer, launch
from bench.peers.setup import PUSHPIN
from bench.ports import free_port
from bench.protocol import event_source

INTERNAL_CONF = Path("/usr/lib/pushpin/internal.conf")


def config(work: Path, port: int, publish_port: int) -> str:
    """A pushpin.conf: clients on 127.0.0.1:`port`, the publish API on `publish_port`."""
    conf = configparser.ConfigParser(interpolation=None)
    if INTERNAL_CONF.exists():
        # zurl's sockets move from /var/run/zurl to where the runner's own zurl binds them.
        internal = INTERNAL_CONF.read_text()
        conf.read_string(internal.replace("ipc:///var/run/zurl/", "ipc://{rundir}/{ipc_prefix}"))
    conf.read_dict(
        {
            "global": {
                "rundir": str(work / "run"),
                "ipc_prefix": "bench-",
                "port_offset": "0",
                "stats_connection_ttl": "120",
            },
            "runner": {
                "services": "condure,zurl,pushpin-proxy,pushpin-handler",
                "http_port": f"127.0.0.1:{port}",
                "logdir": str(work / "log"),
                "log_level": "2",
                "client_buffer_size": "8192",
                "client_maxconn": "50000",
                "condure_bin": "condure",
                "zurl_bin": "zurl",
            },
            "proxy": {
                "routesfile": str(work / "routes"),
                "debug": "false",
                "auto_cross_origin": "false",
                "accept_x_forwarded_protocol": "false",
                "set_x_forwarded_protocol": "proto-only",
                "log_from": "false",
                "log_user_agent": "false",
                "sig_iss": "pushpin",
                "sig_key": "changeme",
                "updates_check": "off",
            },
            # The package's defaults, written out so none depends on a file in /etc. The
            # handler's rate limit stays at its default too (2500/s, 25,000 queued): it is
            # what caps Pushpin's deliveries here, and the table shows it. Raising it did
            # not help on this machine (at 25,000/s ~3,800 frames/s, above that none).
            "handler": {
                "message_rate": "2500",
                "message_hwm": "25000",
                "message_wait": "5000",
                "id_cache_ttl": "60",
                "connection_subscription_max": "20",
                "subscription_linger": "60",
                "stats_subscription_ttl": "60",
                "stats_report_interval": "10",
                "stats_format": "tnetstring",
                "push_in_http_max_headers_size": "10000",
                "push_in_http_max_body_size": "1000000",
                # Pushpin's ZeroMQ publish sockets as IPC in the run dir, not TCP ports.
                "push_in_spec": "ipc://{rundir}/{ipc_prefix}push-in",
                "push_in_sub_specs": "ipc://{rundir}/{ipc_prefix}push-in-sub",
                "push_in_sub_connect": "false",
                "push_in_http_addr": "127.0.0.1",
                "push_in_http_port": str(publish_port),
                "stats_spec": "ipc://{rundir}/{ipc_prefix}stats",
                "command_spec": "ipc://{rundir}/{ipc_prefix}command",
            },
        }
    )
    out = io.StringIO()
    conf.write(out, space_around_delimiters=False)
    return out.getvalue()


async def start_pushpin(h: Harness) -> PeerServer:
    origin = await h.start_module("grip-origin", "bench.peers.grip_origin")
    port, publish_port = free_port(), free_port()
    work = h.root / f"pushpin-{port}"
    for sub in ("run", "log"):
        (work / sub).mkdir(parents=True)
    (work / "routes").write_text(f"* 127.0.0.1:{origin.port}\n")
    conf = work / "pushpin.conf"
    conf.write_text(config(work, port, publish_port))
    argv = [str(PUSHPIN), "--config", str(conf), "--merge-output"]
    tree = await launch(h, "pushpin", argv, [port, publish_port], work / "stderr.log")
    peer = PeerServer("pushpin", port, publish_port, tree, origin=origin)
    try:
        await _through(peer)
    except HarnessError:
        await server.stop(h, tree)
        await h.stop(origin)
        raise
    return peer


async def _through(peer: PeerServer, timeout: float = 20.0) -> None:
    """Wait until a stream request gets its 200 through condure, proxy, zurl and the
    origin: condure listens before zurl is up, and a request then gets a 500."""
    deadline = time.perf_counter() + timeout
    status = 0
    while time.perf_counter() < deadline:
        with contextlib.suppress(OSError, TimeoutError):
            reader, writer = await asyncio.open_connection("127.0.0.1", peer.port)
            try:
                writer.write(event_source(peer.port, peer.stream_path.format("bench-ready")))
                async with asyncio.timeout(2.0):
                    status_line = await reader.readline()
                status = int(status_line.split()[1]) if status_line else 0
            finally:
                writer.close()
            if status == 200:
                return
        await asyncio.sleep(0.05)
    raise HarnessError(f"pushpin: no stream answered 200 in {timeout:.0f} s (last {status})")
