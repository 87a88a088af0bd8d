"""hub/rpc/routing_headers.py: plain-safe values and the base64 sentinel (H14, H15)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.rpc.jsonrpc import HEADER_MISMATCH, RpcError
from hub.rpc.routing_headers import (
    decode_header_value,
    encode_header_value,
    header_map,
    is_plain_safe,
)

SPEC_EXAMPLES = [
    pytest.param("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?=", id="unicode"),
    pytest.param(" padded ", "=?base64?IHBhZGRlZCA=?=", id="whitespace"),
    pytest.param("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=", id="looks-encoded"),
]


@pytest.mark.parametrize(("value", "encoded"), SPEC_EXAMPLES)
def test_spec_examples(value: str, encoded: str) -> None:
    assert encode_header_value(value) == encoded
    assert decode_header_value(encoded) == value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("tasks/get", id="method"),
        pytest.param("786512e2-9e0d-44bd-8f29-789f320fe840", id="task-id"),
        pytest.param("a b\tc", id="inner-space-tab"),
        pytest.param("!~", id="ascii-bounds"),
        pytest.param("", id="empty"),
        pytest.param("=?BASE64?SGk=?=", id="uppercase-marker-is-plain"),
        pytest.param("=?base64?abc", id="no-suffix"),
        pytest.param("x=?base64?abc?=", id="prefix-not-at-start"),
    ],
)
def test_plain_values_pass_through(value: str) -> None:
    assert is_plain_safe(value)
    assert decode_header_value(value) == value
    assert encode_header_value(value) == value


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(" lead", id="leading-space"),
        pytest.param("trail ", id="trailing-space"),
        pytest.param("\tx", id="leading-tab"),
        pytest.param("x\t", id="trailing-tab"),
        pytest.param(" ", id="only-space"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\nb", id="newline"),
        pytest.param("a\x7fb", id="del"),
        pytest.param("caf\xe9", id="latin-1-byte"),
        pytest.param("世界", id="non-latin"),
        # Malformed sentinels count as invalid characters (H15).
        pytest.param("=?base64?=", id="overlapping-markers"),
        pytest.param("=?base64?SGk?=", id="missing-padding"),
        pytest.param("=?base64?SGk==?=", id="excess-padding"),
        pytest.param("=?base64?SGl=?=", id="non-canonical-bits"),
        pytest.param("=?base64?S Gk=?=", id="space-in-payload"),
        pytest.param("=?base64?-_8=?=", id="urlsafe-alphabet"),
        pytest.param("=?base64?SGk\xe9?=", id="non-ascii-payload"),
        pytest.param("=?base64?/w==?=", id="invalid-utf8"),
        pytest.param("=?base64?7aCA?=", id="utf8-surrogate"),
    ],
)
def test_invalid_values_are_header_mismatch(raw: str) -> None:
    with pytest.raises(RpcError) as info:
        decode_header_value(raw, name="Mcp-Name")
    assert (info.value.code, info.value.http_status) == (HEADER_MISMATCH, 400)
    assert "Mcp-Name" in info.value.message


def test_empty_sentinel_is_the_empty_string() -> None:
    assert decode_header_value("=?base64??=") == ""


def test_uppercase_marker_is_compared_literally() -> None:  # H14: markers are case-sensitive
    assert decode_header_value("=?BASE64?SGk=?=") != "Hi"


@given(st.text())
def test_round_trip(value: str) -> None:
    encoded = encode_header_value(value)
    assert is_plain_safe(encoded)
    assert decode_header_value(encoded) == value


@given(st.text(alphabet=st.characters(max_codepoint=0xFF)))
def test_decode_never_fails_otherwise(raw: str) -> None:
    """Whatever an HTTP server hands over (latin-1), the answer is a value or -32020."""
    try:
        decode_header_value(raw)
    except RpcError as err:
        assert err.code == HEADER_MISMATCH


def test_header_map_keeps_the_first_of_a_repeated_header() -> None:
    raw = [(b"mcp-method", b"tasks/get"), (b"origin", b"http://a"), (b"mcp-method", b"other")]
    assert header_map(raw) == {"mcp-method": "tasks/get", "origin": "http://a"}
    assert header_map([(b"x", b"caf\xe9")]) == {"x": "café"}  # latin-1, as ASGI sends it


@given(st.text(alphabet=st.characters(max_codepoint=0x17F)))
def test_the_plain_safe_shortcut_agrees_with_the_rule(value: str) -> None:
    """`is_plain_safe` skips its pattern for visible ASCII and spaces; the answer is the same."""
    from hub.rpc.routing_headers import _PLAIN_SAFE

    assert is_plain_safe(value) == (_PLAIN_SAFE.fullmatch(value) is not None)
    assert is_plain_safe(f" {value}") is False and is_plain_safe(f"{value}\t") is False
