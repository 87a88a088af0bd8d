"""What the front door passes between a client and an upstream, and what it keeps back.

A reverse proxy owes each side a clean head (RFC 9110 §7.6.1): the hop-by-hop fields, and
every field the `Connection` header names, end at the hub in both directions. The hub
states who the client is itself: `X-Forwarded-For`, `-Host` and `-Proto` are replaced, and
`Forwarded` and `X-Real-IP` dropped, unless the peer is a proxy the operator trusts
(`--trusted-proxy`), whose own statements are kept and extended. The hub's token cookie
is the hub's alone: it is taken out of the `Cookie` going upstream, and an upstream's
`Set-Cookie` for it never reaches the browser. The hub reads (and decodes) every answer
before relaying it, so `Accept-Encoding` goes upstream naming only the codings it decodes
(hub/front_door/upstream_http.py). Pure functions on raw ASGI header lists.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import NamedTuple

from hub.admission.auth import COOKIE_NAME
from hub.front_door.content_coding import DECODABLE
from hub.http.head_memo import HeadMemo, estimate
from hub.rpc.routing_headers import head_lines
from hub.settings import Network

RawHeaders = list[tuple[bytes, bytes]]

# RFC 9110 §7.6.1 hop-by-hop fields, and the framing the HTTP client sets itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}
# Statements about the client that only the hub, or a proxy it trusts, may make.
_CLIENT_STATEMENTS = frozenset(
    {b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"forwarded", b"x-real-ip"}
)
_SPECIAL = _CLIENT_STATEMENTS | {b"cookie", b"accept-encoding"}  # looked at more closely
# The hub decodes what it receives (hub/front_door/upstream_http.py) and frames the answer anew,
# with its own `Date` and `Server` (as nginx does): a client never gets two of either.
_NOT_RETURNED = HOP_BY_HOP | {b"content-length", b"content-encoding", b"date", b"server"}
_COOKIE = COOKIE_NAME.encode()
_VARYING = frozenset({b"content-length", b"date"})  # from one answer to the next; not returned


class TrustedProxies:
    """`--trusted-proxy`: addresses and networks whose forwarding headers the hub keeps."""

    def __init__(self, networks: Iterable[Network] = ()) -> None:
        self.networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, address: object) -> bool:
        if not self.networks or not isinstance(address, str):
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)


def request_headers(
    headers: RawHeaders,
    peer: str | None,
    scheme: str,
    trusted: TrustedProxies,
) -> RawHeaders:
    """The head sent upstream for a client's `headers` (lower-case names, as checked)."""
    named = _named_in_connection(headers)
    dropped = _NOT_FORWARDED | named if named else _NOT_FORWARDED
    out: RawHeaders = []
    statements: dict[bytes, list[bytes]] = {}
    host = None
    for name, value in headers:
        if name in dropped:
            if name == b"host" and host is None:
                host = value
            continue
        # Surrounding spaces and tabs are not part of a field value (RFC 9110 §5.5);
        # httptools keeps trailing ones, which the upstream's HTTP client refuses to send.
        value = value.strip(b" \t")
        if name in _SPECIAL:
            if name == b"cookie":
                value = _without_our_cookie(value)
                if value:
                    out.append((name, value))
            elif name == b"accept-encoding":
                value = _decodable(value)
                if value:
                    out.append((name, value))
            elif peer in trusted:
                statements.setdefault(name, []).append(value)
            continue
        out.append((name, value))
    if statements:
        for name in (b"forwarded", b"x-real-ip"):
            if name in statements:
                out.append((name, b", ".join(statements[name])))
    chain = statements.get(b"x-forwarded-for", [])
    if peer:
        chain = [*chain, peer.encode()]
    if chain:
        out.append((b"x-forwarded-for", b", ".join(chain)))
    forwarded_host = statements.get(b"x-forwarded-host", [host] if host is not None else [])
    if forwarded_host:
        out.append((b"x-forwarded-host", forwarded_host[0]))
    proto = statements.get(b"x-forwarded-proto")
    out.append((b"x-forwarded-proto", proto[0] if proto else scheme.encode()))
    return out


class SentHead(NamedTuple):
    """The head that goes upstream for a client's: its fields, and as encoded lines."""

    headers: RawHeaders
    lines: bytes


