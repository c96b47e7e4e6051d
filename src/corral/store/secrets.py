"""Signing secrets: the keys a tenant's HTTP requests are signed with.

A tenant has at most one current secret (`retires_at` NULL). Making a new one retires
the others at the end of an overlap: until then they sign alongside it, so that a
receiver still on the old key keeps verifying while it moves to the new one.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from corral import access, errors
from corral.store.tables import service_keys, signing_secrets

S = signing_secrets.c


def _row(row: Any) -> access.SigningSecret:
    return access.SigningSecret(
        id=row.id,
        tenant=row.tenant,
        created_at=row.created_at,
        retires_at=row.retires_at,
        fingerprint=fingerprint(row.secret),
    )


def fingerprint(secret: str) -> str:
    """What tells secrets apart when they are listed: never the secret itself."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def _current_check(conn: Connection, tenant: str, rotate: bool) -> None:
    """InvalidInput unless the tenant has a current secret exactly when it is to rotate it
    (the current one locked until the transaction ends)."""
    current = conn.execute(
        select(S.id).where(S.tenant == tenant, S.retires_at.is_(None)).with_for_update()
    ).all()
    if rotate and not current:
        raise errors.InvalidInput(
            f"tenant {tenant!r} has no signing secret to rotate; make one with"
            " `corral secrets create`"
        )
    if not rotate and current:
        raise errors.InvalidInput(
            f"tenant {tenant!r} has a signing secret already; `corral secrets rotate` makes a"
            " new one (the old one signs alongside it for secrets.rotation_overlap)"
        )


def secret_add(
    conn: Connection,
    *,
    tenant: str,
    secret: str,
    now: datetime,
    overlap: timedelta,
    rotate: bool,
) -> access.SigningSecret:
    """Make `secret` the tenant's current one. `rotate`: there must be a current one, which
    signs on until `now + overlap`; otherwise there must be none (InvalidInput says which
    command to use)."""
    _current_check(conn, tenant, rotate)
    conn.execute(
        update(signing_secrets)
        .where(S.tenant == tenant, S.retires_at.is_(None))
        .values(retires_at=now + overlap)
    )
    try:
        with conn.begin_nested():
            made = conn.execute(
                insert(signing_secrets)
                .values(tenant=tenant, secret=secret, created_at=now)
                .returning(*signing_secrets.c)
            ).one()
    except IntegrityError:  # uq_signing_secrets_current: another one was made meanwhile
        raise errors.InvalidInput(
            f"tenant {tenant!r}: another signing secret was made at the same moment; list"
            " them (`corral secrets list`) and rotate again if need be"
        ) from None
    return _row(made)


def secrets_signing(conn: Connection, *, tenants: list[str], now: datetime) -> dict[str, list[str]]:
    """Each tenant's secrets that sign at `now`, newest first (tenants with none left out)."""
    rows = conn.execute(
        select(S.tenant, S.secret)
        .where(S.tenant.in_(tenants), or_(S.retires_at.is_(None), S.retires_at > now))
        .order_by(S.tenant, S.id.desc())
    ).all()
    found: dict[str, list[str]] = {}
    for tenant, secret in rows:
        found.setdefault(tenant, []).append(secret)
    return found


def secrets_list(
    conn: Connection, *, tenant: str | None, now: datetime
) -> list[access.SigningSecret]:
    """The secrets that still sign (of `tenant`, or of every tenant), oldest first."""
    stmt = select(signing_secrets).where(or_(S.retires_at.is_(None), S.retires_at > now))
    if tenant is not None:
        stmt = stmt.where(S.tenant == tenant)
    return [_row(r) for r in conn.execute(stmt.order_by(S.tenant, S.id))]


def service_key(conn: Connection, *, name: str, secret: str, now: datetime) -> str:
    """The shared secret called `name`: the one stored, or else `secret`, stored now. Two
    processes that ask at once get the same one (the loser's insert is dropped)."""
    stored = conn.execute(
        select(service_keys.c.secret).where(service_keys.c.name == name)
    ).scalar_one_or_none()
    if stored is not None:
        return str(stored)
    try:
        with conn.begin_nested():
            conn.execute(insert(service_keys).values(name=name, secret=secret, created_at=now))
    except IntegrityError:  # made meanwhile by another process: theirs stands
        return str(
            conn.execute(
                select(service_keys.c.secret).where(service_keys.c.name == name)
            ).scalar_one()
        )
    return secret
