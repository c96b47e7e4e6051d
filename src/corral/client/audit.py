"""The audit log: who changed what through the API and the dashboard, each row about one
tenant, so that tenant's viewers see it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral import access
from corral.client import service


class Audit(service.Service):
    """Write and read the audit log."""

    async def audit_add(
        self,
        *,
        token_id: int | None,
        tenant: str | None,
        action: str,
        target: str,
        details: Mapping[str, Any],
    ) -> None:
        """Write the audit row of a change made now."""
        await self.store.tokens.audit_add(
            at=self.clock.now(),
            token_id=token_id,
            tenant=tenant,
            action=action,
            target=target,
            details=details,
        )

    async def audit_list(
        self, *, tenant: str | None = None, limit: int = 100
    ) -> list[access.AuditEntry]:
        """The newest audit rows, of `tenant` (None: of every tenant)."""
        return await self.store.tokens.audit_list(tenant=tenant, limit=limit)
