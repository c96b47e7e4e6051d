"""API tokens (the SHA-256 of each secret, never the secret) and the audit log of the
changes made through the API."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, insert, select, update

from corral import access, errors, model
from corral.store import dialects, jobs, secrets
from corral.store.tables import audit, tokens

if TYPE_CHECKING:
    from corral.store.database import Database

T = tokens.c


def _token(row: Any) -> access.Token:
    m = row._mapping
    return access.Token(
        id=m["id"],
        name=m["name"],
        tenant=m["tenant"],
        role=access.Role(m["role"]),
        created_at=m["created_at"],
        expires_at=m["expires_at"],
        revoked_at=m["revoked_at"],
    )


_LISTED = [T.id, T.name, T.tenant, T.role, T.created_at, T.expires_at, T.revoked_at]


def token_add_first_admin(
    conn: Connection, *, name: str, secret_sha256: str, now: datetime
) -> access.Token | None:
    """An all-tenant admin token, stored only where none was ever made (one revoked since
    counts: its operator chose so): the first of an installation, made by whichever corral
    serves its API first. Replicas that start at once take turns here, so exactly one is
    made. None when one exists."""
    dialects.take_turns(conn, "tokens.first_admin")
    admins = select(tokens.c.id).where(
        tokens.c.tenant.is_(None), tokens.c.role == access.Role.ADMIN.value
    )
    if conn.execute(admins.limit(1)).first() is not None:
        return None
    return token_add(
        conn,
        name=name,
        tenant=None,
        role=access.Role.ADMIN,
        secret_sha256=secret_sha256,
        now=now,
        expires_at=None,
    )


def token_add(
    conn: Connection,
    *,
    name: str,
    tenant: str | None,
    role: access.Role,
    secret_sha256: str,
    now: datetime,
    expires_at: datetime | None,
) -> access.Token:
    """Store a token by the SHA-256 of its secret."""
    row = conn.execute(
        insert(tokens)
        .values(
            name=name,
            tenant=tenant,
            role=role.value,
            secret_sha256=secret_sha256,
            created_at=now,
            expires_at=expires_at,
        )
        .returning(*_LISTED)
    ).one()
    return _token(row)


def token_find(conn: Connection, *, secret_sha256: str) -> access.Token | None:
    """The token whose secret has this SHA-256, revoked or expired or not."""
    row = conn.execute(select(*_LISTED).where(T.secret_sha256 == secret_sha256)).first()
    return None if row is None else _token(row)


def token_list(conn: Connection) -> list[access.Token]:
    return [_token(r) for r in conn.execute(select(*_LISTED).order_by(T.id))]


def token_revoke(conn: Connection, *, token_id: int, now: datetime) -> access.Token:
    """Revoke a token from now on (one revoked before stays as it was)."""
    conn.execute(
        update(tokens).where(T.id == token_id, T.revoked_at.is_(None)).values(revoked_at=now)
    )
    row = conn.execute(select(*_LISTED).where(T.id == token_id)).first()
    if row is None:
        raise errors.NotFound(f"no token {token_id} (corral tokens list shows them)")
    return _token(row)


def audit_add(
    conn: Connection,
    *,
    at: datetime,
    token_id: int | None,
    tenant: str | None,
    action: str,
    target: str,
    details: Mapping[str, Any] | None = None,
) -> None:
    conn.execute(
        insert(audit).values(
            at=at,
            token_id=token_id,
            tenant=tenant,
            action=action,
            target=target,
            details=dict(details or {}),
        )
    )


def job_submit_audited(
    conn: Connection,
    *,
    new: Sequence[model.NewJob],
    now: datetime,
    audit: Callable[[list[tuple[int, bool]]], Iterable[Mapping[str, Any]]],
) -> list[tuple[int, bool]]:
    """`jobs.job_submit` and its audit rows (`audit(made)`: audit_add's arguments), in one
    transaction: the jobs are not stored unless their audit is."""
    made = jobs.job_submit(conn, new=new, now=now)
    for row in audit(made):
        audit_add(conn, **row)
    return made


def audit_list(
    conn: Connection, *, tenant: str | None = None, limit: int = 100
) -> list[access.AuditEntry]:
    """The newest changes first; of one tenant's, or of all."""
    stmt = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if tenant is not None:
        stmt = stmt.where(audit.c.tenant == tenant)
    return [access.AuditEntry(**r._mapping) for r in conn.execute(stmt)]


# --- the handle ----------------------------------------------------------------------------


class Tokens:
    """The store's handle on the API's credentials (`store.tokens`): tokens, the audit
    log of what they changed, and the signing secrets and service keys (secrets.py);
    each call one transaction.

    Each method runs the store function its name shortens (`revoke`: token_revoke),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self,
        *,
        name: str,
        tenant: str | None,
        role: access.Role,
        secret_sha256: str,
        now: datetime,
        expires_at: datetime | None,
    ) -> access.Token:
        return await self._db.tx(
            functools.partial(
                token_add,
                name=name,
                tenant=tenant,
                role=role,
                secret_sha256=secret_sha256,
                now=now,
                expires_at=expires_at,
            )
        )

    async def add_first_admin(
        self, *, name: str, secret_sha256: str, now: datetime
    ) -> access.Token | None:
        return await self._db.tx(
            functools.partial(
                token_add_first_admin, name=name, secret_sha256=secret_sha256, now=now
            )
        )

    async def find(self, *, secret_sha256: str) -> access.Token | None:
        return await self._db.lookup(functools.partial(token_find, secret_sha256=secret_sha256))

    async def revoke(self, *, token_id: int, now: datetime) -> access.Token:
        return await self._db.tx(functools.partial(token_revoke, token_id=token_id, now=now))

    async def audit_add(
        self,
        *,
        at: datetime,
        token_id: int | None,
        tenant: str | None,
        action: str,
        target: str,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        await self._db.tx(
            functools.partial(
                audit_add,
                at=at,
                token_id=token_id,
                tenant=tenant,
                action=action,
                target=target,
                details=details,
            )
        )

    async def audit_list(
        self, *, tenant: str | None = None, limit: int = 100
    ) -> list[access.AuditEntry]:
        return await self._db.read(functools.partial(audit_list, tenant=tenant, limit=limit))

    async def secret_add(
        self, *, tenant: str, secret: str, now: datetime, overlap: timedelta, rotate: bool
    ) -> access.SigningSecret:
        return await self._db.tx(
            functools.partial(
                secrets.secret_add,
                tenant=tenant,
                secret=secret,
                now=now,
                overlap=overlap,
                rotate=rotate,
            )
        )

    async def secrets_signing(self, *, tenants: list[str], now: datetime) -> dict[str, list[str]]:
        return await self._db.tx(
            functools.partial(secrets.secrets_signing, tenants=tenants, now=now)
        )

    async def secrets_list(
        self, *, tenant: str | None, now: datetime
    ) -> list[access.SigningSecret]:
        return await self._db.tx(functools.partial(secrets.secrets_list, tenant=tenant, now=now))

    async def service_key(self, *, name: str, secret: str, now: datetime) -> str:
        return await self._db.tx(
            functools.partial(secrets.service_key, name=name, secret=secret, now=now)
        )

    async def list(self) -> list[access.Token]:
        return await self._db.read(token_list)
