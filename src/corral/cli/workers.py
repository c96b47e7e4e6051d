"""`corral worker` (run an App's Python tasks), `corral workers` (who is registered),
`corral parked` (jobs no live worker reads) and `corral preflight` (before a rollout)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from corral import shapes
from corral.cli.common import (
    State,
    config_option,
    err,
    json_option,
    log_format_option,
    out,
    print_json,
    run,
)

if TYPE_CHECKING:
    from corral import config
    from corral.worker.app import App


@click.command("worker")
@click.argument("target", metavar="MODULE:APP")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1000),
    default=16,
    show_default=True,
    help="Tasks run at once (async ones on the event loop, plain ones in threads).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 10_000),
    default=None,
    help="Jobs claimed ahead of free slots while tasks are short (under 0.1s on average),"
    " so a slot that frees starts the next at once (default: as many as --concurrency;"
    " none are held while tasks run long).",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="Take jobs of this queue only (repeat for more; default: every queue).",
)
@log_format_option
@config_option
@click.pass_obj
def worker_cmd(
    state: State, target: str, concurrency: int, prefetch: int | None, queues: tuple[str, ...]
) -> None:
    """Run the Python tasks of MODULE:APP (a corral.App); SIGTERM drains and hands back.

    MODULE:APP is e.g. `billing.tasks:app`. The worker registers the tasks and payload
    versions it reads (parked jobs it reads are queued again at once), claims their jobs
    and runs them. On SIGTERM it claims nothing more, lets running tasks finish for
    timeouts.drain_timeout, then hands the rest back (not charged) to resume elsewhere from
    their checkpoints."""
    from corral.cli.loops import setup_logging, until_signalled
    from corral.worker.app import load_app

    app = load_app(target)
    app.check()
    settings = state.settings()
    setup_logging(settings)

    async def body(stop: asyncio.Event) -> None:
        await _work(app, settings, stop, concurrency=concurrency, queues=queues, prefetch=prefetch)

    run(until_signalled(body))
    sys.stdout.flush()
    sys.stderr.flush()
    # A plain task's thread handed back at shutdown may still run: it must not keep the
    # process (its writes are refused by its fence once a newer attempt starts).
    os._exit(0)


@click.command("workers")
@click.option("--all", "every", is_flag=True, help="Stopped and silent workers too.")
@json_option
@config_option
@click.pass_obj
def workers_cmd(state: State, every: bool, as_json: bool) -> None:
    """The registered workers, with the tasks and payload versions each reads.

    The live ones; with --all, stopped and silent ones too."""

    async def go() -> list[Any]:
        async with state.connect(platforms=False) as c:
            return await c.workers(every=every)

    found = run(go())
    if as_json:
        print_json([shapes.worker_dict(w) for w in found])
        return
    if not found:
        err.print("no live workers" if not every else "no workers have registered")
        return
    from rich.table import Table

    table = Table("id", "app", "version", "state", "last seen", "reads", box=None)
    for w in found:
        table.add_row(
            w.id,
            w.app,
            w.app_version,
            w.state.value,
            w.last_seen_at.isoformat(timespec="seconds"),
            ", ".join(f"{r.task} v{r.version}" for r in w.reads),
        )
    out.print(table)


@click.group("parked")
def parked() -> None:
    """Jobs no live worker can read yet: list them, or release them by hand."""


@parked.command("list")
@click.option("--task", default=None, help="Of this task only.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@json_option
@config_option
@click.pass_obj
def parked_list(state: State, task: str | None, limit: int, as_json: bool) -> None:
    """Parked jobs, oldest first: task, payload version, and the app version that reads it."""

    async def go() -> list[Any]:
        async with state.connect(platforms=False) as c:
            return await c.parked(task=task, limit=limit)

    found = run(go())
    if as_json:
        print_json([shapes.parked_dict(p) for p in found])
        return
    if not found:
        err.print("no parked jobs")
        return
    from rich.table import Table

    table = Table("job", "task", "version", "needs app version", "parked at", box=None)
    for p in found:
        table.add_row(
            str(p.job.id),
            p.task,
            str(p.version),
            p.needs_app_version or "(no worker ever read it)",
            p.parked_at.isoformat(timespec="seconds") if p.parked_at else "",
        )
    out.print(table)


@parked.command("release")
@click.argument("job_ids", nargs=-1, type=int)
@click.option("--task", default=None, help="Every parked job of this task.")
@click.option("--all", "every", is_flag=True, help="Every parked job (with --task: of it).")
@json_option
@config_option
@click.pass_obj
def parked_release(
    state: State, job_ids: tuple[int, ...], task: str | None, every: bool, as_json: bool
) -> None:
    """Queue parked jobs again by hand (by ID, or --task T, or --all): the fallback when
    the fix ships under another shape. A job so released is not parked again by itself."""
    if not job_ids and task is None and not every:
        raise click.UsageError("name job IDs, or --task T, or --all")
    if job_ids and (task is not None or every):
        raise click.UsageError("name job IDs, or --task/--all; not both")

    async def go() -> list[int]:
        async with state.connect(platforms=False) as c:
            return await c.parked_release(job_ids=job_ids, task=task)

    released = run(go())
    if as_json:
        print_json({"released": released})
        return
    if job_ids and (missing := sorted(set(job_ids) - set(released))):
        err.print(f"not parked (left alone): {', '.join(map(str, missing))}")
    err.print(f"released {len(released)} parked jobs: queued again")


async def _work(
    app: App,
    settings: config.Settings,
    stop: asyncio.Event,
    *,
    concurrency: int,
    queues: tuple[str, ...],
    prefetch: int | None,
) -> None:
    """Run `app`'s tasks until `stop`, once the database can be reached."""
    from corral import clock, runtime
    from corral.worker.runner import Worker

    clk = clock.SystemClock()
    db = await runtime.reach(settings, clk, stop)
    if db is None:
        return
    try:
        worker = Worker(
            app,
            db=db,
            settings=settings,
            clk=clk,
            concurrency=concurrency,
            queues=queues,
            prefetch=prefetch,
        )
        err.print(
            f"worker {worker.id}: app {app.name} {app.version} on {db.database.url};"
            f" {len(app.tasks)} tasks, concurrency {concurrency}. SIGTERM drains and stops."
        )
        await worker.run(stop)
    finally:
        await db.close()


