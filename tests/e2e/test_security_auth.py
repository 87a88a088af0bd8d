"""Security end to end, authentication: every bad credential is refused the same way on every
endpoint, RS256 key files verify, and a listen stream lives no longer than its token.

The authenticated hub (`secured`, one per importing module) and the token helpers here are
shared with test_security_ownership.py and test_security_browsers.py. Every request goes over
real HTTP to a hub watching a real nats-server; the pure rules are unit-tested in
tests/test_auth_*.py, these tests prove the wiring.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bridge.jetstream import ensure_bucket, ensure_control_stream
from bridge.wire import CONTROL_STREAM, control_subject, kv_subject
from tests.helpers import (
    SUB_KEY,
    HubHarness,
    envelope,
    eventually,
    listening,
    mint_token,
    new_task_id,
    rpc,
    start_hub,
    start_served_hub,
)
from tests.tokens import jwt, public_jwk

SECRET = "e2e-security-secret-0123456789-abcdefgh"
ISSUER = "https://issuer.test"
AUDIENCE = "https://hub.test/mcp"
PUBLIC_URL = "https://hub.test"  # the hub's own origin, as browsers see it
DASHBOARD = "https://dash.test"  # a CORS allow-listed origin
LEEWAY = 0.5
ANSWER = {"q1": {"action": "accept", "content": {"ok": True}}}


def token(sub: str | None = "alice", **claims: Any) -> str:
    """A token the secure hub accepts, unless `claims` spoil it."""
    return mint_token(SECRET, sub, **{"iss": ISSUER, "aud": AUDIENCE, **claims})


def bearer(sub: str = "alice", **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(sub, **claims)}"}


@dataclass
class Secured:
    """The module's authenticated hub, its bucket and the server id its tasks name."""

    harness: HubHarness
    js: Any
    bucket: str
    server: str

    async def put(self, task_id: str, status: str = "working", **fields: Any) -> None:
        data = envelope(task_id, status, server=self.server, **fields)
        await self.js.publish(kv_subject(self.bucket, task_id), data)

    async def task(self, owner: str, status: str = "working", **fields: Any) -> str:
        task_id = new_task_id()
        await self.put(task_id, status, owner=owner, **fields)
        return task_id

    async def call(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        return await self.harness.call(body, **headers)


@pytest.fixture(scope="module")
async def secured(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Secured]:
    bucket = f"t{uuid.uuid4().hex[:12]}"
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_bucket(js, bucket)
    await ensure_control_stream(js)
    harness = await start_hub(
        nats_url,
        bucket,
        tmp_path_factory.mktemp("secured"),
        jwt_secret=SECRET,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
        jwt_leeway=LEEWAY,
        public_url=PUBLIC_URL,
        cors_origins=(DASHBOARD,),
    )
    await harness.hub.source.wait_caught_up(10)
    yield Secured(harness, js, bucket, f"srv-{uuid.uuid4().hex[:8]}")
    await harness.stop()
    await nc.close()


def assert_auth_error(response: httpx.Response, status: int, challenge: str) -> None:
    """RFC 6750 challenge, and the same refusal as a JSON-RPC error without an id (H71)."""
    assert response.status_code == status, response.text
    assert response.headers["www-authenticate"] == challenge
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"jsonrpc", "error"} and body["jsonrpc"] == "2.0"
    assert body["error"]["code"] == -31401
    assert body["error"]["message"].startswith("Unauthorized")


def challenge(error: str | None = None, description: str = "") -> str:
    plain = 'Bearer realm="taskhub"'
    return (
        plain if error is None else f'{plain}, error="{error}", error_description="{description}"'
    )


async def queued(js: Any, server: str) -> list[dict[str, Any]]:
    """The control messages waiting for `server`, oldest first (read, not consumed)."""
    subject = control_subject(server)
    info = await js.stream_info(CONTROL_STREAM, subjects_filter=subject)
    messages: list[dict[str, Any]] = []
    seq = 0
    for _ in range((info.state.subjects or {}).get(subject, 0)):
        msg = await js.get_msg(CONTROL_STREAM, seq=seq + 1, subject=subject, next=True)
        messages.append(json.loads(msg.data))
        seq = msg.seq
    return messages


# --- authentication: every failure mode on every kind of endpoint --------------------------

