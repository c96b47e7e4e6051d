"""The route of /api/v1/apply: a tenant's flows, schedules, monitors, alert channels and
rules made what documents say, in one transaction (corral.client.apply), checked and held
to quotas as the tenant's own requests of each kind are. A token of one tenant applies to its own (a
document naming another is refused); a token of every tenant names the tenant with a
`tenant` field (default: default). Operators and admins apply; a dry run changes nothing."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from corral import client, documents, errors
from corral.api.auth import Client, Operator
from corral.api.routes import RESPONSES, audit, plain_json

router = APIRouter(responses=RESPONSES)

FIELDS = ("documents", "files", "tenant", "prune", "dry_run")
"""What a request to apply may say."""


@router.post(
    "/apply",
    summary="Make the tenant's flows, schedules, monitors, alert channels and rules what"
    " documents say, in one transaction: what was done to each (with dry_run, what would be)",
)
async def apply(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any],
        Body(
            description='{"documents": [{"kind": "Schedule", "name": "nightly", "cron": "0 2 * *'
            ' *", "spec": {"url": "https://example.com/export"}, "executor": "http"}],'
            ' "prune": false, "dry_run": true}; or "files": [{"name": "corral.yaml", "text":'
            ' "..."}] in place of documents, each read as `corral apply -f` reads a file'
        ),
    ],
) -> dict[str, Any]:
    if unknown := sorted(set(body) - set(FIELDS)):
        raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: {', '.join(FIELDS)})")
    plain_json(body)
    prune, dry_run = body.get("prune", False), body.get("dry_run", False)
    for field, value in (("prune", prune), ("dry_run", dry_run)):
        if not isinstance(value, bool):
            raise errors.InvalidInput(f"{field}: must be true or false")
    tenant = client.tenant_alerts.whose(who.token.tenant, body.get("tenant"))
    given = client.apply.documents_of(body)
    steps = await c.apply(tenant, given, prune=prune, dry_run=dry_run, limited=True)
    plan = documents.plan_dict(tenant, steps, dry_run=dry_run)
    if not dry_run and any(s.writes for s in steps):
        await audit(c, who, "apply", tenant, tenant, counts=plan["counts"])
    return plan
