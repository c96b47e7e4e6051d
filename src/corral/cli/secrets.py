"""`corral secrets`: the keys each tenant's HTTP requests are signed with."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from corral import access, shapes
from corral.cli import render
from corral.cli.common import State, config_option, json_option, out, print_json, run

if TYPE_CHECKING:
    pass


@click.group()
def secrets() -> None:
    """Make, rotate and list the secrets HTTP requests are signed with."""


def _made(state: State, tenant: str, *, rotate: bool, as_json: bool) -> None:
    async def go() -> tuple[str, access.SigningSecret]:
        async with state.connect(platforms=False) as c:
            return await c.secret_make(tenant=tenant, rotate=rotate)

    secret, made = run(go())
    if as_json:
        print_json({"secret": secret, **shapes.secret_dict(made)})
        return
    out.print(secret, highlight=False, soft_wrap=True)
    out.print(
        f"[dim]tenant {made.tenant}'s signing secret {made.fingerprint}; it is shown this once:"
        " give it to the receivers, which verify the webhook-signature header with it[/dim]"
    )


@secrets.command("create")
@click.option("--tenant", default="default", show_default=True)
@json_option
@config_option
@click.pass_obj
def secrets_create(state: State, tenant: str, as_json: bool) -> None:
    """Make a tenant's first signing secret and print it (the one time it is shown)."""
    _made(state, tenant, rotate=False, as_json=as_json)


@secrets.command("rotate")
@click.option("--tenant", default="default", show_default=True)
@json_option
@config_option
@click.pass_obj
def secrets_rotate(state: State, tenant: str, as_json: bool) -> None:
    """Make a new signing secret; the current one signs alongside it for
    secrets.rotation_overlap (default 24h), then retires."""
    _made(state, tenant, rotate=True, as_json=as_json)


@secrets.command("list")
@click.option("--tenant", default=None, help="Only this tenant's.")
@json_option
@config_option
@click.pass_obj
def secrets_list(state: State, tenant: str | None, as_json: bool) -> None:
    """The secrets that sign now (fingerprints, never the secrets)."""

    async def go() -> list[access.SigningSecret]:
        async with state.connect(platforms=False) as c:
            return await c.signing_secrets(tenant=tenant)

    found = run(go())
    if as_json:
        print_json([shapes.secret_dict(s) for s in found])
        return
    out.print(render.secrets_table(found))
