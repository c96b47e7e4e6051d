"""`corral alerts`: the rules and channels in the settings, a test message, the history of
what was sent, and muting a rule for a while."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from corral.cli import render
from corral.cli.common import State, config_option, err, json_option, out, print_json, run

if TYPE_CHECKING:
    from corral.store.alerts import Alert, Try


@click.group()
def alerts() -> None:
    """Alert rules and channels: list them, test a channel, see what was sent, mute a rule."""


@alerts.command("list")
@json_option
@config_option
@click.pass_obj
def alerts_list(state: State, as_json: bool) -> None:
    """The rules and channels in the settings (no secret shown), and which rules are
    muted until when."""
    settings = state.settings().alerts
    muted: dict[str, datetime] = {}
    if settings.rules:

        async def go() -> dict[str, datetime]:
            async with state.connect(platforms=False) as c:
                return await c.store.alerts.muted(now=c.clock.now())

        muted = run(go())
    rules = {
        name: {
            "on": list(r.on),
            "match": r.match.model_dump(exclude_defaults=True),
            "channels": list(r.channels),
            "throttle": r.throttle.total_seconds(),
            "muted_until": muted[name].isoformat() if name in muted else None,
        }
        for name, r in settings.rules.items()
    }
    channels = {name: render.channel_dict(c) for name, c in settings.channels.items()}
    if as_json:
        print_json({"rules": rules, "channels": channels})
        return
    if not rules and not channels:
        err.print("no alert rules or channels: see [alerts] in the settings (docs: Alerts)")
        return
    out.print(render.alert_rules_table(rules))
    out.print(render.channels_table(channels))


@alerts.command("test")
@click.argument("channel")
@config_option
@click.pass_obj
def alerts_test(state: State, channel: str) -> None:
    """Send a test message through CHANNEL now, and say whether it went."""
    from corral import alerts as alerting

    settings = state.settings()
    if channel not in settings.alerts.channels:
        known = ", ".join(sorted(settings.alerts.channels)) or "none"
        raise click.BadParameter(f"no channel {channel!r}; defined: {known}", param_hint="CHANNEL")

    async def go() -> Alert:
        async with state.connect(platforms=False) as c:
            now = c.clock.now()
            message: dict[str, Any] = {
                "dedupe_key": f"test|{channel}|{now.isoformat()}",
                "rule": "-",
                "channel": channel,
                "kind": "test",
                "cause": "test",
                "subject": f"channel:{channel}",
                "job_id": None,
                "details": {},
                "due_at": now + timedelta(hours=1),  # not a running alerter's to send
            }
            made = await c.store.alerts.add(message=message, now=now)
            sender = alerting.Alerter(store=c.store, clock=c.clock, settings=settings)
            try:
                await sender.deliver_now(made)
            finally:
                await sender.close()
            [found] = [a for a in await c.store.alerts.list(limit=50) if a.id == made]
            return found

    sent = run(go())
    if sent.state == "delivered":
        out.print(f"test message delivered through {channel}")
        return
    err.print(f"test message not delivered through {channel}: {sent.last_error}")
    raise SystemExit(1)


@alerts.command("history")
@click.option("--rule", default=None, help="Only this rule's messages.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@config_option
@click.pass_obj
def alerts_history(state: State, rule: str | None, limit: int, as_json: bool) -> None:
    """The newest messages: what, to which channel, delivered or not, and every try."""

    async def go() -> tuple[list[Alert], dict[int, list[Try]]]:
        async with state.connect(platforms=False) as c:
            found = await c.store.alerts.list(limit=limit, rule=rule)
            return found, await c.store.alerts.tries(alert_ids=[a.id for a in found])

    found, tries = run(go())
    if as_json:
        print_json([render.alert_dict(a, tries.get(a.id, [])) for a in found])
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
    from corral import config

    settings = state.settings()
    if rule not in settings.alerts.rules:
        known = ", ".join(sorted(settings.alerts.rules)) or "none"
        raise click.BadParameter(f"no rule {rule!r}; defined: {known}", param_hint="RULE")
    try:
        span: timedelta = config.parse_duration(for_)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    if span <= timedelta(0):
        raise click.BadParameter("must be longer than zero", param_hint="--for")

    async def go() -> Any:
        async with state.connect(platforms=False) as c:
            until = c.clock.now() + span
            await c.store.alerts.mute(rule=rule, until=until, now=c.clock.now())
            return until

    until = run(go())
    out.print(
        f"rule {rule} muted until {render.when(until)} (corral alerts unmute {rule} to end it)"
    )


@alerts.command("unmute")
@click.argument("rule")
@config_option
@click.pass_obj
def alerts_unmute(state: State, rule: str) -> None:
    """Let RULE send again now."""

    async def go() -> bool:
        async with state.connect(platforms=False) as c:
            return await c.store.alerts.unmute(rule=rule)

    if run(go()):
        out.print(f"rule {rule} sends again")
    else:
        err.print(f"rule {rule} was not muted")
