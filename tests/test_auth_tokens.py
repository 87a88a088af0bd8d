"""hub/admission/auth.py, verifying a token: which JWTs pass, and for each refused one the fixed
invalid_token reason, which never carries token bytes into a header or a log.

Every token and JWK is built by hand (tests/tokens.py), never by joserfc, the library the
hub verifies with: an attack token is exactly the bytes the test means. The keys and token
builders here are shared with test_auth_keys.py.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.admission.auth import Authenticator, AuthError, Identity, load_keys, secret_key
from hub.settings import parse_operator_claim
from tests.tokens import SigningKey, b64, compact, jwt, public_jwk

NOW = 1_700_000_000.0
SECRET = "test-secret-0123456789-abcdefghij-klmnop"
ISSUER = "https://issuer.example"
AUDIENCE = "https://hub.example/mcp"
DROP = object()  # a claim to leave out


def new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    """The public key's PEM (SubjectPublicKeyInfo), as an operator hands it to the hub."""
    return key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


RSA_KEY = new_rsa_key()
RSA_PEM = pem(RSA_KEY)
OTHER_RSA_KEY = new_rsa_key()
EC_KEY = ec.generate_private_key(ec.SECP256R1())
EC_PEM = pem(EC_KEY)
EC384_KEY = ec.generate_private_key(ec.SECP384R1())
HS_KEY = SECRET.encode()

JWKS = {
    "keys": [
        public_jwk(RSA_KEY, kid="r1", use="sig"),
        public_jwk(OTHER_RSA_KEY, kid="r2", alg="RS256"),
        public_jwk(EC_KEY, kid="e1"),
        public_jwk(EC384_KEY, kid="e384"),
        public_jwk(new_rsa_key(), kid="enc", use="enc"),  # skipped: not for signing
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


def sign(
    key: SigningKey, body: dict[str, Any] | None = None, alg: str = "HS256", **header: Any
) -> str:
    """A JWT of `body` (default: valid claims); header parameters given as None are left out."""
    return jwt(claims() if body is None else body, key, alg, **header)


def sign_raw(header: dict[str, Any], body: Any, key: SigningKey) -> str:
    """A token with exactly this header (no `typ` added) and any JSON payload."""
    return compact(header, json.dumps(body).encode(), key)


def unsigned(header: dict[str, Any], body: dict[str, Any]) -> str:
    """An `alg: none` token: header, payload and an empty signature."""
    return compact(header, json.dumps(body).encode(), None)


def alg_confusion(public_pem: bytes, **header: Any) -> Callable[[], str]:
    """HS256 keyed with the public key's PEM bytes: the classic attack on `alg`-trusting code.

    Anyone holds those bytes; a verifier that lets the token's `alg` pick the algorithm
    would check this HMAC with them and accept it.
    """
    return lambda: sign_raw({"alg": "HS256", "typ": "JWT", **header}, claims(), public_pem)


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
        lambda: compact({"alg": "HS256"}, b"[1, 2]", HS_KEY),
        "malformed token",
        id="claims-not-object",
    ),
    pytest.param(
        "hs",
        lambda: compact({"alg": "HS256"}, b"not json", HS_KEY),
        "malformed token",
        id="claims-not-json",
    ),
    pytest.param("hs", swapped_payload, "invalid signature", id="bad-signature"),
    pytest.param("hs", lambda: sign(secrets.token_bytes(32)), "invalid signature", id="hs-wrong"),
    pytest.param(
        "rs", lambda: sign(OTHER_RSA_KEY, alg="RS256"), "invalid signature", id="rs-wrong-key"
    ),
    pytest.param(
        "es",
        lambda: sign(ec.generate_private_key(ec.SECP256R1()), alg="ES256"),
        "invalid signature",
        id="es",
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
    pytest.param("rs", alg_confusion(RSA_PEM), "algorithm not accepted", id="alg-confusion"),
    pytest.param("es", alg_confusion(EC_PEM), "algorithm not accepted", id="alg-confusion-es"),
    pytest.param(
        "jwks",
        alg_confusion(RSA_PEM, kid="r1"),
        "algorithm not accepted",
        id="alg-confusion-jwks",
    ),
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


@pytest.mark.parametrize(
    ("claim", "extra", "operator"),
    [
        (("scope", "taskhub:operator"), {"scope": "openid taskhub:operator"}, True),
        (("scope", "taskhub:operator"), {"scope": ["taskhub:operator"]}, True),
        (("scope", "taskhub:operator"), {"scope": "taskhub:operators"}, False),
        (("scope", "taskhub:operator"), {"scope": "openid"}, False),
        (("scope", "taskhub:operator"), {"scp": "taskhub:operator"}, False),
        (("scope", "taskhub:operator"), {"scope": {"taskhub:operator": True}}, False),
        (("groups", "ops"), {"groups": ["dev", "ops"]}, True),
        (("groups", "ops"), {"scope": "taskhub:operator"}, False),
    ],
)
def test_the_operator_claim_is_a_word_of_the_claim_or_a_list_item(
    claim: tuple[str, str], extra: dict[str, Any], operator: bool
) -> None:
    auth = Authenticator(
        [secret_key(SECRET)], issuer=ISSUER, audience=AUDIENCE, operator_claim=claim
    )
    identity = auth.authenticate(sign(HS_KEY, {**claims(), **extra}), now=NOW)
    assert identity.operator is operator


@pytest.mark.parametrize("text", ["scope", "=x", "scope=", " = "])
def test_an_operator_claim_needs_a_name_and_a_value(text: str) -> None:
    with pytest.raises(ValueError, match="CLAIM=VALUE"):
        parse_operator_claim(text)
