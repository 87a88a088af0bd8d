"""hub/front_door/forwarding.py: the head the front door sends upstream, and the answer's it
returns."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.front_door.forwarding import (
    AnswerHeads,
    OutgoingHeads,
    TrustedProxies,
    caller_address,
    request_headers,
    response_headers,
)
from hub.rpc.routing_headers import head_lines
from hub.settings import parse_trusted_proxies
from tests.helpers import memory_held_by

NONE = TrustedProxies()
PROXY = TrustedProxies(parse_trusted_proxies("10.0.0.0/8, ::1"))


def names(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [name for name, _ in headers]


def test_end_to_end_fields_pass_hop_by_hop_and_host_do_not() -> None:
    out = request_headers(
        [
            (b"host", b"hub.example"),
            (b"authorization", b"Bearer t"),
            (b"mcp-method", b"tools/call"),
            (b"connection", b"keep-alive, x-private"),
            (b"x-private", b"1"),
            (b"keep-alive", b"timeout=5"),
            (b"te", b"trailers"),
            (b"transfer-encoding", b"chunked"),
            (b"upgrade", b"h2c"),
            (b"proxy-authorization", b"Basic x"),
            (b"content-length", b"12"),
            (b"accept", b"application/json "),
        ],
        "203.0.113.7",
        "http",
        NONE,
    )
    assert out == [
        (b"authorization", b"Bearer t"),
        (b"mcp-method", b"tools/call"),
        (b"accept", b"application/json"),  # trailing whitespace is no part of a value
        (b"x-forwarded-for", b"203.0.113.7"),
        (b"x-forwarded-host", b"hub.example"),
        (b"x-forwarded-proto", b"http"),
    ]


SPOOFED = [
    (b"host", b"hub.example"),
    (b"x-forwarded-for", b"1.1.1.1"),
    (b"x-forwarded-for", b"2.2.2.2"),
    (b"x-forwarded-host", b"bank.example"),
    (b"x-forwarded-proto", b"https"),
    (b"forwarded", b"for=1.1.1.1"),
    (b"x-real-ip", b"1.1.1.1"),
]


def test_a_clients_statements_about_itself_are_replaced() -> None:
    out = request_headers(SPOOFED, "203.0.113.7", "http", PROXY)
    assert out == [
        (b"x-forwarded-for", b"203.0.113.7"),
        (b"x-forwarded-host", b"hub.example"),
        (b"x-forwarded-proto", b"http"),
    ]


def test_a_trusted_proxys_statements_are_kept_and_extended() -> None:
    out = request_headers(SPOOFED, "10.1.2.3", "http", PROXY)
    assert out == [
        (b"forwarded", b"for=1.1.1.1"),
        (b"x-real-ip", b"1.1.1.1"),
        (b"x-forwarded-for", b"1.1.1.1, 2.2.2.2, 10.1.2.3"),
        (b"x-forwarded-host", b"bank.example"),
        (b"x-forwarded-proto", b"https"),
    ]


def test_the_hubs_cookie_stays_home_and_others_pass() -> None:
    out = request_headers(
        [(b"cookie", b"a=1; taskhub_token=secret; b=2"), (b"cookie", b"taskhub_token=x")],
        None,
        "http",
        NONE,
    )
    assert out == [(b"cookie", b"a=1; b=2"), (b"x-forwarded-proto", b"http")]


def test_the_answer_loses_hop_by_hop_cors_framing_date_server_and_the_hubs_cookie() -> None:
    out = response_headers(  # names in lower case, as hub/front_door/upstream_http.py reads them
        [
            (b"content-type", b"application/json"),
            (b"connection", b"close, X-Hop"),
            (b"x-hop", b"1"),
            (b"content-length", b"2"),
            (b"content-encoding", b"gzip"),
            (b"access-control-allow-origin", b"*"),
            (b"set-cookie", b"taskhub_token=planted; HttpOnly"),
            (b"set-cookie", b" taskhub_token = also; Path=/"),
            (b"set-cookie", b"session=fine"),
            (b"mcp-session-id", b"s1"),
            (b"date", b"Thu, 01 Jan 1970 00:00:00 GMT"),  # the hub sends its own
            (b"server", b"upstream/1"),
        ]
    )
    assert out == [
        (b"content-type", b"application/json"),
        (b"set-cookie", b"session=fine"),
        (b"mcp-session-id", b"s1"),
    ]


@pytest.mark.parametrize(
    ("peer", "chain", "caller"),
    [
        ("203.0.113.7", b"1.1.1.1", "203.0.113.7"),  # not a proxy: its word counts for nothing
        ("10.0.0.1", b"198.51.100.9, 203.0.113.7", "203.0.113.7"),  # the proxy's last hop
        ("10.0.0.1", b"203.0.113.7, 10.0.0.9", "203.0.113.7"),  # through two trusted proxies
        ("10.0.0.1", b"", "10.0.0.1"),  # a proxy that says nothing is the caller
        ("10.0.0.1", b"10.0.0.2", "10.0.0.1"),
        (None, b"1.1.1.1", "-"),
    ],
)
def test_the_caller_is_the_last_address_no_trusted_proxy_vouches_for(
    peer: str | None, chain: bytes, caller: str
) -> None:
    headers = [(b"x-forwarded-for", chain)] if chain else []
    assert caller_address(headers, peer, PROXY) == caller


def test_trusted_proxies_are_addresses_and_networks() -> None:
    assert "10.255.0.1" in PROXY and "::1" in PROXY
    assert "11.0.0.1" not in PROXY and "not an address" not in PROXY and None not in PROXY
    assert not NONE and "10.0.0.1" not in NONE
    with pytest.raises(ValueError):
        parse_trusted_proxies("10.0.0.0/33")


FIELD = st.tuples(
    st.sampled_from([b"x-forwarded-for", b"forwarded", b"cookie", b"connection", b"x-a", b"host"]),
    st.binary(max_size=20).filter(lambda v: b"\r" not in v and b"\n" not in v),
)


@given(st.lists(FIELD, max_size=8), st.sampled_from(["203.0.113.7", "10.0.0.1", None]))
def test_whatever_a_client_sends_the_forwarded_for_ends_with_its_peer(
    headers: list[tuple[bytes, bytes]], peer: str | None
) -> None:
    out = request_headers(headers, peer, "http", PROXY)
    forwarded_for = [value for name, value in out if name == b"x-forwarded-for"]
    if peer is None:
        assert not forwarded_for or peer in PROXY
    else:
        assert len(forwarded_for) == 1 and forwarded_for[0].endswith(peer.encode())
        if peer not in PROXY:
            assert forwarded_for == [peer.encode()]
    assert b"connection" not in names(out) and b"host" not in names(out)
    cookies = [value for name, value in out if name == b"cookie"]
    pairs = [pair.split(b"=", 1)[0].strip() for value in cookies for pair in value.split(b";")]
    assert b"taskhub_token" not in pairs


@pytest.mark.parametrize(
    ("sent", "upstream_gets"),
    [
        (b"gzip, deflate, br, zstd", b"gzip, deflate"),
        (b"br;q=1.0, gzip;q=0.5", b"gzip;q=0.5"),
        (b"br", b"identity"),  # nothing the hub decodes: ask for the answer as it is
        (b"identity", b"identity"),
    ],
)
def test_the_upstream_is_asked_only_for_codings_the_hub_decodes(
    sent: bytes, upstream_gets: bytes
) -> None:
    out = request_headers([(b"accept-encoding", sent)], None, "http", NONE)
    assert out == [(b"accept-encoding", upstream_gets), (b"x-forwarded-proto", b"http")]


def test_a_remembered_head_is_what_request_headers_makes_of_it() -> None:
    trusted = TrustedProxies(parse_trusted_proxies("10.0.0.0/8"))
    heads = OutgoingHeads(trusted, memo_bytes=200)
    client = [(b"authorization", b"Bearer a"), (b"x-forwarded-for", b"1.1.1.1")]
    for peer in ("10.0.0.1", "203.0.113.7", "10.0.0.1"):  # the second peer is no proxy
        for _ in range(2):
            sent = heads.of(client, peer, "https")
            assert sent.headers == request_headers(client, peer, "https", trusted)
            assert sent.lines == b"".join(b"%s: %s\r\n" % field for field in sent.headers)
    other = [(b"authorization", b"Bearer b"), (b"x-forwarded-for", b"1.1.1.1")]
    assert b"Bearer b" in heads.of(other, "10.0.0.1", "https").lines  # never another's
    heads = OutgoingHeads(trusted, memo_bytes=5000)  # a few entries a generation
    for i in range(50):  # past two generations: the oldest are forgotten
        for _ in range(2):  # remembered the second time
            heads.of([(b"x-n", str(i).encode())], None, "http")
        assert heads.held() <= 2 * 5000
    assert 0 < len(heads) < 50


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(
            [(b"mcp-name", b"echo{i:06}"), (b"authorization", b"Bearer x.y.z")], id="a call"
        ),
        pytest.param([(b"x-%d" % n, b"{i:06}") for n in range(90)], id="many tiny fields"),
        pytest.param([(b"authorization", b"Bearer {i:06}" + b"t" * 3000)], id="one long field"),
    ],
)
def test_what_the_remembered_heads_hold_in_memory_is_within_the_bound(
    fields: list[tuple[bytes, bytes]],
) -> None:
    """The bound is memory, not the lines' bytes: an entry holds the client's fields, the
    fields sent and their lines. Counted as lines, these heads held 3 to 10 times it."""
    budget = 128 * 1024
    heads = OutgoingHeads(NONE, memo_bytes=budget)

    def calls() -> None:
        for i in range(2000):
            client = [(name, value.replace(b"{i:06}", b"%06d" % i)) for name, value in fields]
            heads.of(client, "203.0.113.7", "https")
            heads.of(list(client), "203.0.113.7", "https")  # remembered the second time

    held = memory_held_by(calls)
    assert len(heads) > 0
    seen_once = 80 * 2000  # each head's hash, kept from its first read
    assert held <= 2 * budget * 1.25 + seen_once, f"{held / 1024:.0f} KiB held, bound {budget}"


def test_heads_that_never_come_again_are_not_remembered() -> None:
    """A client with a new head each time (a trace id per request, or a hostile one)."""
    heads = OutgoingHeads(NONE)
    for i in range(1000):
        heads.of([(b"traceparent", b"00-%032d-01" % i)], "203.0.113.7", "https")
    assert len(heads) == 0 and heads.held() == 0


@pytest.mark.parametrize(
    ("fields", "stream", "coded"),
    [
        ([(b"content-type", b"application/json")], False, False),
        ([(b"content-type", b"Text/Event-Stream ; charset=utf-8")], True, False),
        ([(b"content-type", b"application/json"), (b"content-encoding", b"gzip")], False, True),
        ([], False, False),
    ],
)
def test_an_answer_head_comes_to_its_lines_and_kind(
    fields: list[tuple[bytes, bytes]], stream: bool, coded: bool
) -> None:
    headers = [(b"date", b"Mon"), *fields, (b"content-length", b"9"), (b"x-up", b"1")]
    heads = AnswerHeads()
    for _ in range(3):  # made, made again (remembered), recalled: the same each time
        head = heads.of(list(headers))
        assert head.lines == head_lines(response_headers(headers))
        assert (head.stream, head.coded) == (stream, coded)
    assert b"content-length" not in head.lines and b"date" not in head.lines


def test_answers_that_differ_in_length_and_date_only_share_one_head() -> None:
    heads = AnswerHeads()
    for i in range(100):
        made = heads.of(
            [
                (b"date", b"Mon, 07 Dec 2026 02:%02d:00 GMT" % (i % 60)),
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % (i * 7)),
            ]
        )
        assert made.lines == b"content-type: application/json\r\n"
    assert len(heads) == 1


def test_what_the_remembered_answer_heads_hold_stays_within_the_bound() -> None:
    """An upstream whose every answer head is new (a request id in each)."""
    budget = 64 * 1024
    heads = AnswerHeads(memo_bytes=budget)

    def calls() -> None:
        for i in range(4000):
            head = [(b"content-type", b"application/json"), (b"x-request-id", b"%08d" % i)]
            heads.of(head)
            heads.of(list(head))

    held = memory_held_by(calls)
    seen_once = 80 * 4000
    assert held <= 2 * budget * 1.25 + seen_once, f"{held / 1024:.0f} KiB held, bound {budget}"
