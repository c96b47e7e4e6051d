"""Flows a tenant owns (corral.flows): made from a request's body, listed, shown with what
they use now, changed and deleted, always within one tenant (another's is not found).

`tenant` is the tenant the caller acts on: the API and the dashboard settle it from the
token or the session (client.tenant_alerts.whose), the CLI from `--tenant` (the operator).
A flow is read as at the client's clock: a hold that has ended is shown as none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral import errors
from corral import flows as flow_rules  # the client's `flows` is a method
from corral.client import service


class Flows(service.Service):
    """Make, list, show, change and delete tenants' flows."""

    async def flows(self, tenant: str) -> list[flow_rules.Flow]:
        """`tenant`'s flows, by name."""
        now = self.clock.now()
        return [f.as_at(now) for f in await self.store.flows.of(tenant=tenant)]

    async def flow(self, tenant: str, name: str) -> tuple[flow_rules.Flow, flow_rules.Use]:
        """`tenant`'s flow `name` and what it uses now; NotFound when it has none so named."""
        found = await self.store.flows.get(tenant=tenant, name=name)
        if found is None:
            raise errors.NotFound(f"no flow {name!r}")
        now = self.clock.now()
        return found.as_at(now), await self.store.flows.use(flow=found, now=now)

    async def flow_add(self, tenant: str, body: Mapping[str, Any]) -> flow_rules.Flow:
        """Make `tenant`'s flow of a request's body (`name`, `rate` N/PERIOD, `parallelism`);
        InvalidInput naming the field that is wrong, Conflict when the name is taken."""
        name = flow_rules.name_checked(body.get("name"))
        limits = flow_rules.limits_of(body)
        return await self.store.flows.add(
            tenant=tenant, name=name, limits=limits, now=self.clock.now(), most=flow_rules.MAX_FLOWS
        )

    async def flow_update(self, tenant: str, name: str, body: Mapping[str, Any]) -> flow_rules.Flow:
        """Change the limits a request's body names (`rate`, `parallelism`; null or `none`
        for none) of `tenant`'s flow `name`; NotFound when it has none so named."""
        if await self.store.flows.get(tenant=tenant, name=name) is None:
            raise errors.NotFound(f"no flow {name!r}")  # first: a stranger learns nothing more
        given = {k: v for k, v in body.items() if k != "name"}
        if not set(given) & {"rate", "parallelism"}:
            raise errors.InvalidInput("rate: give rate or parallelism (or both) to change")
        limits = flow_rules.limits_of(given)
        changed = await self.store.flows.update(
            tenant=tenant, name=name, limits=limits, now=self.clock.now()
        )
        if changed is None:
            raise errors.NotFound(f"no flow {name!r}")
        return changed.as_at(self.clock.now())

    async def flow_delete(self, tenant: str, name: str) -> None:
        """Delete `tenant`'s flow `name`: NotFound when it has none so named, Conflict while
        a job of it has not ended or a schedule names it."""
        if not await self.store.flows.delete(tenant=tenant, name=name):
            raise errors.NotFound(f"no flow {name!r}")