class OutgoingHeads:
    """`request_headers` (and its lines) remembered by the client's head, peer and scheme
    in a `HeadMemo` of `memo_bytes` a generation (hub/http/head_memo.py): a client sends
    the same head with each request. Only heads whose lines fit in `MEMO_HEAD` bytes are
    remembered; what is remembered is what `request_headers` would return, being a
    function of those three alone."""

    MEMO_HEAD = 4096

    def __init__(self, trusted: TrustedProxies, memo_bytes: int = 1 << 20) -> None:
        self.trusted = trusted
        self._memo: HeadMemo[tuple[object, ...], SentHead] = HeadMemo(memo_bytes, _held)

    def __len__(self) -> int:
        return len(self._memo)

    def held(self) -> int:
        """The memory the remembered heads hold, as counted against `memo_bytes`."""
        return self._memo.held()

    def of(self, headers: RawHeaders, peer: str | None, scheme: str) -> SentHead:
        key = (tuple(headers), peer, scheme)
        memo = self._memo
        found = memo.new.get(key) or memo.recall(key)
        if isinstance(found, SentHead):
            return found
        sent = request_headers(headers, peer, scheme, self.trusted)
        made = SentHead(sent, head_lines(sent))
        if len(made.lines) <= self.MEMO_HEAD:
            memo.keep(key, made)
        return made


def _held(_: object, sent: SentHead) -> int:
    """What remembering `sent` holds: the client's fields (kept alive by the key), the
    fields sent and their lines."""
    return estimate(len(sent.lines), len(sent.headers))


class AnswerHead(NamedTuple):
    """What an upstream's answer head comes to: the fields the client gets, as encoded
    lines (`response_headers`; the length is the hub's to add), and what the answer is."""

    lines: bytes
    stream: bool  # an SSE stream
    coded: bool  # in a content coding, to decode


class AnswerHeads:
    """`AnswerHead`s remembered by the upstream's head less its length and date (which
    the client never gets from it: `response_headers`), in a `HeadMemo` of `memo_bytes` a
    generation: an upstream answers with the same head but for those two. One per hub
    process (the upstreams' `Pool`): what a head comes to does not depend on who sent it."""

    def __init__(self, memo_bytes: int = 256 << 10) -> None:
        self._memo: HeadMemo[tuple[tuple[bytes, bytes], ...], AnswerHead] = HeadMemo(
            memo_bytes, _answer_held
        )

    def __len__(self) -> int:
        return len(self._memo)

    def of(self, headers: RawHeaders) -> AnswerHead:
        key = tuple([field for field in headers if field[0] not in _VARYING])
        memo = self._memo
        found = memo.new.get(key) or memo.recall(key)
        if isinstance(found, AnswerHead):
            return found
        made = answer_head(headers)
        memo.keep(key, made)
        return made


def answer_head(headers: RawHeaders) -> AnswerHead:
    """As `Response.media_type` and `Response.whole` read them: the first of each field."""
    kind = next((value for name, value in headers if name == b"content-type"), b"")
    coding = next((value for name, value in headers if name == b"content-encoding"), b"")
    stream = kind.split(b";", 1)[0].strip().lower() == b"text/event-stream"
    return AnswerHead(head_lines(response_headers(headers)), stream, bool(coding))


def _answer_held(key: tuple[tuple[bytes, bytes], ...], head: AnswerHead) -> int:
    return estimate(len(head.lines) + sum(len(n) + len(v) for n, v in key), len(key))


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> RawHeaders:
    """The answer's fields the client gets (names in lower case, as hub/front_door/upstream_http.py
    reads them): end-to-end ones only, less the upstream's CORS (the hub answers CORS for
    its own origins) and any cookie of the hub's."""
    named = _named_in_connection(headers)
    dropped = _NOT_RETURNED | named if named else _NOT_RETURNED
    return [
        (name, value)
        for name, value in headers
        if name not in dropped
        and not name.startswith(b"access-control-")
        and not (name == b"set-cookie" and _cookie_name(value) == _COOKIE)
    ]


def caller_address(headers: RawHeaders, peer: str | None, trusted: TrustedProxies) -> str:
    """The client's address: the peer's, or behind trusted proxies the last address of
    `X-Forwarded-For` that is not one of them."""
    if peer is None:
        return "-"
    if peer not in trusted:
        return peer
    chain = [
        hop.strip().decode("latin-1")
        for name, value in headers
        if name == b"x-forwarded-for"
        for hop in value.split(b",")
    ]
    for hop in reversed(chain):
        if hop and hop not in trusted:
            return hop
    return peer


def _named_in_connection(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    named = [value for name, value in headers if name == b"connection"]
    if not named:
        return frozenset()
    tokens = (token.strip().lower() for value in named for token in value.split(b","))
    return frozenset(token for token in tokens if token)


def _decodable(value: bytes) -> bytes:
    """An `Accept-Encoding` less the codings the hub cannot decode (their weights kept)."""
    kept = [
        item.strip()
        for item in value.split(b",")
        if item.split(b";", 1)[0].strip().lower() in DECODABLE
    ]
    return b", ".join(kept) or b"identity"


def _without_our_cookie(value: bytes) -> bytes:
    pairs = [pair.strip() for pair in value.split(b";")]
    return b"; ".join(pair for pair in pairs if pair and _cookie_name(pair) != _COOKIE)


def _cookie_name(pair: bytes) -> bytes:
    return pair.split(b"=", 1)[0].split(b";", 1)[0].strip()
