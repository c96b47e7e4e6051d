"""`corral alerts channels` and `corral alerts rules`: the alert channels and rules a
tenant owns, made, listed, tested and deleted by the operator for the tenant `--tenant`
names (the same checks and limits as the API's)."""

from __future__ import annotations

from typing import Any

import click

from corral import shapes, tenant_alerts
from corral.cli import render
from corral.cli.common import State, config_option, err, json_option, out, print_json, run

tenant_option = click.option("--tenant", required=True, help="Whose channels or rules.")


@click.group()
def channels() -> None:
    """The alert channels a tenant owns: e-mail (through alerts.tenant_smtp), Slack, webhook."""


@channels.command("add")
@click.argument("name")
@tenant_option
@click.option(
    "--kind", type=click.Choice(["email", "slack", "webhook"]), required=True, help="Its kind."
)
@click.option("--to", "to", multiple=True, help="email: an address to send to (repeat for more).")
@click.option("--url", default=None, help="slack: the incoming webhook's URL; webhook: where to.")
@click.option("--secret", default=None, help="webhook: a whsec_... secret to sign with.")
@json_option
@config_option
@click.pass_obj
def channels_add(
    state: State,
    name: str,
    tenant: str,
    kind: str,
    to: tuple[str, ...],
    url: str | None,
    secret: str | None,
    as_json: bool,
) -> None:
    """Make the tenant's channel NAME."""
    body: dict[str, Any] = {"name": name, "kind": kind}
    if kind == "email":
        body["to"] = list(to)
    elif kind == "slack":
        body["webhook_url"] = url
    else:
        body.update({"url": url, **({"secret": secret} if secret else {})})

    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            return shapes.tenant_channel_dict(await c.tenant_channel_add(tenant, body))

    made = run(go())
    if as_json:
        print_json(made)
        return
    out.print(f"channel {name} of tenant {tenant} made ({kind})")


@channels.command("list")
@tenant_option
@json_option
@config_option
@click.pass_obj
def channels_list(state: State, tenant: str, as_json: bool) -> None:
    """The tenant's channels (no secret shown, a web URL by its origin alone)."""

    async def go() -> list[dict[str, Any]]:
        async with state.connect(platforms=False) as c:
            return [shapes.tenant_channel_dict(ch) for ch in await c.tenant_channels(tenant)]

    found = run(go())
    if as_json:
        print_json(found)
        return
    if not found:
        err.print(f"tenant {tenant} has no alert channels")
        return
    out.print(render.channels_table({ch["name"]: ch for ch in found}))


@channels.command("test")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def channels_test(state: State, name: str, tenant: str) -> None:
    """Send a test message through the tenant's channel NAME now."""

    async def go() -> tuple[str, str | None]:
        async with state.connect(platforms=False) as c:
            sent = await c.tenant_channel_test(tenant, name)
            return sent.state, sent.last_error

    delivered, error = run(go())
    if delivered == "delivered":
        out.print(f"test message delivered through {name} of tenant {tenant}")
        return
    err.print(f"test message not delivered through {name} of tenant {tenant}: {error}")
    raise SystemExit(1)


@channels.command("delete")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def channels_delete(state: State, name: str, tenant: str) -> None:
    """Delete the tenant's channel NAME (no rule of it may send to it)."""

    async def go() -> None:
        async with state.connect(platforms=False) as c:
            await c.tenant_channel_delete(tenant, name)

    run(go())
    out.print(f"channel {name} of tenant {tenant} deleted")


@click.group()
def rules() -> None:
    """The alert rules a tenant owns: about its own jobs only, through its own channels."""


@rules.command("add")
@click.argument("name")
@tenant_option
@click.option("--on", "on", multiple=True, required=True, help="A cause (repeat for more).")
@click.option("--channel", "channel", multiple=True, required=True, help="One of its channels.")
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--schedule", default=None, help="Only the jobs of this schedule.")
@click.option("--throttle", default=None, help="One message a window per subject, e.g. 10m.")
@click.option("--after", type=int, default=None, help="consecutive_failures: how many in a row.")
@json_option
@config_option
@click.pass_obj
def rules_add(
    state: State,
    /,
    name: str,
    tenant: str,
    on: tuple[str, ...],
    channel: tuple[str, ...],
    queue: str | None,
    schedule: str | None,
    throttle: str | None,
    after: int | None,
    as_json: bool,
) -> None:
    """Make the tenant's rule NAME: on these causes, through these channels of the tenant."""
    given = {"queue": queue, "schedule": schedule, "throttle": throttle, "after": after}
    match = {k: given[k] for k in ("queue", "schedule") if given[k] is not None}
    body: dict[str, Any] = {"name": name, "on": list(on), "channels": list(channel)}
    body.update({k: given[k] for k in ("throttle", "after") if given[k] is not None})
    if match:
        body["match"] = match

    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            return shapes.tenant_rule_dict(await c.tenant_rule_add(tenant, body), None)

    made = run(go())
    if as_json:
        print_json(made)
        return
    out.print(f"rule {name} of tenant {tenant} made (history and mute name it {made['alerts_as']})")


@rules.command("list")
@tenant_option
@json_option
@config_option
@click.pass_obj
def rules_list(state: State, tenant: str, as_json: bool) -> None:
    """The tenant's rules, and which are muted until when."""

    async def go() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        async with state.connect(platforms=False) as c:
            muted = await c.alerts_muted()
            found = await c.tenant_rules(tenant)
        named = {r.name: tenant_alerts.qualified(r.tenant, r.name) for r in found}
        shown = [shapes.tenant_rule_dict(r, muted.get(named[r.name])) for r in found]
        rows = {
            named[r.name]: shapes.alert_rule_dict(
                tenant_alerts.rule_of(r.tenant, r.rule), muted.get(named[r.name])
            )
            for r in found
        }
        return shown, rows

    found, rows = run(go())
    if as_json:
        print_json(found)
        return
    if not found:
        err.print(f"tenant {tenant} has no alert rules")
        return
    out.print(render.alert_rules_table(rows))


@rules.command("delete")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def rules_delete(state: State, name: str, tenant: str) -> None:
    """Delete the tenant's rule NAME."""

    async def go() -> None:
        async with state.connect(platforms=False) as c:
            await c.tenant_rule_delete(tenant, name)

    run(go())
    out.print(f"rule {name} of tenant {tenant} deleted")
