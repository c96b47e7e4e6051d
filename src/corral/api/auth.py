"""Who is calling the API: the bearer token of each request, its tenant and its role."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from pydantic import BaseModel

from corral import access, client, errors


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: their token."""

    token: access.Token

    def sees(self, tenant: str) -> bool:
        return self.token.tenant is None or self.token.tenant == tenant


class ErrorBody(BaseModel):
    """Every error's body: what is wrong, and the field it is about when there is one."""

    error: str
    field: str | None = None


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (400, "The body is not JSON"),
        (401, "No token, or one unknown, expired or revoked"),
        (
            403,
            "The token's role may not do this, its tenant is not granted the executor, or"
            " the request would break a quota of its tenant",
        ),
        (404, "Not found (another tenant's is not found either)"),
        (413, "The body is too large"),
        (422, "A field is wrong: the error names it and the rule"),
        (503, "The database cannot be reached"),
    )
}
"""The error answers every route may give, for the OpenAPI document."""


def client_of(request: Request) -> client.Client:
    c: client.Client = request.app.state.client
    return c


async def the_client(request: Request) -> client.Client:
    """The dependency of the client: async, as a plain function would be run on a worker
    thread for every request."""
    return client_of(request)


async def caller(request: Request) -> Caller:
    """The token of the request; 401 without a usable one."""
    said = request.headers.get("authorization", "")
    scheme, _, secret = said.partition(" ")
    challenge = {"WWW-Authenticate": "Bearer"}
    if scheme.lower() != "bearer" or not secret.strip():
        raise errors.RequestRefused(
            401, "authorization: send Authorization: Bearer <token>", headers=challenge
        )
    found = await client_of(request).token_check(secret.strip())
    if found is None:
        raise errors.RequestRefused(
            401, "authorization: the token is unknown, expired or revoked", headers=challenge
        )
    return Caller(found)


def role(needed: access.Role) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency: the caller, when their role allows what `needed` may do (else 403)."""

    async def check(who: Annotated[Caller, Depends(caller)]) -> Caller:
        if not who.token.role.allows(needed):
            raise errors.RequestRefused(
                403, f"role: {who.token.role} may not do this; it takes {needed}"
            )
        return who

    return check


Viewer = Annotated[Caller, Depends(role(access.Role.VIEWER))]
Operator = Annotated[Caller, Depends(role(access.Role.OPERATOR))]
Client = Annotated[client.Client, Depends(the_client)]
Since = Annotated[datetime | None, Query(description="Created at or after (ISO 8601).")]
