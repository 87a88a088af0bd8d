"""hub/auth.py: JWT verification, key loading, the Bearer header and the cookie rules."""

from __future__ import annotations

import base64
import datetime
import json
import re
import string
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc import jws, jwt
from joserfc.jwk import ECKey, Key, OctKey, RSAKey
from starlette.datastructures import Headers

from hub.auth import (
    Authenticator,
    AuthError,
    AuthSettings,
    Identity,
    bearer_token,
    credentials_from,
    load_keys,
    secret_key,
)

NOW = 1_700_000_000.0
SECRET = "test-secret-0123456789-abcdefghij-klmnop"
ISSUER = "https://issuer.example"
AUDIENCE = "https://hub.example/mcp"
DROP = object()  # a claim to leave out

RSA_NATIVE = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RSA_PEM = RSA_NATIVE.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
RSA_KEY = RSAKey.import_key(
    RSA_NATIVE.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
)
OTHER_RSA_KEY = RSAKey.generate_key(2048)
EC_NATIVE = ec.generate_private_key(ec.SECP256R1())
EC_PEM = EC_NATIVE.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
EC_KEY = ECKey.import_key(
    EC_NATIVE.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
)
EC384_KEY = ECKey.generate_key("P-384")
HS_KEY = OctKey.import_key(SECRET.encode())


def public_jwk(key: Key, **params: object) -> dict[str, Any]:
    return {**key.as_dict(private=False), **params}


JWKS = {
    "keys": [
        public_jwk(RSA_KEY, kid="r1", use="sig"),
        public_jwk(OTHER_RSA_KEY, kid="r2", alg="RS256"),
        public_jwk(EC_KEY, kid="e1"),
        public_jwk(EC384_KEY, kid="e384"),
        public_jwk(RSAKey.generate_key(2048), kid="enc", use="enc"),  # skipped: not for signing
    ]
}


def claims(**overrides: object) -> dict[str, Any]:
    base: dict[str, Any] = {
        "sub": "alice",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": NOW + 300,
        "nbf": NOW - 10,
        "iat": NOW - 10,
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not DROP}


def sign(key: Key, body: dict[str, Any] | None = None, alg: str = "HS256", **header: Any) -> str:
    """A JWT signed by joserfc; header parameters given as None are left out."""
    protected = {"alg": alg, **{name: value for name, value in header.items() if value is not None}}
    return jwt.encode(protected, claims() if body is None else body, key, [alg])


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_raw(header: dict[str, Any], body: dict[str, Any], key: Key) -> str:
    """Sign a header joserfc will not emit (it checks headers strictly when signing)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}"
    signature = jws.JWSRegistry.algorithms[header["alg"]].sign(signing_input.encode(), key)
    return f"{signing_input}.{b64(signature)}"


def unsigned(header: dict[str, Any], body: dict[str, Any]) -> str:
    """An `alg: none` token, built by hand: the library rightly refuses to make one."""
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}."


def alg_confusion() -> str:
    """HS256 keyed with the RSA public key's PEM: the classic attack on `alg`-trusting code."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # joserfc warns that this key should not be an oct key
        return sign(OctKey.import_key(RSA_PEM))


def swapped_payload() -> str:
    header, _, signature = sign(HS_KEY).split(".")
    return f"{header}.{sign(HS_KEY, claims(sub='mallory')).split('.')[1]}.{signature}"


def verifier(keys: str, **options: Any) -> Authenticator:
    settings = {"issuer": ISSUER, "audience": AUDIENCE, **options}
    if keys == "hs":
        return Authenticator([secret_key(SECRET)], **settings)
    text = {"rs": RSA_PEM.decode(), "es": EC_PEM.decode(), "jwks": json.dumps(JWKS)}[keys]
    return Authenticator(load_keys(text), **settings)


AUTHENTICATORS = {name: verifier(name) for name in ("hs", "rs", "es", "jwks")}


