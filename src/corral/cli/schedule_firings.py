"""`corral schedules firings`: a schedule's firings, the latest first, a page at a time, each
with its lateness, job, the job's state, its HTTP status or exit code, response time and
outcome (the API's GET /schedules/{name}/firings, as a table or as its JSON)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.table import Table

from corral import shapes
from corral.cli import render
from corral.cli.common import State, config_option, err, out, print_json, run

if TYPE_CHECKING:
    from corral import firing_stats
    from corral.client.schedule_reads import FiringPage

MOST = 1000
"""The most firings one page holds (client.schedule_reads.MAX_FIRINGS_PAGE)."""


@click.command("firings")
@click.argument("name")
@click.option("--tenant", "tenant", default="default", show_default=True)
@click.option(
    "--before",
    default=None,
    help="Only firings before this nominal time (ISO 8601 with an offset): a page's next.",
)
@click.option("--limit", type=click.IntRange(1, MOST), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the page as the API gives it.")
@config_option
@click.pass_obj
def firings(
    state: State, name: str, tenant: str, before: str | None, limit: int, as_json: bool
) -> None:
    """A schedule's firings, the latest first: when each was due, how late its job started,
    the job, its state, HTTP status or exit code, response time, and the outcome."""
    from corral.client import schedule_reads

    at = schedule_reads.firing_cursor(before, "--before") if before is not None else None

    async def go() -> FiringPage:
        async with state.connect(platforms=False) as c:
            return await c.firing_history(name, tenant=tenant, before=at, limit=limit)

    page = run(go())
    if as_json:
        print_json(shapes.firing_page_dict(page.rows, page.next))
        return
    out.print(firings_table(page.rows))
    if page.next is not None:
        shown = shapes.firing_page_dict([], page.next)["next"]
        err.print(f"older: corral schedules firings {name} --tenant {tenant} --before {shown}")


def firings_table(rows: list[firing_stats.FiringRow]) -> Table:
    """A row a firing: nominal time (UTC), lateness, job, state, status or exit code,
    response time, outcome."""
    t = render.table(
        "NOMINAL (UTC)", "LATE", "JOB", "STATE", "STATUS", "TOOK", "OUTCOME",
        keep=("NOMINAL (UTC)",),
    )  # fmt: skip
    for r in rows:
        run_ = r.run
        status = "-"
        if run_ is not None and run_.status is not None:
            status = f"HTTP {run_.status}"
        elif run_ is not None and run_.exit_code is not None:
            status = f"exit {run_.exit_code}"
        took = run_.response_time if run_ is not None else None
        t.add_row(
            render.when(r.nominal_at),
            "-" if r.lateness is None else f"{r.lateness:.1f}s",
            str(r.job_id or "-"),
            run_.state.value if run_ is not None else ("gone" if r.job_id else "-"),
            status,
            "-" if took is None else f"{took:.3f}s",
            r.outcome.value,
        )
    if not rows:
        t.add_row("(none)", "", "", "", "", "", "")
    return t
