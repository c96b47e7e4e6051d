"""`corral monitors`: the monitors of a tenant (`--tenant`, default: default), made, listed,
shown with their pings and history, paused, resumed, given a new ping URL and deleted by the
operator, with the same checks and limits as the API's. `add` prints the ping URL alone on
its last line, for a script to take."""

from __future__ import annotations

from typing import Any

import click

from corral.cli.common import State, config_option, err, json_option, out, print_json, run

tenant_option = click.option(
    "--tenant", default="default", show_default=True, help="Whose monitor."
)


@click.group()
def monitors() -> None:
    """Monitors: a dead man's switch for crons that run elsewhere, pinged at a URL."""


def _shown(c: Any, monitor: Any) -> dict[str, Any]:
    from corral import monitor_shapes

    return monitor_shapes.monitor_dict(monitor, c.ping_url(monitor))


@monitors.command("add")
@click.argument("name")
@tenant_option
@click.option("--period", help="A ping is expected this often, e.g. 1h (or give --cron).")
@click.option("--cron", help="A ping is expected at each time of this cron expression.")
@click.option("--tz", help="The --cron's IANA time zone (default UTC).")
@click.option("--grace", required=True, help="How long past its expected time before it is down.")
@click.option(
    "--channel",
    "channels",
    multiple=True,
    help="A tenant's alert channel told when it goes down, fails and comes back up (one"
    " alert rule, monitor-NAME; repeat for more).",
)
@config_option
@click.pass_obj
def add(
    state: State,
    name: str,
    tenant: str,
    period: str | None,
    cron: str | None,
    tz: str | None,
    grace: str,
    channels: tuple[str, ...],
) -> None:
    """Make the monitor NAME; its ping URL is printed alone on the last line."""
    body: dict[str, Any] = {"name": name, "period": period, "cron": cron, "tz": tz}
    body.update(grace=grace, channels=list(channels))

    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            return _shown(c, await c.monitor_add(tenant, body))

    made = run(go())
    every = f"every {made['period']}" if made["period"] else f"at {made['cron']} ({made['tz']})"
    out.print(
        f"monitor {name} of tenant {tenant} made: a ping expected {every}, down"
        f" {made['grace']} after",
        markup=False,
    )
    if made["alert_rule"]:
        out.print(
            f"alert rule {made['alert_rule']} tells {', '.join(channels)} when it goes down,"
            " fails or comes back up",
            markup=False,
        )
    out.print(made["ping_url"], markup=False, soft_wrap=True)


@monitors.command("list")
@tenant_option
@json_option
@config_option
@click.pass_obj
def list_cmd(state: State, tenant: str, as_json: bool) -> None:
    """The tenant's monitors and where each stands."""
    from corral.cli import render

    async def go() -> list[dict[str, Any]]:
        async with state.connect(platforms=False) as c:
            return [_shown(c, m) for m in await c.monitors(tenant)]

    found = run(go())
    if as_json:
        print_json(found)
        return
    if not found:
        err.print(f"tenant {tenant} has no monitors")
        return
    t = render.table("name", "state", "expects", "grace", "last ping", "down at")
    for m in found:
        expects = f"every {m['period']}" if m["period"] else f"{m['cron']} ({m['tz']})"
        t.add_row(
            m["name"],
            m["state"],
            expects,
            m["grace"],
            _at(m["last_ping_at"]),
            _at(m["down_at"]),
        )
    out.print(t)


@monitors.command("show")
@click.argument("name")
@tenant_option
@click.option("--limit", default=20, show_default=True, help="Pings and changes shown.")
@json_option
@config_option
@click.pass_obj
def show(state: State, name: str, tenant: str, limit: int, as_json: bool) -> None:
    """The monitor NAME, its newest pings and its state history."""
    from corral import monitor_shapes

    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            found = await c.monitor(tenant, name)
            pings = await c.monitor_pings(found, limit)
            changes = await c.monitor_changes(found, limit)
            return {
                **_shown(c, found),
                "pings": [monitor_shapes.ping_dict(p) for p in pings],
                "history": [monitor_shapes.change_dict(h) for h in changes],
            }

    found = run(go())
    if as_json:
        print_json(found)
        return
    _print_shown(found)


def _at(iso: str | None) -> str:
    """A time of the JSON shape (ISO 8601, UTC) as a table shows it: to the second."""
    return iso[:19].replace("T", " ") if iso else "-"


def _print_shown(found: dict[str, Any]) -> None:
    from corral.cli import render

    for key in ("name", "tenant", "state", "period", "cron", "tz", "grace"):
        if found[key] is not None:
            out.print(f"{key}: {found[key]}", markup=False)
    for key in ("state_since", "last_ping_at", "expected_at", "down_at"):
        out.print(f"{key}: {_at(found[key])} UTC" if found[key] else f"{key}: -", markup=False)
    for key in ("alert_rule", "ping_url"):
        out.print(f"{key}: {found[key] or '-'}", markup=False)
    pings = render.table("at", "kind", "exit code", "duration", "from", "user agent", "body")
    for p in found["pings"]:
        took = "-" if p["duration_seconds"] is None else f"{p['duration_seconds']:g}s"
        code = "-" if p["exit_code"] is None else str(p["exit_code"])
        body = p["body"] if len(p["body"]) <= 60 else p["body"][:59] + "…"
        pings.add_row(_at(p["at"]), p["kind"], code, took, p["source"], p["user_agent"], body)
    out.print(pings)
    history = render.table("at", "from", "to", "why")
    for h in found["history"]:
        history.add_row(_at(h["at"]), h["from"], h["to"], h["reason"])
    out.print(history)


def _change(name: str, tenant: str, state: State, action: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with state.connect(platforms=False) as c:
            if action == "pause":
                await c.monitor_pause(tenant, name)
            elif action == "resume":
                await c.monitor_resume(tenant, name)
            elif action == "rotate":
                await c.monitor_rotate(tenant, name)
            else:
                await c.monitor_delete(tenant, name)
                return {}
            return _shown(c, await c.monitor(tenant, name))

    return run(go())


@monitors.command("pause")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def pause(state: State, name: str, tenant: str) -> None:
    """Pause the monitor NAME: not judged, whatever its pings."""
    _change(name, tenant, state, "pause")
    out.print(f"monitor {name} of tenant {tenant} paused", markup=False)


@monitors.command("resume")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def resume(state: State, name: str, tenant: str) -> None:
    """Resume the monitor NAME: its next ping is expected counted from now."""
    _change(name, tenant, state, "resume")
    out.print(f"monitor {name} of tenant {tenant} resumed", markup=False)


@monitors.command("rotate")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def rotate(state: State, name: str, tenant: str) -> None:
    """Give the monitor NAME a new ping URL (printed alone on the last line); the old one
    is not found from now."""
    shown = _change(name, tenant, state, "rotate")
    out.print(f"monitor {name} of tenant {tenant} has a new ping URL", markup=False)
    out.print(shown["ping_url"], markup=False, soft_wrap=True)


@monitors.command("delete")
@click.argument("name")
@tenant_option
@config_option
@click.pass_obj
def delete(state: State, name: str, tenant: str) -> None:
    """Delete the monitor NAME, its pings, its history and its --channel alert rule."""
    _change(name, tenant, state, "delete")
    out.print(f"monitor {name} of tenant {tenant} deleted", markup=False)