# --- tokens that are accepted -------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "make", "principal"),
    [
        pytest.param("hs", lambda: sign(HS_KEY), "alice", id="hs256"),
        pytest.param("rs", lambda: sign(RSA_KEY, alg="RS256"), "alice", id="rs256-pem"),
        pytest.param(
            "rs", lambda: sign(RSA_KEY, alg="RS256", kid="any"), "alice", id="pem-any-kid"
        ),
        pytest.param("es", lambda: sign(EC_KEY, alg="ES256"), "alice", id="es256-pem"),
        pytest.param("jwks", lambda: sign(RSA_KEY, alg="RS256", kid="r1"), "alice", id="jwks-r1"),
        pytest.param(
            "jwks",
            lambda: sign(OTHER_RSA_KEY, claims(sub="bob"), alg="RS256", kid="r2"),
            "bob",
            id="jwks-r2",
        ),
        pytest.param("jwks", lambda: sign(EC_KEY, alg="ES256", kid="e1"), "alice", id="jwks-es256"),
        pytest.param(
            "jwks", lambda: sign(EC384_KEY, alg="ES384", kid="e384"), "alice", id="jwks-es384"
        ),
        pytest.param(
            "hs", lambda: sign(HS_KEY, claims(aud=["other", AUDIENCE])), "alice", id="aud-list"
        ),
        pytest.param("hs", lambda: sign(HS_KEY, claims(exp=NOW - 29.5)), "alice", id="exp-leeway"),
        pytest.param("hs", lambda: sign(HS_KEY, claims(nbf=NOW + 30)), "alice", id="nbf-leeway"),
        pytest.param("hs", lambda: sign(HS_KEY, claims(nbf=NOW)), "alice", id="nbf-now"),
        pytest.param(
            "hs",
            lambda: sign_raw({"alg": "HS256", "typ": "at+jwt", "x-custom": 1}, claims(), HS_KEY),
            "alice",
            id="unknown-header",
        ),
        pytest.param("hs", lambda: sign(HS_KEY, claims(sub="ü 世界")), "ü 世界", id="unicode-sub"),
    ],
)
def test_valid_tokens_name_their_subject(
    keys: str, make: Callable[[], str], principal: str
) -> None:
    identity = AUTHENTICATORS[keys].authenticate(make(), now=NOW)
    assert identity.principal == principal


def test_expires_at_is_when_the_token_stops_being_accepted() -> None:
    auth = AUTHENTICATORS["hs"]
    identity = auth.authenticate(sign(HS_KEY, claims(exp=NOW + 100)), now=NOW)
    assert identity == Identity("alice", NOW + 130)
    auth.authenticate(sign(HS_KEY, claims(exp=NOW + 100)), now=NOW + 129.9)
    with pytest.raises(AuthError, match="token expired"):
        auth.authenticate(sign(HS_KEY, claims(exp=NOW + 100)), now=NOW + 130)


def test_a_token_without_exp_never_expires() -> None:
    identity = AUTHENTICATORS["hs"].authenticate(sign(HS_KEY, claims(exp=DROP)), now=NOW)
    assert identity == Identity("alice", None)


def test_issuer_and_audience_are_optional() -> None:
    auth = Authenticator([secret_key(SECRET)])
    token = sign(HS_KEY, claims(iss="anyone", aud=DROP))
    assert auth.authenticate(token, now=NOW).principal == "alice"


def test_leeway_is_configurable() -> None:
    strict = verifier("hs", leeway_s=0)
    with pytest.raises(AuthError, match="token expired"):
        strict.authenticate(sign(HS_KEY, claims(exp=NOW - 1)), now=NOW)
    with pytest.raises(AuthError, match="not yet valid"):
        strict.authenticate(sign(HS_KEY, claims(nbf=NOW + 1)), now=NOW)
    assert verifier("hs", leeway_s=120).authenticate(sign(HS_KEY, claims(exp=NOW - 100)), now=NOW)


def test_now_defaults_to_the_clock() -> None:
    with pytest.raises(AuthError, match="token expired"):
        AUTHENTICATORS["hs"].authenticate(sign(HS_KEY))  # exp is in 2023


