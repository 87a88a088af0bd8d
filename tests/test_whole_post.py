"""hub/http/whole_post.py: a whole plain request read strictly, and never otherwise than llhttp.

Whatever `parse` accepts, httptools (uvicorn's parser, llhttp) must read as exactly one
complete keep-alive `POST` request with the same target, headers and body; everything
else must be declined, so uvicorn's parser gets those bytes untouched.
"""

from __future__ import annotations

from typing import Any

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.http import head_memo, whole_post
from hub.settings import HeadLimits
from tests.helpers import memory_held_by

BODY = b'{"jsonrpc":"2.0","id":1,"method":"tasks/get"}'
HEADERS = [
    ("Host", "127.0.0.1:8000"),
    ("Content-Type", "application/json"),
    ("MCP-Protocol-Version", "2026-07-28"),
    ("Mcp-Name", "Task-A b"),
]


def request(
    headers: list[tuple[str, str]] = HEADERS,
    body: bytes = BODY,
    line: str = "POST /mcp HTTP/1.1",
    length: str | None = None,
) -> bytes:
    length = str(len(body)) if length is None else length
    lines = [line, *(f"{name}: {value}" for name, value in headers), f"Content-Length: {length}"]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


class Recorder:
    """httptools callbacks into one list of messages."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def on_message_begin(self) -> None:
        self.messages.append({"url": b"", "headers": [], "body": b"", "complete": False})

    def on_url(self, url: bytes) -> None:
        self.messages[-1]["url"] += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.messages[-1]["headers"].append((name.lower().decode(), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.messages[-1]["body"] += body

    def on_message_complete(self) -> None:
        self.messages[-1]["complete"] = True


def llhttp_reads(data: bytes) -> tuple[list[dict[str, Any]], httptools.HttpRequestParser | None]:
    recorder = Recorder()
    parser = httptools.HttpRequestParser(recorder)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError:
        return recorder.messages, None
    return recorder.messages, parser


HEADS = whole_post.Heads()  # remembering across the whole module: any head, any order


def assert_read_alike(data: bytes) -> None:
    parsed = whole_post.parse(data)
    assert HEADS.parse(data) == parsed and HEADS.parse(data) == parsed  # as new, as remembered
    if parsed is None:
        return
    messages, parser = llhttp_reads(data)
    assert parser is not None, data
    assert len(messages) == 1 and messages[0]["complete"], data
    (message,) = messages
    assert parser.get_method() == b"POST"
    assert parser.get_http_version() == "1.1" and parser.should_keep_alive()
    head, body = parsed
    assert message["url"].decode() == head.path
    assert dict(message["headers"]) == head.headers
    assert len(message["headers"]) == len(head.headers)  # nothing repeated
    assert message["body"] == body and head.length == len(body)


def test_a_plain_request_is_read_whole() -> None:
    parsed = whole_post.parse(request())
    assert parsed is not None
    head, body = parsed
    assert head.path == "/mcp"
    assert body == BODY
    assert head.headers["mcp-name"] == "Task-A b"  # values keep their case
    assert head.headers["content-length"] == str(len(BODY))
    assert_read_alike(request())


def test_whitespace_before_a_value_is_dropped_and_after_it_kept_as_by_llhttp() -> None:
    # So a value with trailing whitespace gets the same answer (H15: not plain-safe).
    parsed = whole_post.parse(request([("Mcp-Name", "   x y  ")]))
    assert parsed is not None and parsed[0].headers["mcp-name"] == "x y  "
    assert_read_alike(request([("Mcp-Name", "   x y  ")]))
    for value in ("x\ty", "\tx"):  # a tab anywhere: uvicorn's parser reads it
        assert whole_post.parse(request([("Mcp-Name", value)])) is None


def test_keep_alive_is_the_only_connection_taken() -> None:
    assert whole_post.parse(request([("Connection", "Keep-Alive")])) is not None
    for value in ("close", "upgrade", "keep-alive, close", ""):
        assert whole_post.parse(request([("Connection", value)])) is None, value


@pytest.mark.parametrize(
    "data",
    [
        request(line="GET /mcp HTTP/1.1"),
        request(line="POST /mcp HTTP/1.0"),
        request(line="POST /mcp?x=1 HTTP/1.1"),
        request(line="POST /m%63p HTTP/1.1"),
        request(line="POST http://host/mcp HTTP/1.1"),
        request(line="POST  /mcp HTTP/1.1"),
        request([("Transfer-Encoding", "chunked")]),
        request([("Expect", "100-continue")]),
        request([("Upgrade", "websocket")]),
        request([("Bad Name", "x")]),
        request([("Name", "a\x01b")]),
        request([("Name", "a\x7fb")]),
        request([("Name", "a\x85b")]),
        request([("Name", "a\rb")]),
        request([("X", "1"), ("X", "2")]),  # repeated
        request([("content-length", "1")]),  # a second Content-Length
        request(length="+5"),
        request(length=" "),
        request(length="1" * 10),
        request(length=str(len(BODY) + 1)),  # the body is still on its way
        request() + b"POST",  # something pipelined behind it
        request()[:-1],
        request().replace(b"\r\nHost", b"\r\n Host"),  # a folded line
        request().replace(b"\r\n", b"\n"),
        b"POST /mcp HTTP/1.1\r\nContent-Length: 0\r\n",  # no blank line yet
        request()[:20],
    ],
)
def test_what_is_declined(data: bytes) -> None:
    assert whole_post.parse(data) is None


def test_a_body_of_zero_bytes_is_whole() -> None:
    parsed = whole_post.parse(request(body=b""))
    assert parsed is not None and parsed[1] == b""


_name = st.text(st.sampled_from("abcXYZ019-_.!#$%&'*+^`|~ :\t\x00\x7f\xe9"), min_size=0, max_size=8)
_value = st.text(
    st.sampled_from("abcXYZ 019\t:;,\"'=/\\?@\x00\x01\x0b\x7f\x80\xe9\xff\r\n"), max_size=12
)
_line = st.sampled_from(
    [
        "POST /mcp HTTP/1.1",
        "POST /servers/a_b.c~d/mcp HTTP/1.1",
        "POST / HTTP/1.1",
        "post /mcp HTTP/1.1",
        "POST /mcp HTTP/1.1 ",
        "POST /mcp HTTP/2.0",
        "POST /mcp#x HTTP/1.1",
        "POST /m cp HTTP/1.1",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    line=_line,
    headers=st.lists(st.tuples(_name, _value), max_size=6),
    body=st.binary(max_size=40),
    length_delta=st.sampled_from([0, 0, 0, 1, -1]),
    tail=st.sampled_from([b"", b"", b"\r\n", b"GET / HTTP/1.1\r\n\r\n"]),
)
def test_whatever_is_accepted_llhttp_reads_the_same(
    line: str, headers: list[tuple[str, str]], body: bytes, length_delta: int, tail: bytes
) -> None:
    length = str(max(0, len(body) + length_delta))
    assert_read_alike(request(headers, body, line, length) + tail)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_after_a_plain_head(noise: bytes) -> None:
    assert_read_alike(request() + noise)
    assert_read_alike(request()[:60] + noise)


def test_a_remembered_head_reads_each_body_by_its_own_length() -> None:
    heads = whole_post.Heads()
    first, second = request(body=b'{"id":1}'), request(body=b'{"id":2}')
    assert heads.parse(first) == whole_post.parse(first)
    assert heads.parse(first) == whole_post.parse(first) and len(heads) == 1
    parsed = heads.parse(second)
    assert parsed is not None and parsed[1] == b'{"id":2}' and len(heads) == 1
    assert heads.parse(second[:-1]) is None  # its head is known; the body is not all here
    assert heads.parse(second + b"x") is None


def test_heads_are_remembered_within_their_bound() -> None:
    heads = whole_post.Heads(memo_bytes=20_000)
    for i in range(100):
        data = request([("Mcp-Name", f"task-{i:04}")])
        for _ in range(2):  # remembered the second time
            assert heads.parse(data) == whole_post.parse(data)
        assert heads.held() <= 2 * 20_000  # two generations
    recent = request([("Mcp-Name", "task-0099")])
    assert heads.parse(recent) is not None and len(heads) >= 2


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param([("Mcp-Name", "{i:06}"), ("Authorization", "Bearer x.y.z")], id="a poll"),
        pytest.param([(f"X-{n}", "{i:06}") for n in range(90)], id="many tiny fields"),
        pytest.param([("Authorization", "Bearer {i:06}" + "t" * 3000)], id="one long field"),
        pytest.param([("Transfer-Encoding", "chunked{i}")], id="declined"),
    ],
)
def test_what_the_remembered_heads_hold_in_memory_is_within_the_bound(
    fields: list[tuple[str, str]],
) -> None:
    """The bound is memory, not head bytes: a parse holds several times its head (every
    field as two strings and two bytes objects). Counted as head bytes, these heads held
    2 to 20 times the bound."""
    budget = 256 * 1024
    heads = whole_post.Heads(memo_bytes=budget)

    def reads() -> None:
        for i in range(3000):
            data = request([(name, value.format(i=i)) for name, value in fields])
            heads.parse(data)
            heads.parse(data)  # remembered the second time

    held = memory_held_by(reads)
    assert len(heads) > 0
    seen_once = 80 * 3000  # each head's hash, kept from its first read
    assert held <= 2 * budget * 1.25 + seen_once, f"{held / 1024:.0f} KiB held, bound {budget}"


def test_a_head_is_remembered_only_when_it_comes_again() -> None:
    heads = whole_post.Heads()
    poll = request([("Mcp-Name", "task-1")])
    assert heads.parse(poll) == whole_post.parse(poll) and len(heads) == 0
    assert heads.parse(poll) == whole_post.parse(poll) and len(heads) == 1


def test_heads_that_never_come_again_hold_almost_no_memory() -> None:
    """Each poll of a new task, or a client that varies every head: before, each such
    head's parse was remembered (~3 KiB each, up to two generations of MEMO_BYTES)."""
    heads = whole_post.Heads()

    def polls() -> None:
        for i in range(20_000):
            data = request([("Mcp-Name", f"task-{i:06}"), ("Authorization", "Bearer x.y.z")])
            assert heads.parse(data) is not None

    held = memory_held_by(polls)
    assert len(heads) == 0
    assert held <= head_memo.SEEN_ONCE * 80, f"{held / 1024:.0f} KiB held"


