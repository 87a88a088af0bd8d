"""hub/admission/auth.py, configuring verification: key files recognised by content, which JWKS
entries count, what a JWK's kid and alg pin, and the settings refused at startup."""

from __future__ import annotations

import datetime
import json
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

from hub.admission.auth import Authenticator, AuthError, load_keys
from hub.settings import AuthSettings
from tests.test_auth_tokens import (
    AUDIENCE,
    DROP,
    EC_KEY,
    EC_PEM,
    HS_KEY,
    ISSUER,
    JWKS,
    NOW,
    RSA_KEY,
    RSA_PEM,
    SECRET,
    claims,
    sign,
)
from tests.tokens import b64, private_jwk, public_jwk

# --- what a JWK's kid and alg pin ---------------------------------------------------------


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
        .public_key(RSA_KEY.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1))
        .sign(RSA_KEY, hashes.SHA256())
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
    tmp_path: Path,
    text: str | bytes,
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
    alg: str,
    kid: str | None,
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
    pytest.param(json.dumps({"keys": [private_jwk(RSA_KEY)]}), "private", id="jwk-d"),
    pytest.param(
        RSA_KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
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