# --- tokens that are refused --------------------------------------------------------------

REFUSED = [
    pytest.param("hs", lambda: "", "malformed token", id="empty"),
    pytest.param("hs", lambda: "not-a-jwt", "malformed token", id="garbage"),
    pytest.param("hs", lambda: "a.b", "malformed token", id="two-segments"),
    pytest.param("hs", lambda: "a.b.c.d.e", "malformed token", id="jwe-shaped"),
    pytest.param("hs", lambda: sign(HS_KEY) + " ", "malformed token", id="trailing-space"),
    pytest.param("hs", lambda: "e30.e30.e30", "malformed token", id="header-without-alg"),
    pytest.param("hs", lambda: "bm90IGpzb24.e30.e30", "malformed token", id="header-not-json"),
    pytest.param("hs", lambda: b64(b'["alg"]') + ".e30.e30", "malformed token", id="header-list"),
    pytest.param(
        "hs",
        lambda: jws.serialize_compact({"alg": "HS256"}, b"[1, 2]", HS_KEY),
        "malformed token",
        id="claims-not-object",
    ),
    pytest.param(
        "hs",
        lambda: jws.serialize_compact({"alg": "HS256"}, b"not json", HS_KEY),
        "malformed token",
        id="claims-not-json",
    ),
    pytest.param("hs", swapped_payload, "invalid signature", id="bad-signature"),
    pytest.param("hs", lambda: sign(OctKey.generate_key(256)), "invalid signature", id="hs-wrong"),
    pytest.param(
        "rs", lambda: sign(OTHER_RSA_KEY, alg="RS256"), "invalid signature", id="rs-wrong-key"
    ),
    pytest.param(
        "es", lambda: sign(ECKey.generate_key("P-256"), alg="ES256"), "invalid signature", id="es"
    ),
    pytest.param(
        "jwks", lambda: sign(RSA_KEY, alg="RS256", kid="r2"), "invalid signature", id="kid-lies"
    ),
    pytest.param(
        "hs",
        lambda: sign_raw({"alg": "HS256", "crit": ["x-ext"], "x-ext": 1}, claims(), HS_KEY),
        "invalid signature",
        id="unknown-crit",
    ),
    pytest.param("rs", alg_confusion, "algorithm not accepted", id="alg-confusion"),
    pytest.param("hs", lambda: sign(RSA_KEY, alg="RS256"), "algorithm not accepted", id="rs-to-hs"),
    pytest.param("rs", lambda: sign(EC_KEY, alg="ES256"), "algorithm not accepted", id="es-to-rs"),
    pytest.param("rs", lambda: sign(RSA_KEY, alg="RS512"), "algorithm not accepted", id="rs512"),
    pytest.param("hs", lambda: sign(HS_KEY, alg="HS512"), "algorithm not accepted", id="hs512"),
    pytest.param(
        "jwks", lambda: sign(EC_KEY, alg="ES256", kid="r1"), "algorithm not accepted", id="kid-alg"
    ),
    *(
        pytest.param(
            keys,
            lambda: unsigned({"alg": "none"}, claims()),
            "algorithm not accepted",
            id=f"alg-none-{keys}",
        )
        for keys in ("hs", "rs", "es")
    ),
    pytest.param(
        "jwks",
        lambda: unsigned({"alg": "none", "kid": "r1"}, claims()),
        "algorithm not accepted",
        id="alg-none-jwks",
    ),
    pytest.param("hs", lambda: sign(HS_KEY, claims(exp=NOW - 31)), "token expired", id="expired"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(exp=NOW - 30)), "token expired", id="exp-edge"),
    pytest.param(
        "hs", lambda: sign(HS_KEY, claims(nbf=NOW + 31)), "token not yet valid", id="nbf-future"
    ),
    pytest.param("hs", lambda: sign(HS_KEY, claims(exp="soon")), "invalid exp claim", id="exp-str"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(exp=True)), "invalid exp claim", id="exp-bool"),
    pytest.param(
        "hs", lambda: sign(HS_KEY, claims(exp=float("nan"))), "invalid exp claim", id="exp-nan"
    ),
    pytest.param(
        "hs", lambda: sign(HS_KEY, claims(exp=float("inf"))), "invalid exp claim", id="exp-inf"
    ),
    pytest.param(
        "hs", lambda: sign(HS_KEY, claims(exp=10**400)), "invalid exp claim", id="exp-huge"
    ),
    pytest.param("hs", lambda: sign(HS_KEY, claims(nbf=[1])), "invalid nbf claim", id="nbf-list"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(iss="https://evil")), "wrong issuer", id="iss"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(iss=DROP)), "wrong issuer", id="iss-missing"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(aud="other")), "wrong audience", id="aud"),
    pytest.param(
        "hs", lambda: sign(HS_KEY, claims(aud=["a", "b"])), "wrong audience", id="aud-list"
    ),
    pytest.param("hs", lambda: sign(HS_KEY, claims(aud=DROP)), "wrong audience", id="aud-missing"),
    pytest.param(
        "hs", lambda: sign(HS_KEY, claims(aud={AUDIENCE: 1})), "wrong audience", id="aud-object"
    ),
    pytest.param("hs", lambda: sign(HS_KEY, claims(sub=DROP)), "missing subject", id="no-sub"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(sub="")), "missing subject", id="empty-sub"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(sub=42)), "missing subject", id="int-sub"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(sub=None)), "missing subject", id="null-sub"),
    pytest.param("hs", lambda: sign(HS_KEY, claims(sub=["a"])), "missing subject", id="list-sub"),
    pytest.param(
        "jwks", lambda: sign(RSA_KEY, alg="RS256", kid="nope"), "unknown key id", id="unknown-kid"
    ),
    pytest.param(
        "jwks", lambda: sign(RSA_KEY, alg="RS256", kid="enc"), "unknown key id", id="enc-key-kid"
    ),
    pytest.param("jwks", lambda: sign(RSA_KEY, alg="RS256"), "token has no key id", id="no-kid"),
    pytest.param(
        "jwks",
        lambda: sign_raw({"alg": "RS256", "kid": 7}, claims(), RSA_KEY),
        "malformed token",
        id="int-kid",
    ),
]


