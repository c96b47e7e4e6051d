"""Each tenant's quotas beside what it uses of them, and its weight in the claims' fair share:
what `corral tenants`, GET /api/v1/tenant, the dashboard's overview and /metrics show.

A tenant's quotas are its settings over `[tenants."*"]`'s (tenancy.resolved); its use is
read from the store in grouped statements (store.tenants), for one tenant or for every
tenant at once, never a read per tenant.
"""

from __future__ import annotations

from datetime import datetime

from corral import config, errors, tenancy, usage
from corral.client import service


def view_of(settings: config.Settings, tenant: str, use: usage.Use, now: datetime) -> usage.View:
    """`tenant`'s quotas under `settings` beside its `use` at `now`, and its weight. A
    payload's limit is the lower of the tenant's max_payload_bytes and the global one."""
    mine = tenancy.resolved(settings.tenants, tenant)
    payload = settings.max_payload_bytes
    if mine.max_payload_bytes is not None:
        payload = min(payload, mine.max_payload_bytes)
    submitted = round(usage.bucket_use(mine.submit_rate, use.bucket, now), 3)
    return usage.View(
        tenant=tenant,
        weight=mine.weight,
        quotas=(
            usage.Quota("max_running", mine.max_running, use.running),
            usage.Quota("max_queued", mine.max_queued, use.waiting),
            usage.Quota("max_schedules", mine.max_schedules, use.schedules),
            usage.Quota("max_monitors", mine.max_monitors, use.monitors),
            usage.Quota("submit_rate", mine.submit_rate, submitted),
            usage.Quota("max_payload_bytes", payload, None),
            usage.Quota("run_log_bytes", mine.run_log_bytes, use.log_bytes),
        ),
    )


class Tenants(service.Service):
    """Tenants' quotas and their use. The callers scope them: a tenant's token or session
    asks for its own tenant only."""

    def named(self) -> list[str]:
        """The tenants the settings name (`[tenants.NAME]`; not `"*"`)."""
        return sorted(name for name in self.settings.tenants if name != tenancy.ANY)

    async def tenant_view(self, tenant: str) -> usage.View:
        """`tenant`'s quotas, its use of them now, and its weight; NotFound for a tenant
        corral knows nothing of (named in no settings, owning no token, dashboard user,
        job or schedule)."""
        use = await self.store.tenants.use(tenant=tenant)
        known = use != usage.Use() or tenant in self.settings.tenants
        if not known and tenant not in await self.store.tenants.known():
            raise errors.NotFound(
                f"no tenant {tenant!r}: corral knows those corral.toml names and those that"
                " own a token, a dashboard user, a job or a schedule"
            )
        return view_of(self.settings, tenant, use, self.clock.now())

    async def tenant_views(self) -> list[usage.View]:
        """Every tenant corral knows (named in the settings, or owning a token, a dashboard
        user, a job or a schedule), by name, each with its quotas and its use now: one
        read of the store for them all."""
        every = await self.store.tenants.every()
        now = self.clock.now()
        return [
            view_of(self.settings, name, every.get(name, usage.Use()), now)
            for name in sorted({*every, *self.named()})
        ]