FOREIGN_SECRET = "someone-elses-secret-0123456789-abcdefgh"
# (Authorization header or None, HTTP status, RFC 6750 error code, error_description)
AUTH_FAILURES: dict[str, tuple[Any, int, str | None, str]] = {
    "missing": (None, 401, None, ""),
    "other-scheme": (lambda: "Basic YWxpY2U6c2VjcmV0", 401, None, ""),
    "empty-bearer": (lambda: "Bearer", 400, "invalid_request", "malformed Authorization header"),
    "two-tokens": (lambda: f"Bearer {token()} x", 400, "invalid_request",
                   "malformed Authorization header"),
    "not-a-jwt": (lambda: "Bearer abc.def", 401, "invalid_token", "malformed token"),
    "bad-signature": (lambda: "Bearer " + mint_token(FOREIGN_SECRET, iss=ISSUER, aud=AUDIENCE),
                      401, "invalid_token", "invalid signature"),
    "tampered-payload": (lambda: "Bearer " + _swap_payload(token("alice"), token("bob")), 401,
                         "invalid_token", "invalid signature"),
    "alg-none": (lambda: "Bearer " + _unsigned(), 401, "invalid_token", "algorithm not accepted"),
    "expired": (lambda: f"Bearer {token(exp=time.time() - 5)}", 401, "invalid_token",
                "token expired"),
    "nbf-in-future": (lambda: f"Bearer {token(nbf=time.time() + 60)}", 401, "invalid_token",
                      "token not yet valid"),
    "wrong-issuer": (lambda: f"Bearer {token(iss='https://other.test')}", 401, "invalid_token",
                     "wrong issuer"),
    "no-issuer": (lambda: "Bearer " + mint_token(SECRET, aud=AUDIENCE), 401, "invalid_token",
                  "wrong issuer"),
    "wrong-audience": (lambda: f"Bearer {token(aud='https://other.test/mcp')}", 401,
                       "invalid_token", "wrong audience"),
    "no-audience": (lambda: "Bearer " + mint_token(SECRET, iss=ISSUER), 401, "invalid_token",
                    "wrong audience"),
    "missing-sub": (lambda: f"Bearer {token(None)}", 401, "invalid_token", "missing subject"),
    "empty-sub": (lambda: f"Bearer {token('')}", 401, "invalid_token", "missing subject"),
}  # fmt: skip


def _swap_payload(signed: str, other: str) -> str:
    header, _, signature = signed.split(".")
    return f"{header}.{other.split('.')[1]}.{signature}"


def _unsigned() -> str:
    import base64

    def b64(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + 60}
    return f"{b64({'alg': 'none'})}.{b64(claims)}."