@pytest.mark.parametrize(("keys", "make", "description"), REFUSED)
def test_bad_tokens_are_refused(keys: str, make: Callable[[], str], description: str) -> None:
    token = make()
    with pytest.raises(AuthError) as caught:
        AUTHENTICATORS[keys].authenticate(token, now=NOW)
    err = caught.value
    assert (err.error, err.description, err.status) == ("invalid_token", description, 401)
    assert err.www_authenticate() == (
        f'Bearer realm="taskhub", error="invalid_token", error_description="{description}"'
    )
    # The token never comes back: not in the description, the message or the challenge.
    for text in (err.description, str(err), repr(err), err.www_authenticate()):
        assert not token or token not in text
    assert err.description in DESCRIPTIONS


# Every invalid_token description is one of these fixed phrases, all within the RFC 6750 §3
# error_description character set, so neither token bytes nor quotes can reach the header.
DESCRIPTIONS = {
    "malformed token",
    "invalid signature",
    "algorithm not accepted",
    "unknown key id",
    "token has no key id",
    "token expired",
    "token not yet valid",
    "invalid exp claim",
    "invalid nbf claim",
    "wrong issuer",
    "wrong audience",
    "missing subject",
}


def test_descriptions_fit_rfc_6750() -> None:
    for description in DESCRIPTIONS:
        assert re.fullmatch(r"[\x20\x21\x23-\x5b\x5d-\x7e]+", description)


def test_a_token_audience_is_refused_when_the_hub_has_none() -> None:
    """H68: without a configured audience, only tokens naming no audience are for us."""
    auth = Authenticator([secret_key(SECRET)])
    with pytest.raises(AuthError, match="wrong audience"):
        auth.authenticate(sign(HS_KEY, claims(aud="some-other-service")), now=NOW)


