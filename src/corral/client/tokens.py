"""API tokens: made with a secret shown once and stored hashed, checked on each request
(kept read for a few seconds), revoked; and the attempt tokens a job carries."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from corral import access, clock, config, errors, launching, plain, store
from corral.client import checks, service

TOKEN_FRESH_SECONDS = 5.0
"""How long an API process trusts a token it has read from the store (one read a token
every five seconds, not one a request)."""
TOKENS_KEPT = 10_000
"""Most tokens an API process keeps read at once."""
TOKEN_PREFIX = "corral_"
"""How an API token's secret starts (secret scanners can look for it)."""

ATTEMPT_KEY = "attempts"
"""The service key (store.service_key) attempt tokens are signed with."""


async def attempt_key(settings: config.Settings, db: store.Store, clk: clock.Clock) -> str:
    """The key of attempt tokens: settings.attempt_key, else the one kept in the store (made
    by the first process that asks), so every dispatcher and API process agrees on it."""
    if settings.attempt_key:
        return settings.attempt_key
    made = secrets.token_urlsafe(48)
    return await db.tokens.service_key(name=ATTEMPT_KEY, secret=made, now=clk.now())


def token_digest(secret: str) -> str:
    """What the store keeps of a token's secret: its SHA-256 (the secret is 256 random
    bits, so a fast hash is enough; a slow one is for passwords people choose)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class Tokens(service.Service):
    """Make, check and revoke API tokens; read attempt tokens."""

    async def first_admin_token(self) -> tuple[access.Token, str] | None:
        """An all-tenant admin token and its secret (shown this once), made only where no
        all-tenant admin token was ever made: what `serve --http` hands a new installation.
        None otherwise (exactly one, however many corrals start at once)."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        made = await self.store.tokens.add_first_admin(
            name="first admin", secret_sha256=token_digest(secret), now=self.clock.now()
        )
        return None if made is None else (made, secret)

    async def token_create(
        self,
        *,
        name: str,
        tenant: str | None,
        role: str,
        expires: timedelta | None = None,
    ) -> tuple[access.Token, str]:
        """Make an API token for `tenant` (None: every tenant) in `role`: the token as
        listed, and its secret, which is shown this once and stored only hashed."""
        if tenant is not None and not checks.NAME.match(tenant):
            raise errors.InvalidInput(
                f"tenant: {tenant!r} must be 1-200 characters of [A-Za-z0-9_.-],"
                " starting alphanumeric"
            )
        if role not in access.Role.__members__.values():
            raise errors.InvalidInput(
                f"role: {role!r} is not a role; use one of {', '.join(access.Role)}"
            )
        if not name.strip() or len(name) > 200:
            raise errors.InvalidInput("name: must be 1-200 characters")
        if (rule := plain.fault(name)) is not None:
            raise errors.InvalidInput(f"name: {rule}")
        if expires is not None and expires <= timedelta(0):
            raise errors.InvalidInput("expires: must be longer than zero")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self.clock.now()
        made = await self.store.tokens.add(
            name=name,
            tenant=tenant,
            role=access.Role(role),
            secret_sha256=token_digest(secret),
            now=now,
            expires_at=None if expires is None else now + expires,
        )
        return made, secret

    async def tokens(self) -> list[access.Token]:
        """Every token made (never a secret)."""
        return await self.store.tokens.list()

    async def token_check(self, secret: str) -> access.Token | None:
        """The token of `secret` if it may be used now (not revoked, not expired). A token
        read from the store is trusted for TOKEN_FRESH_SECONDS: a revoke made by another
        process reaches this one within that; one made through this client, at once."""
        if not secret.startswith(TOKEN_PREFIX):
            return None
        digest, now = token_digest(secret), self.clock.monotonic()
        kept = self._tokens.get(digest)
        if kept is not None and kept[0] > now:
            found: access.Token | None = kept[1]
        else:
            found = await self.store.tokens.find(secret_sha256=digest)
            if found is not None:  # unknown secrets are not kept: guesses fill no memory
                if len(self._tokens) >= TOKENS_KEPT:
                    self._tokens.clear()
                self._tokens[digest] = (now + TOKEN_FRESH_SECONDS, found)
        return found if found is not None and found.valid(self.clock.now()) else None

    async def token_revoke(self, token_id: int) -> access.Token:
        """Revoke token `token_id` (NotFound: there is none); refused here at once, and by
        other API processes within TOKEN_FRESH_SECONDS."""
        done = await self.store.tokens.revoke(token_id=token_id, now=self.clock.now())
        self._tokens.clear()
        self._sessions.clear()  # the sessions signed in with it end with it
        return done

    async def attempt_of(self, token: str) -> tuple[int, int] | None:
        """(job_id, fence) of an attempt token this installation made; None for any other.
        Whether that attempt may still act is for the store to say (`store.attempt_check`)."""
        if not token.startswith(launching.ATTEMPT_TOKEN_PREFIX):
            return None
        if self._attempt_key is None:
            self._attempt_key = await attempt_key(self.settings, self.store, self.clock)
        return launching.attempt_token_read(self._attempt_key, token)
