"""Loopback ports for servers this project starts itself: the bench, the tests, conformance.

`bind(0)` picks from the ephemeral range, which is also where the kernel puts the local
end of every outgoing connection; between the check and the server's own bind, any client
on the machine could take the port (seen in CI: a cluster node failed on "address already
in use"). Below that range only another listener can, and the ports are handed out in
turn, so one process never hands out the same port twice until it wraps.
"""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path


def _below_ephemeral_ports() -> list[int]:
    """Ports under the kernel's ephemeral range (Linux), where no outgoing connection lands."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    ports = list(range(10_000, low))
    random.shuffle(ports)  # two processes on one machine start far apart
    return ports


_PORTS = itertools.cycle(_below_ephemeral_ports() or [0])


def free_port() -> int:
    """A loopback port free now, for a server started with that port on its command line
    (elsewhere than Linux, whatever `bind(0)` gives)."""
    for _ in range(1000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", next(_PORTS)))
            except OSError:
                continue  # someone listens there, or it is still in TIME_WAIT
            return int(sock.getsockname()[1])
    raise RuntimeError("no free loopback port below the ephemeral range")
