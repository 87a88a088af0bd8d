"""Bearer-token authentication: a JWT in, a principal (its `sub`) out, or an `AuthError`.

Pure and I/O-free at request time (keys are read once, at startup) so every rule has a unit
test. joserfc does the cryptography; the algorithm comes from the configured key, never from
the token (no alg confusion, no `none`). Claims are checked here with exact RFC 7519 bounds.
A token that names an audience is refused unless it names ours (H68), even when no audience
is configured. Errors follow RFC 6750 §3 and never echo the token.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, OctKey, RSAKey

from hub.settings import DEFAULT_LEEWAY_S, DEFAULT_OPERATOR_CLAIM, AuthSettings

REALM = "taskhub"
COOKIE_NAME = "taskhub_token"
MIN_SECRET_BYTES = 32  # RFC 7518 §3.2: an HS256 key is at least as long as the hash
_EC_ALGS = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}  # RFC 7518 §3.4
_RSA_ALGS = frozenset({"RS256", "RS384", "RS512"})
_JWS_COMPACT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # RFC 6750 §2.1

ErrorCode = Literal["invalid_request", "invalid_token"]
CredentialSource = Literal["header", "cookie"]


class AuthError(Exception):
    """Credentials refused. `error` None means none were sent (RFC 6750 §3.1: no error code)."""

    def __init__(self, error: ErrorCode | None, description: str = "") -> None:
        super().__init__(description or "authentication required")
        self.error = error
        self.description = description  # a fixed phrase: never the token, never client input

    @classmethod
    def missing(cls) -> AuthError:
        return cls(None)

    @property
    def status(self) -> int:
        """RFC 6750 §3.1: 400 for a malformed request, 401 otherwise."""
        return 400 if self.error == "invalid_request" else 401

    def www_authenticate(self, realm: str = REALM) -> str:
        challenge = f'Bearer realm="{realm}"'
        if self.error is None:
            return challenge
        return f'{challenge}, error="{self.error}", error_description="{self.description}"'


@dataclass(frozen=True)
class Identity:
    principal: str
    # When authenticate() would start refusing this token (exp + leeway); None if no exp.
    expires_at: float | None
    # The token carries the operator claim: the operator stream shows every task.
    operator: bool = False


def _holds(claims: Mapping[str, Any], claim: tuple[str, str]) -> bool:
    """The claim holds the value: a space-separated string naming it, or a list with it."""
    name, value = claim
    held = claims.get(name)
    if isinstance(held, str):
        return value in held.split()
    return isinstance(held, list) and value in held


@dataclass(frozen=True)
class PinnedKey:
    """A verification key and the one algorithm it accepts, fixed when the key is loaded."""

    key: Key
    alg: str
    kid: str | None = None


def secret_key(secret: str) -> PinnedKey:
    """The HS256 key for a shared secret."""
    raw = secret.encode()
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"the JWT secret must be at least {MIN_SECRET_BYTES} bytes")
    return PinnedKey(OctKey.import_key(raw), "HS256")


def load_keys(text: str) -> tuple[PinnedKey, ...]:
    """Public keys from a PEM public key or certificate, or a JWKS (`{"keys": [...]}`) or JWK.

    JWKS entries that cannot verify RS*/ES* signatures (`use: enc`, other key types or
    algorithms) are skipped, as an IdP's set may hold them; private keys are refused.
    """
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        return (_pem_key(stripped.encode()),)
    try:
        document = json.loads(stripped)
    except ValueError:
        raise ValueError("the key file is neither PEM nor JSON") from None
    if isinstance(document, dict) and "keys" not in document:
        document = {"keys": [document]}  # a bare JWK
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError('a JWKS must be an object with a "keys" array')
    keys = tuple(key for entry in entries if (key := _jwk_key(entry)) is not None)
    if not keys:
        raise ValueError("the JWKS holds no RSA or EC signature verification key")
    return keys


def _pem_key(data: bytes) -> PinnedKey:
    if b"PRIVATE KEY" in data:
        raise ValueError("the key file holds a private key; give the hub only the public key")
    native: object
    try:
        if b"CERTIFICATE" in data:
            native = x509.load_pem_x509_certificate(data).public_key()
        else:
            native = load_pem_public_key(data)
    except ValueError:
        raise ValueError("the key file is not a readable PEM public key") from None
    if isinstance(native, rsa.RSAPublicKey):
        return PinnedKey(RSAKey.import_key(data), "RS256")
    if isinstance(native, ec.EllipticCurvePublicKey):
        key = ECKey.import_key(data)
        if key.curve_name in _EC_ALGS:
            return PinnedKey(key, _EC_ALGS[key.curve_name])
    raise ValueError("the PEM key must be RSA or EC P-256/P-384/P-521")


def _jwk_key(entry: Any) -> PinnedKey | None:
    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
        return None
    if "d" in entry:
        raise ValueError("the JWKS holds a private key; give the hub only public keys")
    kty, alg, kid = entry.get("kty"), entry.get("alg"), entry.get("kid")
    if not (isinstance(alg, str | None) and isinstance(kid, str | None)):
        return None
    if kty == "RSA":
        pinned = "RS256" if alg is None else alg if alg in _RSA_ALGS else None
    elif kty == "EC":
        pinned = _EC_ALGS.get(str(entry.get("crv")))
        pinned = pinned if alg in (None, pinned) else None
    else:
        pinned = None
    if pinned is None:
        return None
    try:
        key = RSAKey.import_key(entry) if kty == "RSA" else ECKey.import_key(entry)
    except (JoseError, ValueError, TypeError) as exc:
        raise ValueError(f"unreadable JWK (kid {kid!r})") from exc
    return PinnedKey(key, pinned, kid)


class Authenticator:
    """Verifies bearer JWTs against fixed keys and claim rules."""

    def __init__(
        self,
        keys: Sequence[PinnedKey],
        *,
        issuer: str | None = None,
        audience: str | None = None,
        leeway_s: float = DEFAULT_LEEWAY_S,
        operator_claim: tuple[str, str] = DEFAULT_OPERATOR_CLAIM,
    ) -> None:
        if not keys:
            raise ValueError("an authenticator needs at least one key")
        if not (math.isfinite(leeway_s) and leeway_s >= 0):
            raise ValueError("the JWT leeway must be a non-negative number of seconds")
        self._keys = tuple(keys)
        self._by_kid = {key.kid: key for key in self._keys if key.kid is not None}
        if len(self._by_kid) != sum(key.kid is not None for key in self._keys):
            raise ValueError("two keys share a kid")
        self.issuer = issuer
        self.audience = audience
        self.leeway_s = float(leeway_s)
        self.operator_claim = operator_claim

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> Authenticator | None:
        """None when no key is configured: the hub then runs open. Reads the key file."""
        s = settings
        if s.jwt_secret and s.jwt_public_key_file:
            raise ValueError("configure a JWT secret or a public key file, not both")
        if s.jwt_secret:
            keys: Sequence[PinnedKey] = (secret_key(s.jwt_secret),)
        elif s.jwt_public_key_file:
            try:
                text = s.jwt_public_key_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"cannot read {s.jwt_public_key_file}: {exc.strerror}") from None
            keys = load_keys(text)
        elif s.jwt_issuer or s.jwt_audience:
            # Running open while the operator believes tokens are checked is the worse failure.
            raise ValueError("a JWT issuer or audience needs a JWT secret or public key file")
        else:
            return None
        return cls(
            keys,
            issuer=s.jwt_issuer,
            audience=s.jwt_audience,
            leeway_s=s.leeway_s,
            operator_claim=s.operator_claim,
        )

    def authenticate(self, token: str, now: float | None = None) -> Identity:
        """The identity a valid token proves; `now` (epoch seconds) is for tests."""
        if not _JWS_COMPACT.fullmatch(token):
            raise AuthError("invalid_token", "malformed token")
        try:
            signed = jws.extract_compact(token.encode())
            header = signed.headers()
        except (JoseError, ValueError, TypeError):
            raise AuthError("invalid_token", "malformed token") from None
        if not isinstance(header, dict):
            raise AuthError("invalid_token", "malformed token")
        pinned = self._key_for(header.get("kid"))
        if header.get("alg") != pinned.alg:  # the key decides; the token's alg only has to agree
            raise AuthError("invalid_token", "algorithm not accepted")
        try:
            # Not strict: RFC 7515 §4 says unknown header parameters are ignored (crit holds).
            registry = jws.JWSRegistry(algorithms=[pinned.alg], strict_check_header=False)
            valid = jws.validate_compact(signed, pinned.key, registry=registry)
        except (JoseError, ValueError, TypeError):
            valid = False
        if not valid:
            raise AuthError("invalid_token", "invalid signature")
        try:
            claims = json.loads(signed.payload)
        except (ValueError, TypeError):
            claims = None
        if not isinstance(claims, dict):
            raise AuthError("invalid_token", "malformed token")
        return self._identity(claims, time.time() if now is None else now)

    def _key_for(self, kid: object) -> PinnedKey:
        if kid is not None and not isinstance(kid, str):
            raise AuthError("invalid_token", "malformed token")
        if kid is not None and kid in self._by_kid:
            return self._by_kid[kid]
        # One key and nothing to disagree about: a kid-less key (PEM, secret) or token.
        if len(self._keys) == 1 and (kid is None or self._keys[0].kid is None):
            return self._keys[0]
        raise AuthError("invalid_token", "token has no key id" if kid is None else "unknown key id")

    def _identity(self, claims: dict[str, Any], now: float) -> Identity:
        exp = _numeric_date(claims, "exp")
        nbf = _numeric_date(claims, "nbf")
        # RFC 7519 §4.1.4/§4.1.5: refuse at or after exp, accept at or after nbf.
        if exp is not None and now >= exp + self.leeway_s:
            raise AuthError("invalid_token", "token expired")
        if nbf is not None and now < nbf - self.leeway_s:
            raise AuthError("invalid_token", "token not yet valid")
        if self.issuer is not None and claims.get("iss") != self.issuer:
            raise AuthError("invalid_token", "wrong issuer")
        if not _audience_ok(claims.get("aud"), self.audience):
            raise AuthError("invalid_token", "wrong audience")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise AuthError("invalid_token", "missing subject")
        expires_at = None if exp is None else exp + self.leeway_s
        return Identity(subject, expires_at, _holds(claims, self.operator_claim))


def _numeric_date(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    try:
        valid = isinstance(value, int | float) and not isinstance(value, bool)
        number = float(value) if valid else math.nan
    except OverflowError:  # an integer beyond any float
        number = math.nan
    if not math.isfinite(number):  # NaN compares false, so it would never expire
        raise AuthError("invalid_token", f"invalid {name} claim")
    return number


def _audience_ok(aud: object, ours: str | None) -> bool:
    if ours is None:
        return aud is None  # H68: a token meant for another service is not for us
    if isinstance(aud, str):
        return aud == ours
    return isinstance(aud, list) and ours in aud


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (RFC 6750 §2.1).

    None when absent or another scheme (RFC 6750 §3.1: that is "no credentials", not an error);
    a Bearer header without exactly one well-formed token raises `invalid_request`.
    """
    if authorization is None:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = rest.strip(" ")
    if not _B64TOKEN.fullmatch(token):
        raise AuthError("invalid_request", "malformed Authorization header")
    return token


