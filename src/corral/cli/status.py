"""`corral status`: which of corral's loops run (every long-running process records itself
in the store), and the work that waits for a loop nobody runs."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import click

from corral.cli.common import State, config_option, err, json_option, out, print_json, run

if TYPE_CHECKING:
    from corral import config, loops


@click.command("status")
@click.option("--all", "every", is_flag=True, help="Stopped and gone loops too.")
@json_option
@config_option
@click.pass_obj
def status(state: State, every: bool, as_json: bool) -> None:
    """corral's processes (serve, dispatcher, ..., worker, api) and whether each is alive.

    Each beats in the store every timeouts.heartbeat_interval; one silent for three beats
    is stale, and one whose process is gone from this host is gone at once. Below them,
    the work that waits for a loop nobody runs (schedules and no scheduler, say)."""
    from corral import shapes

    async def go() -> loops.Status:
        async with state.connect(platforms=False) as c:
            return await c.loops.status()

    found = run(go())
    if as_json:
        print_json(shapes.status_dict(found))
        return
    print_status(found, every=every)


def print_status(found: loops.Status, *, every: bool = False) -> None:
    """The loops as a table (the live and stale ones; `every`: all), then the warnings."""
    from corral import loops
    from corral.cli.render import table

    shown = [
        (loop, state)
        for loop, state in found.loops
        if every or state in (loops.Liveness.LIVE, loops.Liveness.STALE)
    ]
    if shown:
        t = table("kind", "state", "host", "pid", "runs", "version", "last beat", keep=("pid",))
        for loop, liveness in shown:
            t.add_row(
                loop.kind,
                liveness.value,
                loop.host,
                str(loop.pid),
                ", ".join(loop.runs),
                loop.version,
                _ago(loop.beat_at, found.now),
            )
        out.print(t)
    else:
        err.print("no corral loop is running" + ("" if every else " (--all: the stopped ones)"))
    for message in found.warnings.values():
        err.print(f"warning: {message}", markup=False)


def _ago(at: datetime, now: datetime) -> str:
    """How long ago, to the second."""
    return f"{max(now - at, timedelta(0)).total_seconds():.0f}s ago"


async def looked(settings: config.Settings) -> loops.Status | str:
    """The loops' status from the store the settings name, or why it could not be read
    (no database yet, or one that cannot be reached): `corral check` reports either."""
    from corral import errors, runtime

    try:
        async with runtime.connect(settings, platforms=False) as c:
            return await c.loops.status()
    except errors.CorralError as exc:
        return str(exc)