def endpoints(task_id: str) -> list[dict[str, Any]]:
    return [
        rpc("server/discover", id="d"),
        rpc("tasks/get", {"taskId": task_id}, id="g"),
        rpc("tasks/update", {"taskId": task_id, "inputResponses": ANSWER}, id="u"),
        rpc("tasks/cancel", {"taskId": task_id}, id="c"),
        rpc("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, id="l"),
    ]


@pytest.mark.parametrize(("make", "status", "error", "description"), AUTH_FAILURES.values(),
                         ids=list(AUTH_FAILURES))  # fmt: skip
async def test_every_auth_failure_is_refused_on_every_endpoint(
    secured: Secured, make: Any, status: int, error: str | None, description: str
) -> None:
    tid = await secured.task("alice", "input_required")
    for body in endpoints(tid):
        headers = {} if make is None else {"Authorization": make()}
        response = await secured.call(body, **headers)
        assert_auth_error(response, status, challenge(error, description))
    assert await queued(secured.js, secured.server) == []  # nothing was forwarded


async def test_a_valid_token_is_served_on_every_endpoint(secured: Secured) -> None:
    tid = await secured.task("alice", "input_required")
    for body in endpoints(tid)[:-1]:
        response = await secured.call(body, **bearer("alice"))
        assert response.status_code == 200, response.text
        assert response.json()["id"] == body["id"] and "result" in response.json()
    async with listening(secured.harness, [tid], **bearer("alice")) as (response, stream):
        assert response.status_code == 200
        assert (await stream.next())["params"]["notifications"] == {"taskIds": [tid]}


def new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _rsa_files(tmp_path: Path) -> tuple[rsa.RSAPrivateKey, Path, Path]:
    key = new_rsa_key()
    pem_file = tmp_path / "key.pem"
    pem_file.write_bytes(
        key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    jwks_file = tmp_path / "jwks.json"
    jwks = {
        "keys": [
            public_jwk(key, kid="k1", use="sig", alg="RS256"),
            public_jwk(new_rsa_key(), kid="k2"),
        ]
    }
    jwks_file.write_text(json.dumps(jwks))
    return key, pem_file, jwks_file


def rs256(
    key: rsa.RSAPrivateKey | bytes, sub: str = "carol", alg: str = "RS256", **header: Any
) -> str:
    """A token for `sub`, built by hand (tests/tokens.py); HS256 with `key` bytes if asked."""
    claims = {"sub": sub, "aud": AUDIENCE, "exp": time.time() + 60}
    return jwt(claims, key, alg, **header)


@pytest.mark.parametrize("kind", ["pem", "jwks"])
async def test_rs256_tokens_from_a_public_key_file(
    nats_url: str, bucket: str, js: Any, tmp_path: Path, kind: str
) -> None:
    key, pem_file, jwks_file = _rsa_files(tmp_path)
    harness = await start_hub(
        nats_url,
        bucket,
        tmp_path,
        jwt_public_key_file=pem_file if kind == "pem" else jwks_file,
        jwt_audience=AUDIENCE,
    )
    try:
        tid = new_task_id()
        await js.publish(kv_subject(bucket, tid), envelope(tid, owner="carol"))
        kid = {"kid": "k1"} if kind == "jwks" else {}
        good = {"Authorization": f"Bearer {rs256(key, **kid)}"}
        response = await harness.get_task(tid, id=7)
        assert_auth_error(response, 401, challenge())
        response = await harness.call(rpc("tasks/get", {"taskId": tid}, id=7), **good)
        assert response.status_code == 200
        assert response.json()["result"]["taskId"] == tid  # principal = sub = the owner
        # Someone else's key; HS256 keyed with the public key file's bytes (alg confusion:
        # anyone can read them); an unknown kid: all refused.
        refused = {
            "invalid signature": rs256(new_rsa_key(), **kid),
            "algorithm not accepted": rs256(pem_file.read_bytes(), alg="HS256", **kid),
        }
        if kind == "jwks":
            refused["unknown key id"] = rs256(key, kid="nope")
            refused["token has no key id"] = rs256(key)
        for description, bad in refused.items():
            response = await harness.call(
                rpc("tasks/get", {"taskId": tid}, id=7), Authorization=f"Bearer {bad}"
            )
            assert_auth_error(response, 401, challenge("invalid_token", description))
    finally:
        await harness.stop()


# --- a stream lives no longer than its token -----------------------------------------------


async def test_a_stream_ends_with_its_completion_result_when_the_token_expires(
    secured: Secured,
) -> None:
    metrics = secured.harness.hub.metrics
    before = metrics.streams_closed.value("token_expired")
    tid = await secured.task("alice")
    exp = time.time() + 2.0
    auth = {"Authorization": f"Bearer {token(exp=exp)}"}
    async with listening(secured.harness, [tid], id="short", **auth) as (response, stream):
        assert response.status_code == 200
        await stream.next()  # ack
        await stream.next()  # current state
        # Time is the subject here: the next message is the goodbye, at exp + leeway.
        goodbye = await stream.next(timeout=2.0 + LEEWAY + 5)
        assert time.time() >= exp
        assert goodbye == {
            "jsonrpc": "2.0",
            "id": "short",
            "result": {"resultType": "complete", "_meta": {SUB_KEY: "short"}},
        }
        with pytest.raises(EOFError):
            await stream.next()
    await eventually(lambda: metrics.streams_closed.value("token_expired") == before + 1)
    operator = bearer("olga", scope="taskhub:operator")  # /metrics is an operator's to read
    text = (
        await secured.harness.client.get(secured.harness.url + "/metrics", headers=operator)
    ).text
    assert f'taskhub_streams_closed_total{{reason="token_expired"}} {before + 1:g}' in text


async def test_metrics_need_an_operators_token_on_a_hub_with_authentication(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    secret = "s" * 32
    harness = await start_served_hub(nats_url, bucket, tmp_path, jwt_secret=secret)
    try:
        url, client = harness.url + "/metrics", harness.client
        assert (await client.get(url)).status_code == 401
        plain = {"Authorization": f"Bearer {mint_token(secret, 'alice')}"}
        assert (await client.get(url, headers=plain)).status_code == 403
        olga = mint_token(secret, "olga", scope="taskhub:operator")
        answer = await client.get(url, headers={"Authorization": f"Bearer {olga}"})
        assert answer.status_code == 200 and "taskhub_requests_total" in answer.text
    finally:
        await harness.stop()


async def test_public_metrics_serves_them_to_a_scraper_without_a_token(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    harness = await start_served_hub(
        nats_url, bucket, tmp_path, jwt_secret="s" * 32, public_metrics=True
    )
    try:
        assert (await harness.client.get(harness.url + "/metrics")).status_code == 200
    finally:
        await harness.stop()