def test_a_single_jwk_with_a_kid_serves_tokens_without_one() -> None:
    auth = Authenticator(load_keys(json.dumps({"keys": [public_jwk(RSA_KEY, kid="only")]})))
    assert auth.authenticate(sign(RSA_KEY, claims(aud=DROP), alg="RS256"), now=NOW)
    with pytest.raises(AuthError, match="unknown key id"):
        auth.authenticate(sign(RSA_KEY, claims(aud=DROP), alg="RS256", kid="other"), now=NOW)


def test_a_jwk_alg_pins_that_algorithm() -> None:
    auth = Authenticator(load_keys(json.dumps(public_jwk(RSA_KEY, alg="RS384"))))
    assert auth.authenticate(sign(RSA_KEY, claims(aud=DROP), alg="RS384"), now=NOW)
    with pytest.raises(AuthError, match="algorithm not accepted"):
        auth.authenticate(sign(RSA_KEY, claims(aud=DROP), alg="RS256"), now=NOW)


# --- configuration and key files ----------------------------------------------------------


def write(tmp_path: Path, text: str | bytes, name: str = "key") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def self_signed_certificate() -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer.example")])
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(RSA_NATIVE.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1))
        .sign(RSA_NATIVE, hashes.SHA256())
    )
    return certificate.public_bytes(Encoding.PEM)


def test_no_key_means_no_authenticator() -> None:
    assert Authenticator.from_settings(AuthSettings()) is None
    assert Authenticator.from_settings(AuthSettings(jwt_secret="")) is None


@pytest.mark.parametrize(
    ("text", "key", "alg", "kid"),
    [
        pytest.param(RSA_PEM, RSA_KEY, "RS256", None, id="rsa-pem"),
        pytest.param(EC_PEM, EC_KEY, "ES256", None, id="ec-pem"),
        pytest.param(self_signed_certificate(), RSA_KEY, "RS256", None, id="certificate"),
        pytest.param(json.dumps(JWKS), RSA_KEY, "RS256", "r1", id="jwks"),
        pytest.param(json.dumps(public_jwk(EC_KEY)), EC_KEY, "ES256", None, id="bare-jwk"),
        pytest.param(b"\n  " + RSA_PEM + b"\n\n", RSA_KEY, "RS256", None, id="pem-whitespace"),
    ],
)
def test_key_files_are_recognised_by_content(
    tmp_path: Path, text: str | bytes, key: Key, alg: str, kid: str | None
) -> None:
    settings = AuthSettings(
        jwt_public_key_file=write(tmp_path, text), jwt_issuer=ISSUER, jwt_audience=AUDIENCE
    )
    auth = Authenticator.from_settings(settings)
    assert auth is not None
    token = sign(key, alg=alg, kid=kid)
    assert auth.authenticate(token, now=NOW).principal == "alice"


def test_jwks_keeps_only_signature_keys() -> None:
    odd = ["not a jwk", public_jwk(EC_KEY, kid=["list"]), public_jwk(EC_KEY, alg=["ES256"])]
    keys = load_keys(json.dumps({"keys": [*JWKS["keys"], *odd]}))
    assert [(key.kid, key.alg) for key in keys] == [
        ("r1", "RS256"),
        ("r2", "RS256"),
        ("e1", "ES256"),
        ("e384", "ES384"),
    ]


def test_secret_settings_give_an_hs256_authenticator() -> None:
    auth = Authenticator.from_settings(AuthSettings(jwt_secret=SECRET, leeway_s=5))
    assert auth is not None and auth.leeway_s == 5.0
    assert auth.authenticate(sign(HS_KEY, claims(aud=DROP)), now=NOW).principal == "alice"


def okp_jwk() -> dict[str, Any]:
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    x = b64(public.public_bytes(Encoding.Raw, PublicFormat.Raw))
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "ed"}


def pem_of(native: Any) -> bytes:
    return bytes(native.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))


