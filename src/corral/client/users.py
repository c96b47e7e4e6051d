"""Dashboard users and their sign-ins: a password kept only as its argon2 hash, and
sessions kept read for a few seconds as tokens are."""

from __future__ import annotations

import asyncio
import functools
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from corral import access, errors
from corral.client import checks, tokens

if TYPE_CHECKING:
    from argon2 import PasswordHasher

PASSWORD_MIN = 8
"""The fewest characters a dashboard user's password may have."""
SESSION_LIFETIME = timedelta(hours=12)
"""How long a dashboard sign-in lasts."""


class Users(tokens.Tokens):
    """Dashboard users, sign-ins and sessions."""

    async def user_add(
        self, name: str, *, password: str, tenant: str | None, role: str
    ) -> access.User:
        """Make a dashboard user for `tenant` (None: every tenant) in `role`; the password is
        kept only as its argon2 hash. Conflict when the name is taken."""
        if not checks.NAME.match(name or ""):
            raise errors.InvalidInput(
                f"name: {name!r} must be 1-200 characters of [A-Za-z0-9_.-], starting alphanumeric"
            )
        _check_tenant_role(tenant, role)
        if len(password) < PASSWORD_MIN:
            raise errors.InvalidInput(f"password: must be at least {PASSWORD_MIN} characters")
        hashed = await asyncio.to_thread(_password_hasher().hash, password)
        return await self.store.users.add(
            name=name,
            password_hash=hashed,
            tenant=tenant,
            role=access.Role(role),
            now=self.clock.now(),
        )

    async def user_remove(self, name: str) -> access.User:
        """Remove a dashboard user (NotFound: there is none); their sessions end at once
        (in other processes within tokens.TOKEN_FRESH_SECONDS)."""
        removed = await self.store.users.remove(name=name, now=self.clock.now())
        self._sessions.clear()
        return removed

    async def users(self) -> list[access.User]:
        return await self.store.users.list()

    async def sign_in(self, name: str, password: str) -> tuple[str, access.WebSession] | None:
        """A new session for the user `name` if `password` is theirs: its secret (for the
        cookie; stored only hashed) and the session; None otherwise. An unknown name costs
        the same hash as a wrong password, so the time taken does not tell names apart."""
        found = await self.store.users.password(name=name)
        stored = found[1] if found is not None else _decoy_hash()
        if not await asyncio.to_thread(_password_matches, stored, password) or found is None:
            return None
        return await self._session_open(user_id=found[0].id, token_id=None)

    async def sign_in_token(self, secret: str) -> tuple[str, access.WebSession] | None:
        """A new session acting as the API token `secret` (while the token stays valid)."""
        token = await self.token_check(secret.strip())
        if token is None:
            return None
        return await self._session_open(user_id=None, token_id=token.id)

    async def _session_open(
        self, *, user_id: int | None, token_id: int | None
    ) -> tuple[str, access.WebSession] | None:
        secret, now = secrets.token_urlsafe(32), self.clock.now()
        await self.store.users.session_add(
            secret_sha256=tokens.token_digest(secret),
            user_id=user_id,
            token_id=token_id,
            csrf=secrets.token_urlsafe(32),
            now=now,
            expires_at=now + SESSION_LIFETIME,
        )
        made = await self.session(secret)
        return None if made is None else (secret, made)

    async def session(self, secret: str) -> access.WebSession | None:
        """The valid session of a cookie's secret, or None (unknown, expired, its user
        removed or its token revoked). As a token is, a session read from the store is
        trusted for tokens.TOKEN_FRESH_SECONDS: one ended through this client ends at once, one
        ended by another process (`corral users remove`) within that."""
        if not secret:
            return None
        digest, fresh, now = tokens.token_digest(secret), self.clock.monotonic(), self.clock.now()
        kept = self._sessions.get(digest)
        if kept is not None and kept[0] > fresh:
            return kept[1] if kept[1].expires_at > now else None
        found = await self.store.users.session_find(secret_sha256=digest, now=now)
        if found is not None:  # unknown secrets are not kept: guesses fill no memory
            if len(self._sessions) >= tokens.TOKENS_KEPT:
                self._sessions.clear()
            self._sessions[digest] = (fresh + tokens.TOKEN_FRESH_SECONDS, found)
        return found

    async def sign_out(self, secret: str) -> None:
        digest = tokens.token_digest(secret)
        self._sessions.pop(digest, None)
        await self.store.users.session_remove(secret_sha256=digest)


def _check_tenant_role(tenant: str | None, role: str) -> None:
    if tenant is not None and not checks.NAME.match(tenant):
        raise errors.InvalidInput(
            f"tenant: {tenant!r} must be 1-200 characters of [A-Za-z0-9_.-], starting alphanumeric"
        )
    if role not in access.Role.__members__.values():
        raise errors.InvalidInput(
            f"role: {role!r} is not a role; use one of {', '.join(access.Role)}"
        )


@functools.cache
def _password_hasher() -> PasswordHasher:
    """argon2id with the library's defaults (imported when first needed: the CLI starts
    without it)."""
    from argon2 import PasswordHasher

    return PasswordHasher()


@functools.cache
def _decoy_hash() -> str:
    """A hash no password is checked against for real: what an unknown user name costs."""
    return _password_hasher().hash(secrets.token_urlsafe(16))


def _password_matches(stored: str, password: str) -> bool:
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return _password_hasher().verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False