def test_a_head_longer_than_memo_head_is_read_but_not_remembered() -> None:
    heads = whole_post.Heads()
    data = request([("Authorization", "Bearer " + "t" * whole_post.MEMO_HEAD)])
    parsed = heads.parse(data)
    assert parsed is not None and parsed == whole_post.parse(data) and len(heads) == 0


# -- the head limits (hub/http/head_limits.py): over any of them, uvicorn's path refuses ------

LIMITS = HeadLimits(target=64, field=100, fields=8, head=600)


def test_a_head_within_every_limit_is_read() -> None:
    fits = request([("Host", "h"), ("X-A", "a" * 96)], line="POST /" + "p" * 63 + " HTTP/1.1")
    assert whole_post.parse(fits, LIMITS) is not None


@pytest.mark.parametrize(
    "data",
    [
        request(line="POST /" + "p" * 64 + " HTTP/1.1"),  # a target of 65 bytes
        request([("Host", "h"), ("X-A", "a" * 97)]),  # a field of 101 bytes: name, colon, value
        request([(f"X-{n}", "v") for n in range(8)]),  # nine fields with Content-Length
        request([(f"X-{n}", "v" * 90) for n in range(6)]),  # a head over 600 bytes
    ],
    ids=["target", "field", "fields", "head"],
)
def test_a_head_over_a_limit_is_declined(data: bytes) -> None:
    assert whole_post.parse(data) is not None  # within the defaults
    assert whole_post.parse(data, LIMITS) is None
    assert whole_post.Heads(LIMITS).parse(data) is None
