"""Who may do what, as corral lists it: API tokens and their roles, dashboard users and
sessions, the signing secrets of a tenant's HTTP requests, and the audit trail of changes
made through the API. Never a secret itself: only what may be shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


@dataclass(frozen=True, slots=True)
class SigningSecret:
    """A key a tenant's HTTP requests are signed with, as it is listed: never the key."""

    id: int
    tenant: str
    created_at: datetime
    retires_at: datetime | None  # None: the current one; else it signs until then
    fingerprint: str


class Role(StrEnum):
    """What an API token may do: each role may do what the ones before it may."""

    VIEWER = "viewer"  # read
    OPERATOR = "operator"  # and submit, cancel, retry, pause
    ADMIN = "admin"  # and manage tokens

    def allows(self, needed: Role) -> bool:
        order = list(Role)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class Token:
    """An API credential as it is listed: never its secret."""

    id: int
    name: str
    tenant: str | None  # None: every tenant (an admin's)
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def valid(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class User:
    """A person who signs in to the dashboard, as listed: never their password's hash."""

    id: int
    name: str
    tenant: str | None  # None: every tenant
    role: Role
    created_at: datetime
    removed_at: datetime | None


@dataclass(frozen=True, slots=True)
class WebSession:
    """A dashboard sign-in that is still valid: who it acts as (a user, or the API token
    signed in with), in which tenant and role, and the CSRF token its forms carry."""

    name: str
    tenant: str | None
    role: Role
    csrf: str
    expires_at: datetime
    user_id: int | None
    token_id: int | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change made through the API."""

    id: int
    at: datetime
    token_id: int | None
    tenant: str | None
    action: str
    target: str
    details: Mapping[str, Any]