BAD_KEY_FILES = [
    pytest.param("", "neither PEM nor JSON", id="empty"),
    pytest.param("secret", "neither PEM nor JSON", id="text"),
    pytest.param("[]", "keys", id="json-list"),
    pytest.param('{"keys": {}}', "keys", id="keys-not-list"),
    pytest.param('{"keys": []}', "no RSA or EC", id="no-keys"),
    pytest.param(json.dumps({"keys": [okp_jwk()]}), "no RSA or EC", id="only-okp"),
    pytest.param(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}), "no RSA", id="oct"),
    pytest.param(
        json.dumps({"keys": [public_jwk(RSA_KEY, use="enc")]}), "no RSA or EC", id="only-enc"
    ),
    pytest.param(
        json.dumps({"keys": [public_jwk(RSA_KEY, alg="RSA-OAEP")]}), "no RSA", id="enc-alg"
    ),
    pytest.param(json.dumps({"keys": [public_jwk(EC_KEY, alg="ES384")]}), "no RSA", id="crv-alg"),
    pytest.param(json.dumps({"keys": [{"kty": "RSA", "n": "AQAB"}]}), "unreadable JWK", id="jwk"),
    pytest.param(json.dumps({"keys": [RSA_KEY.as_dict(private=True)]}), "private", id="jwk-d"),
    pytest.param(
        RSA_NATIVE.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
        "private key",
        id="private-pem",
    ),
    pytest.param(
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", "readable", id="bad-pem"
    ),
    pytest.param(pem_of(ec.generate_private_key(ec.SECP256K1())), "RSA or EC", id="secp256k1"),
    pytest.param(pem_of(ed25519.Ed25519PrivateKey.generate()), "RSA or EC", id="ed25519-pem"),
    pytest.param(
        json.dumps({"keys": [public_jwk(RSA_KEY, kid="x"), public_jwk(EC_KEY, kid="x")]}),
        "share a kid",
        id="duplicate-kid",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_KEY_FILES)
def test_unusable_key_files_are_refused(tmp_path: Path, text: str | bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Authenticator.from_settings(AuthSettings(jwt_public_key_file=write(tmp_path, text)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param(AuthSettings(jwt_secret="short"), "at least 32 bytes", id="short-secret"),
        pytest.param(
            AuthSettings(jwt_secret=SECRET, jwt_public_key_file=Path("k.pem")),
            "not both",
            id="secret-and-file",
        ),
        pytest.param(AuthSettings(jwt_issuer=ISSUER), "needs a JWT secret", id="issuer-no-key"),
        pytest.param(AuthSettings(jwt_audience=AUDIENCE), "needs a JWT", id="audience-no-key"),
        pytest.param(
            AuthSettings(jwt_public_key_file=Path("/nonexistent/key.pem")),
            "cannot read /nonexistent/key.pem",
            id="missing-file",
        ),
        pytest.param(AuthSettings(jwt_secret=SECRET, leeway_s=-1), "leeway", id="negative-leeway"),
        pytest.param(AuthSettings(jwt_secret=SECRET, leeway_s=float("nan")), "leeway", id="nan"),
    ],
)
def test_bad_settings_are_refused(settings: AuthSettings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Authenticator.from_settings(settings)


def test_an_authenticator_needs_a_key() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        Authenticator([])


# --- the Authorization header and the challenge ------------------------------------------


@pytest.mark.parametrize(
    ("header", "token"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param("", None, id="empty"),
        pytest.param("Basic dXNlcjpwYXNz", None, id="other-scheme"),
        pytest.param("Bearerx abc", None, id="scheme-prefix"),
        pytest.param("Bearer abc.def.ghi", "abc.def.ghi", id="bearer"),
        pytest.param("bearer abc", "abc", id="lower-case"),
        pytest.param("BEARER abc", "abc", id="upper-case"),
        pytest.param("  Bearer   abc  ", "abc", id="extra-spaces"),
        pytest.param("Bearer a-b_c~d+e/f.g==", "a-b_c~d+e/f.g==", id="b64token-alphabet"),
    ],
)
def test_bearer_token_reads_the_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("Bearer", id="no-token"),
        pytest.param("Bearer ", id="blank-token"),
        pytest.param("Bearer a b", id="two-tokens"),
        pytest.param("Bearer a,b", id="comma"),
        pytest.param("Bearer ==", id="only-padding"),
        pytest.param("Bearer ab=c", id="padding-inside"),
        pytest.param('Bearer "abc"', id="quoted"),
        pytest.param("Bearer abc\tdef", id="tab"),
        pytest.param("Bearer tökén", id="non-ascii"),
    ],
)
def test_a_malformed_bearer_header_is_an_invalid_request(header: str) -> None:
    with pytest.raises(AuthError) as caught:
        bearer_token(header)
    assert (caught.value.error, caught.value.status) == ("invalid_request", 400)
    assert caught.value.www_authenticate() == (
        'Bearer realm="taskhub", error="invalid_request", '
        'error_description="malformed Authorization header"'
    )


