"""Sessions of the legacy endpoint, kept in NATS so every hub replica serves every one.

A session is what `initialize` negotiated: the caller's principal, the client's
capabilities and info, and when it began. It lives in its own KV bucket
(`<bucket>-legacy-sessions`, history 1, `SESSION_TTL_S`), so a client keeps its
`Mcp-Session-Id` across hub restarts and replicas. Each request reads its session from the
stream leader (no copy kept in memory), so a session ended at one replica is over at all.
The id is 32 bytes from the CSPRNG, and a session answers only to the principal that
opened it: to anyone else it is unknown.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

import msgspec
from nats.js.errors import NotFoundError

from bridge.jetstream import ensure_hub_bucket
from bridge.wire import is_removal, kv_stream

log = logging.getLogger("taskhub.legacy")

SESSION_TTL_S = 24 * 3600.0  # from initialize; then the client must initialize again


class Session(msgspec.Struct, frozen=True):
    id: str
    principal: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any] | None
    created: float  # time.time() of initialize

    @property
    def expired(self) -> bool:
        return time.time() >= self.created + SESSION_TTL_S


class SessionUnavailable(RuntimeError):
    """NATS could not store or read a session; the client gets -32603 and may retry."""


def sessions_bucket(bucket: str) -> str:
    return f"{bucket}-legacy-sessions"


def new_session_id() -> str:
    return secrets.token_urlsafe(32)  # KV-key safe: letters, digits, "-" and "_"


def valid_session_id(session_id: str) -> bool:
    return 20 <= len(session_id) <= 128 and all(c.isalnum() or c in "-_" for c in session_id)


async def ensure_sessions_bucket(js: Any, bucket: str, replicas: int = 1) -> Any:
    """The legacy sessions bucket of task bucket `bucket` (made unless it exists): history 1,
    entries gone `SESSION_TTL_S` after they were written. Deploy provisioning calls it too."""
    return await ensure_hub_bucket(js, sessions_bucket(bucket), SESSION_TTL_S, replicas)


class Sessions:
    def __init__(self, hub: Any, bucket: str, replicas: int) -> None:
        self.hub = hub  # its NATS connection exists once the hub has started
        self.js: Any = None
        self.bucket = bucket
        self.name = sessions_bucket(bucket)
        self.replicas = replicas
        self.kv: Any = None

    async def start(self) -> None:
        """Open the sessions bucket, making it if this user may. Where it can do neither
        (a NATS account that lets the hub create no stream, and no provisioned bucket),
        the hub runs without its legacy door: every legacy request gets 503."""
        self.js = self.hub.source.js
        try:
            self.kv = await ensure_sessions_bucket(self.js, self.bucket, self.replicas)
        except Exception as exc:
            log.warning(
                "legacy sessions bucket %s unavailable (%s): /legacy/mcp answers 503; "
                "provision it as in deploy/README.md",
                self.name,
                exc,
            )

    async def open(
        self, principal: str, capabilities: dict[str, Any], client_info: dict[str, Any] | None
    ) -> Session:
        if self.kv is None:
            raise SessionUnavailable(f"legacy sessions bucket {self.name} unavailable")
        session = Session(new_session_id(), principal, capabilities, client_info, time.time())
        try:
            await self.kv.create(session.id, msgspec.json.encode(session))
        except Exception as exc:
            raise SessionUnavailable(f"session store unavailable: {type(exc).__name__}") from exc
        return session

    async def find(self, session_id: str, principal: str) -> Session | None:
        """The caller's live session, or None: unknown, ended, expired or someone else's."""
        if not valid_session_id(session_id):
            return None
        session = await self._read(session_id)
        if session is None or session.expired or session.principal != principal:
            return None
        return session

    async def end(self, session: Session) -> None:
        if self.kv is None:
            raise SessionUnavailable(f"legacy sessions bucket {self.name} unavailable")
        try:
            await self.kv.delete(session.id)
        except Exception as exc:
            raise SessionUnavailable(f"session store unavailable: {type(exc).__name__}") from exc

    async def _read(self, session_id: str) -> Session | None:
        if self.kv is None:
            raise SessionUnavailable(f"legacy sessions bucket {self.name} unavailable")
        subject = f"$KV.{self.name}.{session_id}"
        try:  # from the leader: a follower may not have the session made a moment ago
            raw = await self.js.get_msg(kv_stream(self.name), subject=subject, direct=False)
        except NotFoundError:
            return None  # never made, or past the bucket's TTL
        except Exception as exc:
            raise SessionUnavailable(f"session store unavailable: {type(exc).__name__}") from exc
        if is_removal(raw.headers) or not raw.data:
            return None  # ended
        try:
            return msgspec.json.decode(raw.data, type=Session)
        except msgspec.DecodeError:
            return None
