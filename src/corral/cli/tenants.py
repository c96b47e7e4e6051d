"""`corral tenants list | show`: each tenant's quotas beside what it uses of them, and its
weight in the claims' fair share. The command acts as the operator: it sees every tenant
(a tenant's own token sees its own with GET /api/v1/tenant)."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.table import Table

from corral import shapes, usage
from corral.cli import render
from corral.cli.common import State, config_option, json_option, out, print_json, run

COLUMNS = {
    "max_running": "running",
    "max_queued": "waiting",
    "max_schedules": "schedules",
    "submit_rate": "submits",
    "run_log_bytes": "run logs",
}
"""The quotas `list` shows, by the heading of their column (use/limit in each, submits a
minute; a payload's limit, which nothing uses up, is `show`'s)."""


@click.group()
def tenants() -> None:
    """Each tenant's quotas, what it uses of them, and its weight in the claims."""


@tenants.command("list")
@json_option
@config_option
@click.pass_obj
def tenants_list(state: State, as_json: bool) -> None:
    """Every tenant corral knows (named in corral.toml, or owning a token, a dashboard user,
    a job or a schedule): its weight, and each quota as use/limit."""

    async def go() -> list[usage.View]:
        async with state.connect(platforms=False) as c:
            return await c.tenant_views()

    found = run(go())
    if as_json:
        print_json([shapes.tenant_dict(v) for v in found])
        return
    out.print(tenants_table(found))


@tenants.command("show")
@click.argument("name")
@json_option
@config_option
@click.pass_obj
def tenants_show(state: State, name: str, as_json: bool) -> None:
    """One tenant: its weight, and each quota with its limit, its use and the part used."""

    async def go() -> usage.View:
        async with state.connect(platforms=False) as c:
            return await c.tenant_view(name)

    view = run(go())
    if as_json:
        print_json(shapes.tenant_dict(view))
        return
    out.print(f"tenant {view.tenant}  weight {view.weight:g}", markup=False)
    out.print(quotas_table(view))


def tenants_table(views: Sequence[usage.View]) -> Table:
    """A row a tenant: its weight, then use/limit of each quota but the payload's."""
    t = render.table("tenant", "weight", *COLUMNS.values(), keep=("weight", "run logs"))
    for view in views:
        cells = ["/".join(usage.said(view.quota(name))) for name in COLUMNS]
        t.add_row(view.tenant, f"{view.weight:g}", *cells)
    return t


def quotas_table(view: usage.View) -> Table:
    """A row a quota: its use, its limit, and the part of it used."""
    t = render.table("quota", "use", "limit", "used", keep=("quota", "used"))
    for quota in view.quotas:
        use, limit = usage.said(quota)
        share = quota.share
        t.add_row(quota.name, use, limit, "-" if share is None else f"{share:.0%}")
    return t
