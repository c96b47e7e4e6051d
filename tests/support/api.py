"""The REST API over a store, called through httpx against the app (no server), with a
token of each kind: what the API's tests share."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from corral import client, clock, config, store, tenancy
from corral.api import create_app
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

JOB = {"spec": {}, "executor": "noop"}
"""The body of a job the no-op executor runs."""


class Api:
    """The app over one store, and a token of each kind to call it with."""

    def __init__(self, c: client.Client, http: httpx.AsyncClient) -> None:
        self.c = c
        self.http = http
        self.secrets: dict[str, str] = {}

    async def token(self, name: str, tenant: str | None, role: str, **kw: Any) -> str:
        _, secret = await self.c.token_create(name=name, tenant=tenant, role=role, **kw)
        self.secrets[name] = secret
        return secret

    def as_(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[name]}"}


def granting(settings: config.Settings, *kinds: str, tenant: str = tenancy.ANY) -> config.Settings:
    """`settings` with `tenant` (default: every tenant not named) granted `kinds` besides
    the default grant. Made without the settings' checks: the no-op executor is no
    registered one, so no corral.toml could grant it, and `process` only where tenants'
    commands run as strangers (executors.process.uid_range or .sandbox)."""
    grant = (*tenancy.granted(settings.tenants, tenant), *kinds)
    table = settings.tenants.get(tenant, tenancy.TenantSettings())
    tenants = {**settings.tenants, tenant: table.model_copy(update={"executors": grant})}
    return settings.model_copy(update={"tenants": tenants})


def noop_client(
    db: store.Store, *, settings: config.Settings | None = None, clock_: clock.Clock | None = None
) -> client.Client:
    """A client over `db` with the no-op executor, granted to every tenant, on `settings`
    (else the defaults) and `clock_` (else a frozen clock)."""
    return client.Client(
        store=db,
        executors={"noop": NoopExecutor()},
        settings=granting(config.Settings() if settings is None else settings, "noop"),
        clock=FrozenClock() if clock_ is None else clock_,
    )


@contextlib.asynccontextmanager
async def over_http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client calling the app (the API and the dashboard) over `c`, no server."""
    transport = httpx.ASGITransport(app=create_app(c))
    async with httpx.AsyncClient(transport=transport, base_url="http://corral.test") as http:
        yield http


@contextlib.asynccontextmanager
async def as_operator_of(c: client.Client, tenant: str) -> AsyncIterator[httpx.AsyncClient]:
    """`over_http` with a new operator token of `tenant` on every request."""
    _, secret = await c.token_create(name=f"{tenant}-op", tenant=tenant, role="operator")
    async with over_http(c) as made:
        made.headers["Authorization"] = f"Bearer {secret}"
        yield made


async def sign_in(
    http: httpx.AsyncClient,
    *,
    to: str = "/ui/jobs",
    headers: Mapping[str, str] | None = None,
    **fields: str,
) -> httpx.Response:
    """The dashboard's sign-in form posted with `fields` (name, password), going `to` next;
    `headers` on both requests (e.g. a proxy's X-Forwarded-For)."""
    form = await http.get("/ui/sign-in", headers=headers)
    pairing = re.search(r'name="pairing" value="([^"]+)"', form.text)
    assert pairing is not None
    return await http.post(
        "/ui/sign-in", headers=headers, data={"pairing": pairing[1], "next": to, **fields}
    )


@contextlib.asynccontextmanager
async def serving(
    db: store.Store,
    tokens: Sequence[tuple[str, str | None, str]],
    *,
    settings: config.Settings | None = None,
    clock_: clock.Clock | None = None,
) -> AsyncIterator[Api]:
    """The app over `db` with the no-op executor, on `settings` (else the defaults) and
    `clock_` (else a frozen clock), and `tokens`, each (name, tenant, role), made in order."""
    c = noop_client(db, settings=settings, clock_=clock_)
    async with over_http(c) as http:
        made = Api(c, http)
        for name, tenant, role in tokens:
            await made.token(name, tenant, role)
        yield made