def test_the_challenge_strings() -> None:
    missing = AuthError.missing()
    assert (missing.error, missing.status) == (None, 401)
    assert missing.www_authenticate() == 'Bearer realm="taskhub"'
    assert missing.www_authenticate(realm="other") == 'Bearer realm="other"'
    expired = AuthError("invalid_token", "token expired")
    assert expired.www_authenticate() == (
        'Bearer realm="taskhub", error="invalid_token", error_description="token expired"'
    )


# --- properties ---------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
CLAIM = st.sampled_from(["sub", "exp", "nbf", "iss", "aud", "iat", "other"])
HEADER = st.fixed_dictionaries(
    {}, optional={"alg": st.sampled_from(["HS256", "RS256", "none", "ES256"]) | JSON, "kid": JSON}
)


@given(st.none() | st.text())
def test_bearer_token_only_ever_raises_auth_error(header: str | None) -> None:
    try:
        token = bearer_token(header)
    except AuthError as err:
        assert err.error == "invalid_request"
    else:
        assert token is None or (token and " " not in token)


B64TOKEN_CHARS = string.ascii_letters + string.digits + "-._~+/"


@given(st.text(B64TOKEN_CHARS, min_size=1), st.text("=", max_size=3))
def test_bearer_token_round_trips(body: str, padding: str) -> None:
    assert bearer_token(f"Bearer {body}{padding}") == body + padding


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(AUTHENTICATORS)), st.text() | st.from_regex(r"[\w-]*\.[\w-]*\.[\w-]*")
)
def test_arbitrary_text_is_refused_with_auth_error(keys: str, token: str) -> None:
    with pytest.raises(AuthError) as caught:
        AUTHENTICATORS[keys].authenticate(token, now=NOW)
    assert caught.value.error == "invalid_token"
    assert caught.value.description in DESCRIPTIONS


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(AUTHENTICATORS)), HEADER, JSON, st.binary(max_size=64))
def test_forged_structures_are_refused_with_auth_error(
    keys: str, header: dict[str, Any], body: Any, signature: bytes
) -> None:
    token = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}.{b64(signature)}"
    with pytest.raises(AuthError) as caught:
        AUTHENTICATORS[keys].authenticate(token, now=NOW)
    assert caught.value.description in DESCRIPTIONS


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(CLAIM, JSON), st.floats(allow_nan=False, allow_infinity=False))
def test_signed_claims_give_an_identity_or_auth_error(body: dict[str, Any], now: float) -> None:
    try:
        identity = Authenticator([secret_key(SECRET)]).authenticate(sign(HS_KEY, body), now=now)
    except AuthError as err:
        assert err.description in DESCRIPTIONS
    else:
        assert identity.principal == body["sub"] and isinstance(identity.principal, str)


# --- where credentials come from: header, or a cookie only when no other site could send it