@click.command("preflight")
@click.argument("target", metavar="MODULE:APP")
@json_option
@config_option
@click.pass_obj
def preflight(state: State, target: str, as_json: bool) -> None:
    """Exit 1 if a stored payload has a version MODULE:APP can neither read nor upcast.

    Looks at every scheduled, queued or parked job, and every schedule, of the app's tasks.
    Run it in CI against the live store before rolling the app out."""
    from corral.worker.app import load_app

    app = load_app(target)

    async def go() -> dict[tuple[str, int], dict[str, int]]:
        async with state.connect(platforms=False) as c:
            return await c.payload_versions(tasks=list(app.tasks))

    found = run(go())
    rows: list[dict[str, Any]] = []
    for (task, version), counts in sorted(found.items()):
        reads = app.get(task).reads()
        rows.append(
            {
                "task": task,
                "version": version,
                "counts": counts,
                "readable": version in reads,
                "reads": reads,
            }
        )
    bad = [r for r in rows if not r["readable"]]
    if as_json:
        print_json({"app": app.name, "app_version": app.version, "ok": not bad, "payloads": rows})
    else:
        _print_preflight(app, rows, bad)
    if bad:
        raise SystemExit(1)


def _print_preflight(app: App, rows: list[dict[str, Any]], bad: list[dict[str, Any]]) -> None:
    """What each stored payload version counts, and whether `app` reads it."""
    for r in rows:
        seen: dict[str, int] = r["counts"]
        what = ", ".join(f"{n} {kind}" for kind, n in sorted(seen.items()))
        verdict = "reads it" if r["readable"] else "CANNOT read it"
        err.print(f"{r['task']} v{r['version']}: {what}: {app.name} {app.version} {verdict}")
    if bad:
        err.print(
            f"{len(bad)} payload versions this app cannot read: add an upcaster from each"
            " (@task.upcaster(from_version=N)), or roll out a version that reads them"
        )
    else:
        err.print(f"{app.name} {app.version} reads every payload in the store")
