"""The content codings the front door's client decodes, a piece at a time.

`Accept-Encoding` goes upstream naming only these (hub/front_door/forwarding.py); an answer
in one of them is decoded as it is read (hub/front_door/upstream_http.py), in pieces of at
most `DECODED_PIECE` bytes, since a small coded chunk may hold a great deal. Any other
coding, or bytes that do not decode, is a `CodingError`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

DECODED_PIECE = 64 << 10  # at most this many decoded bytes per piece of a coded answer
DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate", b"identity"})


class CodingError(ValueError):
    """An answer in a coding the hub does not decode, or that does not decode."""


def decoder(coding: bytes | None) -> zlib._Decompress | None:
    """What decodes an answer in `coding` (its `Content-Encoding`); None: nothing to."""
    if coding is None:
        return None
    coding = coding.strip().lower()
    if coding in (b"", b"identity"):
        return None
    if coding in (b"gzip", b"x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if coding == b"deflate":
        return _Deflate()  # type: ignore[return-value]
    raise CodingError(f"an answer in content coding {coding.decode('latin-1')!r}")


class _Deflate:
    """`deflate` as sent: zlib-wrapped per RFC 9110, or raw as some servers send it."""

    def __init__(self) -> None:
        self._inner = zlib.decompressobj()
        self._first = True

    @property
    def eof(self) -> bool:
        return self._inner.eof

    @property
    def unconsumed_tail(self) -> bytes:
        return self._inner.unconsumed_tail

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        if self._first:
            self._first = False
            try:
                return self._inner.decompress(data, max_length)
            except zlib.error:
                self._inner = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._inner.decompress(data, max_length)


def decode(decoder: zlib._Decompress, data: bytes) -> Iterator[bytes]:
    """`data` decoded, a piece at a time."""
    while data:
        try:
            piece = decoder.decompress(data, DECODED_PIECE)
        except zlib.error as exc:
            raise CodingError(f"undecodable answer ({exc})") from None
        if piece:
            yield piece
        data = decoder.unconsumed_tail
