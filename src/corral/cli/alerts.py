"""`corral alerts`: the rules and channels in the settings, a test message, the history of
what was sent, and muting a rule for a while."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from corral import alert_settings, durations, shapes
from corral.cli import render, tenant_alerts
from corral.cli.common import State, config_option, err, json_option, out, print_json, run

if TYPE_CHECKING:
    from corral import client


@click.group()
def alerts() -> None:
    """Alert rules and channels: list them, test a channel, see what was sent, mute a rule."""


alerts.add_command(tenant_alerts.channels)
alerts.add_command(tenant_alerts.rules)


@alerts.command("list")
@json_option
@config_option
@click.pass_obj
def alerts_list(state: State, as_json: bool) -> None:
    """The rules and channels in the settings and every tenant's (no secret shown; a
    tenant's named as history and mute name it, tenant:TENANT/NAME), and which rules are
    muted until when."""
    from corral import tenant_alerts as owned_by

    settings = state.settings().alerts

    async def go() -> tuple[dict[str, datetime], Any]:
        async with state.connect(platforms=False) as c:
            return await c.alerts_muted(), await c.tenants_alerts()

    muted, owned = run(go())
    rules = {name: shapes.alert_rule_dict(r, muted.get(name)) for name, r in settings.rules.items()}
    channels = {name: render.channel_dict(c) for name, c in settings.channels.items()}
    if as_json:
        print_json({"rules": rules, "channels": channels, **_tenants_json(owned, muted)})
        return
    rules |= {
        owned_by.qualified(r.tenant, r.name): shapes.alert_rule_dict(
            owned_by.rule_of(r.tenant, r.rule), muted.get(owned_by.qualified(r.tenant, r.name))
        )
        for r in owned.rules
    }
    channels |= {
        owned_by.qualified(ch.tenant, ch.name): shapes.tenant_channel_dict(ch)
        for ch in owned.channels
    }
    if not rules and not channels:
        err.print(
            "no alert rules or channels: see [alerts] in the settings, or `corral alerts"
            " rules add --tenant` (docs: Alerts)"
        )
        return
    out.print(render.alert_rules_table(rules))
    out.print(render.channels_table(channels))


def _tenants_json(owned: Any, muted: dict[str, datetime]) -> dict[str, Any]:
    """Every tenant's rules and channels in `alerts list --json` (never a secret)."""
    from corral import tenant_alerts as owned_by

    return {
        "tenant_rules": [
            shapes.tenant_rule_dict(r, muted.get(owned_by.qualified(r.tenant, r.name)))
            for r in owned.rules
        ],
        "tenant_channels": [shapes.tenant_channel_dict(ch) for ch in owned.channels],
    }


@alerts.command("test")
@click.argument("channel")
@config_option
@click.pass_obj
def alerts_test(state: State, channel: str) -> None:
    """Send a test message through CHANNEL now, and say whether it went (a tenant's
    channel as tenant:TENANT/NAME)."""

    settings = state.settings()
    tenant, name = _tenants_name(channel)
    if tenant is None and channel not in settings.alerts.channels:
        known = ", ".join(sorted(settings.alerts.channels)) or "none"
        raise click.BadParameter(
            f"no channel {channel!r}; defined: {known}, or a tenant's as tenant:TENANT/NAME",
            param_hint="CHANNEL",
        )

    async def go() -> tuple[str, str | None]:
        async with state.connect(platforms=False) as c:
            if tenant is None:
                sent = await c.alert_test(channel)
            else:
                sent = await c.tenant_channel_test(tenant, name)
            return sent.state, sent.last_error

    delivered, error = run(go())
    if delivered == "delivered":
        out.print(f"test message delivered through {channel}")
        return
    err.print(f"test message not delivered through {channel}: {error}")
    raise SystemExit(1)


def _tenants_name(named: str) -> tuple[str | None, str]:
    """(tenant, name) of a tenant's rule or channel named tenant:TENANT/NAME; else
    (None, the name as given)."""
    prefix = alert_settings.TENANT_PREFIX
    tenant, slash, name = named.removeprefix(prefix).partition("/")
    if not named.startswith(prefix) or not slash:
        return None, named
    return tenant, name


@alerts.command("history")
@click.option("--rule", default=None, help="Only this rule's messages.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@config_option
@click.pass_obj
def alerts_history(state: State, rule: str | None, limit: int, as_json: bool) -> None:
    """The newest messages: what, to which channel, delivered or not, and every try."""

    async def go() -> client.alerts.History:
        async with state.connect(platforms=False) as c:
            return await c.alert_history(limit=limit, rule=rule)

    history = run(go())
    found, tries = history.alerts, history.tries
    if as_json:
        print_json([shapes.alert_dict(a, tries.get(a.id, [])) for a in found])
        return
    if not found:
        err.print("no alerts sent yet")
        return
    out.print(render.alerts_table(found))


@alerts.command("mute")
@click.argument("rule")
@click.option("--for", "for_", required=True, help="How long, e.g. 2h or 30m.")
@config_option
@click.pass_obj
def alerts_mute(state: State, rule: str, for_: str) -> None:
    """Send nothing for RULE for a while (kept in the store: every alerter obeys)."""

    settings = state.settings()
    if rule not in settings.alerts.rules and not _a_tenants(state, rule):
        known = ", ".join(sorted(settings.alerts.rules)) or "none"
        raise click.BadParameter(
            f"no rule {rule!r}; defined: {known}, or a tenant's as tenant:TENANT/NAME",
            param_hint="RULE",
        )
    try:
        span: timedelta = durations.parse_duration(for_)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    if span <= timedelta(0):
        raise click.BadParameter("must be longer than zero", param_hint="--for")

    async def go() -> datetime:
        async with state.connect(platforms=False) as c:
            return await c.alert_mute(rule, span)

    until = run(go())
    out.print(
        f"rule {rule} muted until {render.when(until)} (corral alerts unmute {rule} to end it)"
    )


def _a_tenants(state: State, rule: str) -> bool:
    """Whether `rule` names a rule a tenant owns (tenant:TENANT/NAME)."""
    tenant, name = _tenants_name(rule)
    if tenant is None:
        return False

    async def go() -> bool:
        async with state.connect(platforms=False) as c:
            return name in {r.name for r in await c.tenant_rules(tenant)}

    return run(go())


@alerts.command("unmute")
@click.argument("rule")
@config_option
@click.pass_obj
def alerts_unmute(state: State, rule: str) -> None:
    """Let RULE send again now."""

    async def go() -> bool:
        async with state.connect(platforms=False) as c:
            return await c.alert_unmute(rule)

    if run(go()):
        out.print(f"rule {rule} sends again")
    else:
        err.print(f"rule {rule} was not muted")
