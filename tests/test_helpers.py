"""Helpers the suite, the bench and conformance share, where a mistake would show up only as a
rare flake."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from bench.ports import free_port


@pytest.mark.skipif(sys.platform != "linux", reason="the ephemeral range is read from /proc")
def test_free_ports_lie_below_the_ephemeral_range_and_never_repeat() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    # An outgoing connection's local port comes from the ephemeral range, so a port handed
    # out there could be taken before the server binds it (a CI flake, 2026-12-02).
    assert all(port < low for port in ports)
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # and it is free for the server to take
