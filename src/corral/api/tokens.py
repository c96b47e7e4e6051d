"""The routes of /api/v1/tokens, for admins: make, list and revoke tokens. An admin of one
tenant manages that tenant's tokens only (another's is not found); an admin of every
tenant manages all, and makes a token of every tenant by giving no tenant (or null)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path

from corral import config, errors, model, shapes
from corral.api.auth import Caller, Client, Refused, role
from corral.api.routes import MAX_ID, RESPONSES, audit, plain_json

router = APIRouter(responses=RESPONSES)

Admin = Annotated[Caller, Depends(role(model.Role.ADMIN))]


@router.get("/tokens", summary="The tokens the caller manages (never their secrets)")
async def tokens_list(c: Client, who: Admin) -> list[dict[str, Any]]:
    found = await c.store.tokens.list()
    return [shapes.token_dict(t) for t in found if who.token.tenant in (None, t.tenant)]


@router.post("/tokens", status_code=201, summary="Make a token: its secret is in this answer only")
async def tokens_create(
    c: Client,
    who: Admin,
    body: Annotated[
        dict[str, Any],
        Body(
            description='{"name": "ci", "tenant": "team-a", "role": "operator", "expires": "90d"}'
        ),
    ],
) -> dict[str, Any]:
    unknown = sorted(set(body) - {"name", "tenant", "role", "expires"})
    if unknown:
        raise errors.InvalidInput(
            f"{unknown[0]}: unknown field (allowed: name, tenant, role, expires)"
        )
    for key in ("name", "role"):
        if not isinstance(body.get(key), str):
            raise errors.InvalidInput(f"{key}: required, a string")
    plain_json(body)
    tenant = body.get("tenant", who.token.tenant)  # an admin of one tenant: its own
    if tenant is not None and not isinstance(tenant, str):
        raise errors.InvalidInput("tenant: a string, or null for every tenant")
    if who.token.tenant is not None and tenant != who.token.tenant:
        raise errors.InvalidInput(f"tenant: this token manages tenant {who.token.tenant!r} only")
    expires = body.get("expires")
    if expires is not None and not isinstance(expires, str):
        raise errors.InvalidInput("expires: a duration, e.g. 90d")
    try:
        span = config.parse_duration(expires) if expires is not None else None
    except ValueError as exc:
        raise errors.InvalidInput(f"expires: {exc}") from None
    made, secret = await c.token_create(
        name=body["name"], tenant=tenant, role=body["role"], expires=span
    )
    await audit(
        c, who, "tokens.create", str(made.id), made.tenant, role=str(made.role), name=made.name
    )
    return {**shapes.token_dict(made), "secret": secret}


@router.post("/tokens/{token_id}/revoke", summary="Refuse a token from now on")
async def tokens_revoke(
    c: Client, who: Admin, token_id: Annotated[int, Path(ge=1, le=MAX_ID)]
) -> dict[str, Any]:
    found = {t.id: t for t in await c.store.tokens.list()}.get(token_id)
    if found is None or who.token.tenant not in (None, found.tenant):
        raise Refused(404, f"no token {token_id}")
    done = await c.token_revoke(token_id)
    await audit(c, who, "tokens.revoke", str(token_id), found.tenant)
    return shapes.token_dict(done)
