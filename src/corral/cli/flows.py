"""`corral flows`: the flows a tenant owns (flow control per destination: a rate and a
parallelism its jobs are held to), made, listed, shown, changed and deleted by the operator
for the tenant `--tenant` names (the same checks and limits as the API's)."""

from __future__ import annotations

from typing import Any

import click

from corral import shapes
from corral.cli import render
from corral.cli.common import State, config_option, err, json_option, out, print_json, run

tenant_option = click.option(
    "--tenant", default="default", show_default=True, help="Whose flow (or flows)."
)
rate_option = click.option(
    "--rate",
    default=None,
    metavar="N/PERIOD",
    help="At most N attempts started within any window of PERIOD, e.g. 10/1s or 600/1m"
    " (update: `none` for no rate).",
)
parallelism_option = click.option(
    "--parallelism",
    default=None,
    metavar="N",
    help="At most N of its jobs running at once (update: `none` for no limit).",
)


@click.group()
def flows() -> None:
    """Flows: a rate and a parallelism the jobs that name one are held to, per tenant.

    A job or schedule names one with `--flow NAME`; every dispatcher holds its jobs to it."""


def _body(rate: str | None, parallelism: str | None) -> dict[str, Any]:
    given = {"rate": rate, "parallelism": parallelism}
    return {k: v for k, v in given.items() if v is not None}


def _said(flow: dict[str, Any]) -> str:
    limits = [
        f"rate {flow['rate']}" if flow["rate"] else "no rate",
        f"parallelism {flow['parallelism']}" if flow["parallelism"] else "no parallelism limit",
    ]
    return ", ".join(limits)


def _write(
    state: State, name: str, tenant: str, body: dict[str, Any], as_json: bool, verb: str
) -> None:
    """Make (`verb` made) or change the tenant's flow, and say what it is now."""

    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            if verb == "made":
                return shapes.flow_dict(await c.flow_add(tenant, body))
            return shapes.flow_dict(await c.flow_update(tenant, name, body))

    written = run(go())
    if as_json:
        print_json(written)
        return
    out.print(f"flow {name} of tenant {tenant} {verb}: {_said(written)}")


@flows.command("add")
@click.argument("name")
@tenant_option
@rate_option
@parallelism_option
@json_option
@config_option
@click.pass_obj
def flows_add(
    state: State, name: str, tenant: str, rate: str | None, parallelism: str | None, as_json: bool
) -> None:
    """Make the tenant's flow NAME."""
    _write(state, name, tenant, {"name": name, **_body(rate, parallelism)}, as_json, "made")


@flows.command("update")
@click.argument("name")
@tenant_option
@rate_option
@parallelism_option
@json_option
@config_option
@click.pass_obj
def flows_update(
    state: State, name: str, tenant: str, rate: str | None, parallelism: str | None, as_json: bool
) -> None:
    """Change the tenant's flow NAME: the limits given replace its own."""
    _write(state, name, tenant, _body(rate, parallelism), as_json, "changed")


@flows.command("list")
@tenant_option
@json_option
@config_option
@click.pass_obj
def flows_list(state: State, tenant: str, as_json: bool) -> None:
    """The tenant's flows, by name."""

    async def go() -> list[dict[str, Any]]:
        async with state.connect(platforms=False) as c:
            return [shapes.flow_dict(f) for f in await c.flows(tenant)]

    found = run(go())
    if as_json:
        print_json(found)
        return
    if not found:
        err.print(f"tenant {tenant} has no flows; make one with `corral flows add NAME`")
        return
    t = render.table("flow", "rate", "parallelism", "held until", keep=("flow",))
    for f in found:
        t.add_row(f["name"], f["rate"] or "-", str(f["parallelism"] or "-"), f["held_until"] or "-")
    out.print(t)


@flows.command("show")
@click.argument("name")
@tenant_option
@json_option
@config_option
@click.pass_obj
def flows_show(state: State, name: str, tenant: str, as_json: bool) -> None:
    """The tenant's flow NAME, and what it uses now."""

    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            return shapes.flow_dict(*await c.flow(tenant, name))

    found = run(go())
    if as_json:
        print_json(found)
        return
    t = render.table("field", "value", keep=("field",))
    for key in ("name", "tenant", "rate", "parallelism", "started_in_window", "running"):
        t.add_row(key.replace("_", " "), str(found[key] if found[key] is not None else "-"))
    if found["held_until"]:
        t.add_row("held until", f"{found['held_until']} ({found['held_reason']})")
    out.print(t)


@flows.command("delete")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def flows_delete(state: State, name: str, tenant: str) -> None:
    """Delete the tenant's flow NAME (refused while a job of it has not ended, or a
    schedule names it)."""

    async def go() -> None:
        async with state.connect(platforms=False) as c:
            await c.flow_delete(tenant, name)

    run(go())
    out.print(f"flow {name} of tenant {tenant} deleted")