OWN = "https://hub.example"
DASHBOARD = "https://dash.example"
JSON_POST = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("method", "headers", "expected"),
    [
        pytest.param("POST", {}, None, id="nothing"),
        pytest.param("POST", {"authorization": "Bearer h"}, ("h", "header"), id="header"),
        pytest.param(
            "GET",
            {"authorization": "Bearer h", "cookie": "taskhub_token=c", "origin": "https://evil"},
            ("h", "header"),
            id="header-beats-cookie",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=c", "origin": OWN},
            ("c", "cookie"),
            id="own",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=c", "origin": DASHBOARD},
            ("c", "cookie"),
            id="cors-allowed",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=c", "sec-fetch-site": "same-origin"},
            ("c", "cookie"),
            id="no-origin-same-origin",
        ),
        pytest.param(
            "POST",
            {
                "content-type": "Application/JSON; charset=utf-8",
                "cookie": "taskhub_token=c",
                "origin": OWN,
            },
            ("c", "cookie"),
            id="json-with-charset",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": 'a=1; taskhub_token="c.d"; b=2', "origin": OWN},
            ("c.d", "cookie"),
            id="among-cookies-quoted",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "authorization": "Basic x", "cookie": "taskhub_token=c", "origin": OWN},
            ("c", "cookie"),
            id="other-scheme-then-cookie",
        ),
        pytest.param(
            "POST",
            {"cookie": "taskhub_token=; other=1", "origin": "https://evil"},
            None,
            id="empty",
        ),
        pytest.param(
            "POST", {"cookie": "xtaskhub_token=c", "origin": "https://evil"}, None, id="other-name"
        ),
    ],
)
def test_credentials_accepted(
    method: str, headers: dict[str, str], expected: tuple[str, str] | None
) -> None:
    allowed = frozenset({DASHBOARD})
    assert credentials_from(method, headers, own_origin=OWN, allowed_origins=allowed) == expected


@pytest.mark.parametrize(
    ("method", "headers", "description"),
    [
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=c", "origin": "https://evil"},
            "cookie sent from a foreign origin",
            id="foreign-origin",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=c", "origin": "null"},
            "cookie sent from a foreign origin",
            id="null-origin",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=c", "origin": "http://hub.example"},
            "cookie sent from a foreign origin",
            id="other-scheme",
        ),
        *(
            pytest.param(
                "POST",
                {**JSON_POST, "cookie": "taskhub_token=c", **site},
                "cookie needs Origin or Sec-Fetch-Site: same-origin",
                id=f"no-origin-{name}",
            )
            for name, site in [
                ("cross-site", {"sec-fetch-site": "cross-site"}),
                ("same-site", {"sec-fetch-site": "same-site"}),
                ("none", {"sec-fetch-site": "none"}),
                ("absent", {}),
            ]
        ),
        *(
            pytest.param(
                "POST",
                {"content-type": media_type, "cookie": "taskhub_token=c", "origin": OWN},
                "cookie needs Content-Type: application/json",
                id=f"content-type-{media_type or 'absent'}",
            )
            for media_type in [
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "application/jsonx",
                "",
            ]
        ),
        pytest.param(
            "GET",
            {**JSON_POST, "cookie": "taskhub_token=c", "origin": OWN},
            "cookie accepted on POST only",
            id="get",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "cookie": "taskhub_token=a; taskhub_token=b", "origin": OWN},
            "more than one token cookie",
            id="two-cookies",
        ),
        pytest.param(
            "POST",
            {**JSON_POST, "authorization": "Bearer", "cookie": "taskhub_token=c", "origin": OWN},
            "malformed Authorization header",
            id="malformed-header-with-cookie",
        ),
    ],
)
def test_credentials_refused(method: str, headers: dict[str, str], description: str) -> None:
    with pytest.raises(AuthError) as caught:
        credentials_from(method, headers, own_origin=OWN, allowed_origins=frozenset({DASHBOARD}))
    assert (caught.value.error, caught.value.description, caught.value.status) == (
        "invalid_request",
        description,
        400,
    )


def test_credentials_from_starlette_headers_ignores_case() -> None:
    headers = Headers(
        headers={"Cookie": "taskhub_token=c", "Origin": OWN, "Content-Type": "application/json"}
    )
    assert credentials_from("POST", headers, own_origin=OWN) == ("c", "cookie")
