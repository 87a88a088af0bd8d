"""hub/admission/auth.py, finding the credentials: the Bearer header's syntax and challenges, and
the token cookie, taken only when no other site could have made the browser send it."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from hub.admission.auth import AuthError, bearer_token, credentials_from

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
