"""The `Host` names an open hub answers for: its guard against DNS rebinding.

A hub without authentication trusts whoever reaches it, and binds loopback for that
reason. A web page can still reach it: its own name, rebound in DNS to 127.0.0.1, makes
the browser send the hub same-origin requests, with no `Origin` on a GET, and read the
answers. What gives such a request away is its `Host`: the attacker's name. So an open
hub answers only a `Host` that is an IP address (an address is never rebound),
`localhost`, the host of `--public-url`, the address it binds, or a name given with
`--allowed-host`; anything else gets 421, on every path but the legacy door's, which
answers 403 as the SDK server it stands in for does (docs/legacy.md#errors). A hub with
authentication needs no such rule: a rebound page carries no credentials for it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from hub.settings import host_name

MEMO = 1024  # Host values remembered with their answer; a client sends the same each time


class HostRule:
    """Which `Host` header values are answered (names compared without the port)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(name.lower().rstrip() for name in names if name)
        self._seen: dict[str, bool] = {}

    def allows(self, host: str | None) -> bool:
        """True for no `Host` at all (no browser sends that), or an allowed one."""
        if host is None:
            return True
        try:
            return self._seen[host]
        except KeyError:
            pass
        allowed = self._judge(host)
        if len(self._seen) >= MEMO:
            self._seen.clear()
        self._seen[host] = allowed
        return allowed

    def _judge(self, host: str) -> bool:
        name = host_name(host)
        return name is not None and (name in self.names or _is_address(name))


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True
