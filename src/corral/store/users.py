"""The dashboard's users (a password hash each, never the password) and its sign-ins
(the SHA-256 of each session's secret, never the secret).

A removed user keeps their row, so what they did stays attributed; their name may be
given to a new user, who takes the row over. Removing a user, or revoking the token a
session was opened with, ends their sessions at once: a session is read joined to its
user or token, never trusted alone.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, insert, or_, select, update

from corral import access, errors
from corral.store.tables import tokens, users, web_sessions

if TYPE_CHECKING:
    from corral.store.database import Database

U, W, T = users.c, web_sessions.c, tokens.c
_LISTED = [U.id, U.name, U.tenant, U.role, U.created_at, U.removed_at]


def _user(row: Any) -> access.User:
    m = row._mapping
    return access.User(
        id=m["id"],
        name=m["name"],
        tenant=m["tenant"],
        role=access.Role(m["role"]),
        created_at=m["created_at"],
        removed_at=m["removed_at"],
    )


def user_add(
    conn: Connection,
    *,
    name: str,
    password_hash: str,
    tenant: str | None,
    role: access.Role,
    now: datetime,
) -> access.User:
    """Store a user; Conflict when one of that name exists (a removed one's row is reused)."""
    old = conn.execute(select(U.id, U.removed_at).where(U.name == name).with_for_update()).first()
    if old is not None and old.removed_at is None:
        raise errors.Conflict(f"name: a user {name!r} exists already (corral users list)")
    values = {
        "password_hash": password_hash,
        "tenant": tenant,
        "role": role.value,
        "created_at": now,
        "removed_at": None,
    }
    if old is None:
        stmt: Any = insert(users).values(name=name, **values)
    else:
        stmt = update(users).where(U.id == old.id).values(**values)
    conn.execute(stmt)
    return _user(conn.execute(select(*_LISTED).where(U.name == name)).one())


def user_password(conn: Connection, *, name: str) -> tuple[access.User, str] | None:
    """A user who has not been removed, and their password's hash; None if there is none."""
    row = conn.execute(
        select(*_LISTED, U.password_hash).where(U.name == name, U.removed_at.is_(None))
    ).first()
    return None if row is None else (_user(row), row.password_hash)


def user_list(conn: Connection) -> list[access.User]:
    """The users who have not been removed, by name."""
    stmt = select(*_LISTED).where(U.removed_at.is_(None)).order_by(U.name)
    return [_user(r) for r in conn.execute(stmt)]


def user_remove(conn: Connection, *, name: str, now: datetime) -> access.User:
    """Remove a user and end their sessions; NotFound when there is no such user."""
    row = conn.execute(select(U.id).where(U.name == name, U.removed_at.is_(None))).first()
    if row is None:
        raise errors.NotFound(f"no user {name!r} (corral users list shows them)")
    conn.execute(update(users).where(U.id == row.id).values(removed_at=now))
    conn.execute(delete(web_sessions).where(W.user_id == row.id))
    return _user(conn.execute(select(*_LISTED).where(U.id == row.id)).one())


def session_add(
    conn: Connection,
    *,
    secret_sha256: str,
    user_id: int | None,
    token_id: int | None,
    csrf: str,
    now: datetime,
    expires_at: datetime,
) -> None:
    """Store a session (of a user or of an API token), and drop those expired by `now`."""
    conn.execute(delete(web_sessions).where(W.expires_at <= now))
    conn.execute(
        insert(web_sessions).values(
            secret_sha256=secret_sha256,
            user_id=user_id,
            token_id=token_id,
            csrf=csrf,
            created_at=now,
            expires_at=expires_at,
        )
    )


_SESSION = (
    W.csrf,
    W.expires_at,
    W.user_id,
    W.token_id,
    U.name.label("user_name"),
    U.tenant.label("user_tenant"),
    U.role.label("user_role"),
    T.name.label("token_name"),
    T.tenant.label("token_tenant"),
    T.role.label("token_role"),
)
"""What a session's check reads: the session, and its user's or its token's name, tenant
and role."""


def session_find(
    conn: Connection, *, secret_sha256: str, now: datetime
) -> access.WebSession | None:
    """The session of this secret if it is valid at `now`: not expired, and its user not
    removed (or its token neither revoked nor expired); None otherwise."""
    stmt = (
        select(*_SESSION)
        .select_from(
            web_sessions.outerjoin(users, U.id == W.user_id).outerjoin(tokens, T.id == W.token_id)
        )
        .where(W.secret_sha256 == secret_sha256, W.expires_at > now)
        .where(
            or_(
                U.removed_at.is_(None) & U.id.is_not(None),
                T.revoked_at.is_(None)
                & T.id.is_not(None)
                & or_(T.expires_at.is_(None), T.expires_at > now),
            )
        )
    )
    row = conn.execute(stmt).first()
    if row is None:
        return None
    of_user = row.user_id is not None
    return access.WebSession(
        name=row.user_name if of_user else f"token {row.token_id} ({row.token_name})",
        tenant=row.user_tenant if of_user else row.token_tenant,
        role=access.Role(row.user_role if of_user else row.token_role),
        csrf=row.csrf,
        expires_at=row.expires_at,
        user_id=row.user_id,
        token_id=row.token_id,
    )


def session_remove(conn: Connection, *, secret_sha256: str) -> None:
    """End a session (signing out); nothing when there is none."""
    conn.execute(delete(web_sessions).where(W.secret_sha256 == secret_sha256))


# --- the handle ----------------------------------------------------------------------------


class Users:
    """The store's handle on the dashboard's users and sessions (`store.users`): each call
    one transaction.

    Each method runs the store function its name shortens (`remove`: user_remove),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self, *, name: str, password_hash: str, tenant: str | None, role: access.Role, now: datetime
    ) -> access.User:
        return await self._db.tx(
            functools.partial(
                user_add, name=name, password_hash=password_hash, tenant=tenant, role=role, now=now
            )
        )

    async def password(self, *, name: str) -> tuple[access.User, str] | None:
        return await self._db.lookup(functools.partial(user_password, name=name))

    async def remove(self, *, name: str, now: datetime) -> access.User:
        return await self._db.tx(functools.partial(user_remove, name=name, now=now))

    async def session_add(
        self,
        *,
        secret_sha256: str,
        user_id: int | None,
        token_id: int | None,
        csrf: str,
        now: datetime,
        expires_at: datetime,
    ) -> None:
        await self._db.tx(
            functools.partial(
                session_add,
                secret_sha256=secret_sha256,
                user_id=user_id,
                token_id=token_id,
                csrf=csrf,
                now=now,
                expires_at=expires_at,
            )
        )

    async def session_find(self, *, secret_sha256: str, now: datetime) -> access.WebSession | None:
        return await self._db.lookup(
            functools.partial(session_find, secret_sha256=secret_sha256, now=now)
        )

    async def session_remove(self, *, secret_sha256: str) -> None:
        await self._db.tx(functools.partial(session_remove, secret_sha256=secret_sha256))

    async def list(self) -> list[access.User]:
        return await self._db.read(user_list)
