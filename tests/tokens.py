"""JWTs and JWKs built by hand, with the standard library and `cryptography`, never joserfc.

The hub verifies tokens with joserfc. A token made with joserfc tests what joserfc is willing
to produce (1.8 refuses to turn a public key PEM into an HS256 key, so it cannot even make the
alg-confusion token), and a joserfc quirk on both sides would go unseen. Every header, payload
and signature here is exactly the bytes a test asks for (RFC 7515 §7.1, RFC 7518 §3).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

# An HS* secret, or the private key of an RS* or ES* signer.
SigningKey = bytes | rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey

_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "256": hashes.SHA256,
    "384": hashes.SHA384,
    "512": hashes.SHA512,
}
_CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}  # RFC 7518 §6.2.1.1


def b64(data: bytes) -> str:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def segment(value: Any) -> str:
    """A JSON value as a token segment; NaN, infinities and huge integers pass unchanged."""
    return b64(json.dumps(value).encode())


def signature(alg: str, key: SigningKey, signing_input: bytes) -> bytes:
    """The JWS signature of `signing_input` under `alg`, however unsuitable the key."""
    family, bits = alg[:2], alg[2:]
    if family == "HS" and isinstance(key, bytes):
        return hmac.new(key, signing_input, getattr(hashlib, f"sha{bits}")).digest()
    if family == "RS" and isinstance(key, rsa.RSAPrivateKey):
        return key.sign(signing_input, padding.PKCS1v15(), _HASHES[bits]())
    if family == "ES" and isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(_HASHES[bits]())))
        size = (key.curve.key_size + 7) // 8
        return r.to_bytes(size, "big") + s.to_bytes(size, "big")  # RFC 7518 §3.4: R || S
    raise ValueError(f"cannot sign {alg} with {type(key).__name__}")


def compact(header: Mapping[str, Any], payload: bytes, key: SigningKey | None) -> str:
    """A compact JWS of `payload` signed with `key` under `header["alg"]`.

    `key` None leaves the signature empty, as an `alg: none` token has it.
    """
    signing_input = f"{segment(dict(header))}.{b64(payload)}"
    if key is None:
        return signing_input + "."
    return f"{signing_input}.{b64(signature(header['alg'], key, signing_input.encode()))}"


def jwt(claims: Any, key: SigningKey, alg: str = "HS256", **header: Any) -> str:
    """A JWT of `claims`; header parameters given as None are left out."""
    protected = {"alg": alg, "typ": "JWT", **header}
    protected = {name: value for name, value in protected.items() if value is not None}
    return compact(protected, json.dumps(claims).encode(), key)


def _uint(value: int) -> str:
    """An unsigned integer as base64url of its minimal big-endian bytes (RFC 7518 §2)."""
    return b64(value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big"))


def public_jwk(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, **params: Any
) -> dict[str, Any]:
    """The public JWK of a private key (RFC 7518 §6.2, §6.3), with extra members."""
    if isinstance(key, rsa.RSAPrivateKey):
        numbers = key.public_key().public_numbers()
        return {"kty": "RSA", "n": _uint(numbers.n), "e": _uint(numbers.e), **params}
    point = key.public_key().public_numbers()
    size = (key.curve.key_size + 7) // 8
    return {
        "kty": "EC",
        "crv": _CURVES[key.curve.name],
        "x": b64(point.x.to_bytes(size, "big")),
        "y": b64(point.y.to_bytes(size, "big")),
        **params,
    }


def private_jwk(key: rsa.RSAPrivateKey, **params: Any) -> dict[str, Any]:
    """An RSA private JWK (RFC 7518 §6.3.2): what an operator must never hand the hub."""
    numbers = key.private_numbers()
    private = {
        "d": numbers.d,
        "p": numbers.p,
        "q": numbers.q,
        "dp": numbers.dmp1,
        "dq": numbers.dmq1,
        "qi": numbers.iqmp,
    }
    return {**public_jwk(key), **{name: _uint(value) for name, value in private.items()}, **params}
