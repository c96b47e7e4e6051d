"""`corral users`: the people who sign in to the dashboard, each for one tenant (or all)
in one role. Passwords are read from a prompt or stdin, never from the command line."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from corral import access, shapes
from corral.cli import render
from corral.cli.common import State, config_option, json_option, out, print_json, run

if TYPE_CHECKING:
    pass

ROLES = ("viewer", "operator", "admin")


@click.group()
def users() -> None:
    """Add, list and remove dashboard users."""


@users.command("add")
@click.argument("name")
@click.option("--tenant", default=None, help="The tenant they see and act for.")
@click.option("--all-tenants", is_flag=True, help="See every tenant (not with --tenant).")
@click.option("--role", type=click.Choice(ROLES), required=True, help="What they may do.")
@click.option(
    "--password-stdin", is_flag=True, help="Read the password from stdin (its first line)."
)
@config_option
@click.pass_obj
def users_add(
    state: State,
    name: str,
    tenant: str | None,
    all_tenants: bool,
    role: str,
    password_stdin: bool,
) -> None:
    """Add a user; the password is asked for twice (or read with --password-stdin)."""
    if all_tenants == (tenant is not None):
        raise click.UsageError("give --tenant T, or --all-tenants")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)

    async def go() -> access.User:
        async with state.connect(platforms=False) as c:
            return await c.user_add(name, password=password, tenant=tenant, role=role)

    made = run(go())
    out.print(f"user {made.name}: {made.role} of {made.tenant or 'every tenant'}")


@users.command("list")
@json_option
@config_option
@click.pass_obj
def users_list(state: State, as_json: bool) -> None:
    """Every user: whom they act for, in what role (never their password)."""

    async def go() -> list[access.User]:
        async with state.connect(platforms=False) as c:
            return await c.users()

    found = run(go())
    if as_json:
        print_json([shapes.user_dict(u) for u in found])
        return
    out.print(render.users_table(found))


@users.command("remove")
@click.argument("name")
@config_option
@click.pass_obj
def users_remove(state: State, name: str) -> None:
    """Remove a user; their sessions end at once."""

    async def go() -> access.User:
        async with state.connect(platforms=False) as c:
            return await c.user_remove(name)

    done = run(go())
    out.print(f"user {done.name} removed")
