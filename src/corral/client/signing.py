"""The signing secrets of a tenant's HTTP requests (Standard Webhooks)."""

from __future__ import annotations

import base64
import secrets

from corral import access
from corral.client import service


class Signing(service.Service):
    """Make, rotate and list signing secrets."""

    async def secret_make(
        self, *, tenant: str = "default", rotate: bool = False
    ) -> tuple[str, access.SigningSecret]:
        """A new signing secret for `tenant`'s HTTP requests (`whsec_` and 32 random bytes in
        base64, the Standard Webhooks form): the secret, shown this once, and its record.
        `rotate`: it replaces the current one, which signs alongside it for
        secrets.rotation_overlap."""
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        made = await self.store.tokens.secret_add(
            tenant=tenant,
            secret=secret,
            now=self.clock.now(),
            overlap=self.settings.secrets.rotation_overlap,
            rotate=rotate,
        )
        return secret, made

    async def signing_secrets(self, *, tenant: str | None = None) -> list[access.SigningSecret]:
        """The signing secrets that still sign (never their values)."""
        return await self.store.tokens.secrets_list(tenant=tenant, now=self.clock.now())