def credentials_from(
    method: str,
    headers: Mapping[str, str],
    *,
    own_origin: str,
    allowed_origins: Set[str] = frozenset(),
    read_only: bool = False,
) -> tuple[str, CredentialSource] | None:
    """The request's token and where it came from; None when it sent none.

    `headers` is case-insensitive or lower-cased (Starlette `Headers`). The Authorization
    header always wins. The `taskhub_token` cookie rides along on any request a browser makes,
    so it counts only on requests no other site can forge: a POST with a JSON body (not a
    CORS-simple type, so cross-site pages need a preflight) from our origin or an allowed one.
    On a `read_only` route (the dashboard's GETs: they change nothing) a GET counts too, under
    the same origin rule: another site's page can make the request, but not with our cookie.
    """
    token = bearer_token(headers.get("authorization"))
    if token is not None:
        return token, "header"
    cookies = _cookie_values(headers.get("cookie", ""), COOKIE_NAME)
    if not cookies:
        return None
    if len(cookies) > 1:  # a sibling subdomain may plant a second one (cookie tossing)
        raise AuthError("invalid_request", "more than one token cookie")
    problem = foreign_page(headers, own_origin, allowed_origins)
    if problem is not None:
        raise AuthError("invalid_request", f"cookie {problem}")
    if read_only and method == "GET":
        return cookies[0], "cookie"
    if method != "POST":
        raise AuthError("invalid_request", "cookie accepted on POST only")
    media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise AuthError("invalid_request", "cookie needs Content-Type: application/json")
    return cookies[0], "cookie"


def foreign_page(
    headers: Mapping[str, str], own_origin: str, allowed_origins: Set[str]
) -> str | None:
    """Why a browser's request may come from another site's page (None: from ours, or
    an allowed origin's): its `Origin` is foreign, or without one the browser did not
    say `Sec-Fetch-Site: same-origin`."""
    origin = headers.get("origin")
    if origin is not None:
        if origin != own_origin and origin not in allowed_origins:
            return "sent from a foreign origin"
    elif headers.get("sec-fetch-site") != "same-origin":
        return "needs Origin or Sec-Fetch-Site: same-origin"
    return None


def _cookie_values(header: str, name: str) -> list[str]:
    """Values of cookie `name` in a `Cookie` header (RFC 6265 §4.2.1); empty ones are unset."""
    values = []
    for pair in header.split(";"):
        key, sep, value = pair.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if sep and key.strip() == name and value:
            values.append(value)
    return values
