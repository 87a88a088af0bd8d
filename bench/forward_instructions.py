"""Instructions per forwarded call: the front door's own work, counted by callgrind.

The front-door rows of `python -m bench` are CPU time, which moves with the machine by
more than a change to the forwarding path saves; user-space instructions do not. This
runs `taskhub serve --upstream` under `valgrind --tool=callgrind` in front of a minimal
upstream (a raw asyncio protocol answering every POST with one small JSON-RPC result),
sends `tools/call` requests as a client does (head and body in one write, keep-alive,
`--connections` at once), zeroes the counters after a warm-up and reads them after
`--calls` more: the hub's instructions per call. The kernel's `read` and `write` are not
in it.

Run: `python -m bench.forward_instructions [--calls 4000] [--connections 8]` (~1 min);
needs valgrind (`callgrind_control` with it). `--probe` runs the same without valgrind
(what the suite checks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import uvloop

from bench.ports import free_port
from hub.commands.embedded_nats import NatsServerProcess

_ROOT = Path(__file__).resolve().parents[1]
RESULT = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"x"}]}}'
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(RESULT),
    RESULT,
)
CALL = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "x"}},
    }
).encode()
HEAD = (
    "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMCP-Protocol-Version: 2026-07-28\r\n"
    "Mcp-Method: tools/call\r\nMcp-Name: echo\r\nAccept: application/json, text/event-stream\r\n"
    "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)


class _Upstream(asyncio.Protocol):
    """Answers each whole request (read by its Content-Length) with `ANSWER`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(ANSWER)  # type: ignore[attr-defined]


async def _serve_upstream(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def calls(port: int, count: int, connections: int) -> int:
    """`count` calls over `connections` keep-alive connections; how many were answered 200."""
    request = (HEAD % len(CALL)).encode() + CALL
    left, ok = count, 0

    async def one_connection() -> None:
        nonlocal left, ok
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while left > 0:
                left -= 1
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                ok += head.startswith(b"HTTP/1.1 200")
        finally:
            writer.close()

    await asyncio.gather(*(one_connection() for _ in range(connections)))
    return ok


def _ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the hub at {url} was not ready within {timeout:g}s")


def measure(count: int, connections: int, valgrind: str | None) -> tuple[int, int]:
    """(calls answered 200, instructions counted over them; 0 without valgrind)."""
    with tempfile.TemporaryDirectory(prefix="taskhub-fi-") as root:
        work = Path(root)
        nats = NatsServerProcess(work / "nats")
        nats_url = nats.start()
        upstream_port, hub_port = free_port(), free_port()
        upstream = subprocess.Popen(
            [sys.executable, "-m", "bench.forward_instructions", "--upstream", str(upstream_port)],
            cwd=_ROOT,
        )
        out = f"--callgrind-out-file={work}/callgrind.%p"
        tool = [] if valgrind is None else [valgrind, "--tool=callgrind", out]
        hub = subprocess.Popen(
            [
                *tool,
                *(sys.executable, "-m", "hub.commands.cli", "serve", "--insecure-no-auth"),
                *("--port", str(hub_port), "--nats-url", nats_url, "--bucket", "fi"),
                *("--data-dir", str(work / "hub"), "--log-level", "warning"),
                *("--upstream", f"http://127.0.0.1:{upstream_port}/mcp"),
            ],
            cwd=_ROOT,
        )
        try:
            _ready(f"http://127.0.0.1:{hub_port}", 120 if tool else 20)
            uvloop.run(calls(hub_port, max(200, count // 10), connections))  # warm
            if valgrind is not None:
                _control(valgrind, "-z", hub.pid)
            answered = uvloop.run(calls(hub_port, count, connections))
            counted = 0
            if valgrind is not None:
                _control(valgrind, "-d", hub.pid)
                counted = _summary(max(work.glob("callgrind.*"), key=lambda p: p.stat().st_mtime))
            return answered, counted
        finally:
            for child in (hub, upstream):
                child.terminate()
                child.wait(30)
            nats.stop()


def _control(valgrind: str, flag: str, pid: int) -> None:
    control = shutil.which("callgrind_control") or str(
        Path(valgrind).with_name("callgrind_control")
    )
    subprocess.run([control, flag, str(pid)], check=True, capture_output=True, timeout=60)


def _summary(dump: Path) -> int:
    """The instructions a callgrind dump counted."""
    for _ in range(50):  # the dump is written by the hub's process: wait for its totals
        found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise RuntimeError(f"no totals in {dump}")


def main(argv: list[str] | None = None) -> None:
    prog = "python -m bench.forward_instructions"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--probe", action="store_true", help="the same run without valgrind")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.upstream:
        uvloop.run(_serve_upstream(args.upstream))
        return
    valgrind = None if args.probe else shutil.which("valgrind")
    if valgrind is None and not args.probe:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    answered, counted = measure(args.calls, args.connections, valgrind)
    if args.probe:
        print(f"{answered:,} of {args.calls:,} calls answered 200")
        return
    print(f"`{prog} --calls {args.calls} --connections {args.connections}`")
    print("| calls answered 200 | instructions per forwarded call (user space) |")
    print("|---|---|")
    print(f"| {answered:,} of {args.calls:,} | {counted / max(1, answered):,.0f} |")


if __name__ == "__main__":
    main()
