"""`corral tokens`: the credentials of the API, each for one tenant (or all) in one role."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import click

from corral.cli import render
from corral.cli.common import State, config_option, json_option, out, print_json, run

if TYPE_CHECKING:
    from corral import model

ROLES = ("viewer", "operator", "admin")


@click.group()
def tokens() -> None:
    """Make, list and revoke API tokens."""


@tokens.command("create")
@click.option("--tenant", default=None, help="The tenant it acts for.")
@click.option(
    "--all-tenants", is_flag=True, help="Act for every tenant (an admin's; not with --tenant)."
)
@click.option("--role", type=click.Choice(ROLES), required=True, help="What it may do.")
@click.option("--expires", default=None, help="How long it is valid, e.g. 90d (default: always).")
@click.option("--name", default=None, help="What it is for (default: tenant and role).")
@json_option
@config_option
@click.pass_obj
def tokens_create(
    state: State,
    tenant: str | None,
    all_tenants: bool,
    role: str,
    expires: str | None,
    name: str | None,
    as_json: bool,
) -> None:
    """Make a token and print it, alone on the last line (the one time it is shown)."""
    from corral import config

    if all_tenants == (tenant is not None):
        raise click.UsageError("give --tenant T, or --all-tenants (for an admin token)")
    span: timedelta | None = None
    if expires is not None:
        try:
            span = config.parse_duration(expires)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--expires") from None

    async def go() -> tuple[model.Token, str]:
        async with state.connect(platforms=False) as c:
            return await c.token_create(
                name=name or f"{tenant or 'all tenants'} {role}",
                tenant=tenant,
                role=role,
                expires=span,
            )

    made, secret = run(go())
    if as_json:
        print_json({"secret": secret, **render.token_dict(made)})
        return
    out.print(
        f"[dim]token {made.id} ({made.name}): {made.role} of"
        f" {made.tenant or 'every tenant'}, {render.token_expiry(made)}; shown this once:"
        " send it as Authorization: Bearer <token>[/dim]"
    )
    out.print(secret, highlight=False, soft_wrap=True)


@tokens.command("list")
@json_option
@config_option
@click.pass_obj
def tokens_list(state: State, as_json: bool) -> None:
    """Every token: whom it acts for, in what role, until when (never its secret)."""

    async def go() -> list[model.Token]:
        async with state.connect(platforms=False) as c:
            return await c.store.tokens.list()

    found = run(go())
    if as_json:
        print_json([render.token_dict(t) for t in found])
        return
    out.print(render.tokens_table(found))


@tokens.command("revoke")
@click.argument("token_id", type=click.IntRange(min=1))
@config_option
@click.pass_obj
def tokens_revoke(state: State, token_id: int) -> None:
    """Refuse a token from now on."""

    async def go() -> model.Token:
        async with state.connect(platforms=False) as c:
            return await c.token_revoke(token_id)

    done = run(go())
    out.print(f"token {done.id} ({done.name}) revoked at {render.when(done.revoked_at)}")
