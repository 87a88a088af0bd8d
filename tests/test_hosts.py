"""hub/http/hosts.py: the Host names an open hub answers (its guard against DNS rebinding)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.config import Config
from hub.http.hosts import MEMO, HostRule
from hub.options import config_from_args

RULE = HostRule(Config(public_url="https://hub.example:8443").host_names)


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8080",
        "127.0.0.1",
        "LOCALHOST:8080",
        "[::1]:8080",
        "[::1]",
        "10.0.0.5:80",  # an address is never rebound: a page there is the hub's own
        "hub.example:8443",
        "hub.example",
        None,  # no Host: no browser sends that
    ],
)
def test_addresses_localhost_and_the_public_host_are_answered(host: str | None) -> None:
    assert RULE.allows(host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:8080",
        "evil.example",
        "localhost.evil.example",
        "hub.example.evil.example",
        "127.0.0.1.nip.io",
        "localhost.",  # a resolver may send this one to DNS
        "127.1",  # no address as the hub reads them: a name
        "",
        ":8080",
        "hub.example:port",
        "[::1",
        "[::1]x",
    ],
)
def test_other_names_and_malformed_values_are_not(host: str) -> None:
    assert not RULE.allows(host)


def test_allowed_hosts_the_bound_host_and_an_ipv6_public_url_count() -> None:
    config = Config(host="hub.lan", allowed_hosts=("tasks.example",), public_url="http://[::2]")
    rule = HostRule(config.host_names)
    assert rule.allows("tasks.example:1") and rule.allows("hub.lan") and rule.allows("[::2]")
    assert not rule.allows("other.example")


def test_the_flag_takes_names_and_refuses_ports() -> None:
    config = config_from_args(["--allowed-host", "A.example, b.example"], env={})
    assert config.allowed_hosts == ("a.example", "b.example")
    assert config_from_args([], env={"TASKHUB_ALLOWED_HOST": "c.example"}).allowed_hosts == (
        "c.example",
    )
    with pytest.raises(SystemExit):
        config_from_args(["--allowed-host", "a.example:80"], env={})


@given(st.text(max_size=40))
def test_a_remembered_answer_is_the_answer(host: str) -> None:
    """The rule remembers what it judged (at most MEMO values): the same as a new rule's."""
    first = RULE.allows(host)
    assert RULE.allows(host) == first == HostRule(RULE.names).allows(host)


def test_past_the_memo_every_value_is_still_judged() -> None:
    rule = HostRule(["a.example"])
    for n in range(3 * MEMO):
        assert not rule.allows(f"x{n}.example")
        assert rule.allows(f"a.example:{n}")
