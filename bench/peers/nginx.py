"""nginx as a peer: nchan pub/sub (fan-out), static files (`tasks/get`) and a reverse proxy
(the front door), one worker.

The config is the bench's own, written to the run's work dir: loopback port, pid, error
log and every temp path there, never /etc or /var; one worker process, as a one-core
Python hub is compared with one core of C. nchan keeps the newest message per channel
(`nchan_message_buffer_length 1`) and hands it to a subscriber on connect (the "oldest"
of a buffer of one), the counterpart of the hub's initial snapshot. Static `tasks/get`:
the hub's answer to a poll is stored per task as a file, and `POST /mcp` is answered
with the file its `Mcp-Name` header names (static files answer POST with 405, which
`error_page` turns into the file with a 200), with keep-alive and an open-file cache.
The proxy is what deploy/router/nginx.conf runs in front of MCP servers: `proxy_pass` over
HTTP/1.1 keep-alive connections to each upstream (64 kept), buffering off so an SSE answer
streams, the client's `Host` and `X-Forwarded-For`/`-Proto` sent on.
"""

from __future__ import annotations

import os
import pwd
import resource
from pathlib import Path

from bench.harness import Harness
from bench.peers.server import PeerServer, launch
from bench.peers.setup import NCHAN_MODULE, NGINX
from bench.ports import free_port

NCHAN_LOCATIONS = """
    location = /pub {
      nchan_publisher;
      nchan_channel_id $arg_id;
      nchan_message_buffer_length 1;
      nchan_message_timeout 1h;
    }
    location = /sub {
      nchan_subscriber eventsource;
      nchan_channel_id $arg_id;
      nchan_subscriber_first_message oldest;  # the buffer holds one: the newest
    }
"""


def static_locations(root: Path) -> str:
    return f"""
    location = /mcp {{
      error_page 405 =200 /tasks/$http_mcp_name;
      return 405;
    }}
    location /tasks/ {{
      internal;
      root {root};
      default_type application/json;
    }}
"""


def proxy_config(routes: dict[str, int]) -> tuple[str, str]:
    """The `upstream` blocks and the locations proxying each path to its port."""
    upstreams, locations = [], []
    for i, (path, upstream_port) in enumerate(routes.items()):
        upstreams.append(
            f"  upstream up{i} {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}\n"
        )
        locations.append(
            f"""
    location = {path} {{
      proxy_pass http://up{i}/mcp;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host:$server_port;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_buffering off;
      proxy_cache off;
    }}
"""
        )
    return "".join(upstreams), "".join(locations)


def config(work: Path, port: int, locations: str, modules: list[Path], http_extra: str = "") -> str:
    """An nginx.conf for one worker on 127.0.0.1:`port`, every path under `work`."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    connections = max(1024, min(65_536, soft - 64))
    # As root, the worker would otherwise run as `nobody`, which cannot read the work dir.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
    temp = "\n".join(
        f"  {kind}_temp_path {work / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    loads = "\n".join(f"load_module {module};" for module in modules)
    return f"""{loads}
worker_processes 1;
daemon off;
master_process on;
{user}
pid {work / "nginx.pid"};
error_log stderr warn;
events {{ worker_connections {connections}; multi_accept on; }}
http {{
  access_log off;
{temp}
  sendfile on;
  tcp_nodelay on;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  open_file_cache max=10000 inactive=300s;
{http_extra}  server {{
    listen 127.0.0.1:{port} backlog=4096;
{locations}
  }}
}}
"""


async def _start(
    h: Harness, name: str, locations: str, modules: list[Path], http_extra: str = ""
) -> PeerServer:
    port = free_port()
    work = h.root / f"{name}-{port}"
    work.mkdir()
    conf = work / "nginx.conf"
    conf.write_text(config(work, port, locations, modules, http_extra))
    log = work / "stderr.log"
    argv = [str(NGINX), "-p", str(work), "-c", str(conf), "-e", "stderr"]
    tree = await launch(h, name, argv, [port], log)
    return PeerServer(name, port, port, tree)


async def start_nchan(h: Harness) -> PeerServer:
    return await _start(h, "nchan", NCHAN_LOCATIONS, [NCHAN_MODULE])


async def start_static(h: Harness, files: dict[str, bytes]) -> PeerServer:
    """nginx serving `files` (task id → the hub's tasks/get answer) for `POST /mcp`."""
    root = h.root / f"static-{len(files)}-{free_port()}"
    (root / "tasks").mkdir(parents=True)
    for task_id, body in files.items():
        (root / "tasks" / task_id).write_bytes(body)
    return await _start(h, "nginx", static_locations(root), [])


async def start_proxy(h: Harness, routes: dict[str, int]) -> PeerServer:
    """nginx proxying each path of `routes` to `/mcp` on its port (127.0.0.1)."""
    upstreams, locations = proxy_config(routes)
    return await _start(h, "nginx-proxy", locations, [], upstreams)
