"""`corral jobs` and `corral dead`: look at jobs, explain them, cancel them, decide on
quarantined ones, and act on every job a filter matches (`jobs bulk`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from corral import errors, shapes
from corral.cli import render
from corral.cli.common import JOB_ID, State, config_option, err, json_option, out, print_json, run

if TYPE_CHECKING:
    from corral import client, model


@click.group()
def jobs() -> None:
    """Look at and manage jobs."""


@jobs.command("list")
@click.option("--state", "states", multiple=True, help="Only jobs in this state (repeatable).")
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--tenant", default=None, help="Only jobs of this tenant.")
@click.option("--pool", default=None, help="Only jobs of this pool.")
@click.option("--schedule", default=None, help="Only the jobs this schedule's firings made.")
@click.option(
    "--url",
    default=None,
    help="Only HTTP jobs whose URL contains this text, in any case (as shown: a secret in a"
    " URL is never matched).",
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@config_option
@click.pass_obj
def jobs_list(
    state: State,
    states: tuple[str, ...],
    queue: str | None,
    tenant: str | None,
    pool: str | None,
    schedule: str | None,
    url: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List the newest jobs: what each does, its schedule, its last attempt's HTTP status or
    exit code and response time, and when it runs next."""

    async def go() -> client.jobs.JobPage:
        from corral import model

        async with state.connect(platforms=False) as c:
            given = model.JobFilter(
                states=states, queue=queue, tenant=tenant, pool=pool, schedule=schedule, url=url
            )
            return await c.job_page(given, limit=limit)

    page = run(go())
    if as_json:
        print_json(shapes.listed_dicts(page))
        return
    out.print(render.jobs_table(page))


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@json_option
@config_option
@click.pass_obj
def jobs_show(state: State, job_id: int, as_json: bool) -> None:
    """Show a job, its attempts and its events (the run log)."""

    async def go() -> client.jobs.JobView:
        async with state.connect(platforms=False) as c:
            return await c.job(job_id)

    view = run(go())
    if as_json:
        print_json(shapes.view_dict(view))
        return
    render.print_view(view)


@jobs.command("logs")
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--attempt",
    "attempt_no",
    type=click.IntRange(1),
    default=None,
    help="Only attempt N (1: the first).",
)
@click.option(
    "--follow", "-f", is_flag=True, help="Go on printing as the job runs, until it has finished."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per piece of output.")
@config_option
@click.pass_obj
def jobs_logs(
    state: State, job_id: int, attempt_no: int | None, follow: bool, as_json: bool
) -> None:
    """Print what a job's attempts left: a process's stdout and stderr, an HTTP attempt's
    request and response, a pod's log. With --follow, a running process's output or a
    running pod's log as it comes."""
    printer = _LogPrinter(as_json, lines=follow)

    async def go() -> None:
        async with _logs_client(state, follow=follow) as c:
            view = await c.job(job_id)
            if attempt_no is not None and attempt_no > view.job.attempt_count:
                raise errors.NotFound(
                    f"job {job_id} has no attempt {attempt_no}: it has had {view.job.attempt_count}"
                )
            async for part in c.follow(job_id, attempt_no=attempt_no, once=not follow):
                printer.print(part)

    run(go())
    printer.end()


@contextlib.asynccontextmanager
async def _logs_client(state: State, *, follow: bool) -> AsyncIterator[client.Client]:
    """A client for `jobs logs`. Following, with the executors started, so that a running
    pod's log is read from its cluster; when one cannot start here (no kubeconfig on this
    machine, say), without them: a pod's output then comes from its run log at its end."""
    if follow:
        entered = False
        try:
            async with state.connect() as c:
                entered = True
                yield c
                return
        except (errors.ConfigError, errors.ExecutorError) as exc:
            if entered:
                raise
            err.print(f"note: {exc}; a running pod's log shows once its attempt ends", markup=False)
    async with state.connect(platforms=False) as c:
        yield c


class _LogPrinter:
    """Pieces of output as they come: a heading when the attempt changes, a line naming the
    stream when the stream does, and the text as it is."""

    def __init__(self, as_json: bool, *, lines: bool) -> None:
        self.as_json = as_json
        self.lines = lines  # JSON: one line per piece as it comes (else one list at the end)
        self.parts: list[dict[str, Any]] = []
        self.at: tuple[int, str] | None = None
        self.line_open = False
        self.printed = False

    def print(self, part: client.follow.LogPart) -> None:
        a = part.attempt
        if self.as_json:
            said = {"attempt": a.attempt_no, "fence": a.id, "state": a.state}
            self.parts.append({**said, "stream": part.stream or None, "text": part.text})
            if part.log is not None and part.log.trimmed_at is not None:
                self.parts[-1]["trimmed_at"] = part.log.trimmed_at.isoformat()
            if self.lines:
                click.echo(json.dumps(self.parts.pop()))
            return
        if self.at is None or self.at[0] != a.id:
            self.end_line()
            gap = "\n" if self.printed else ""
            head = render.outcome(a, part.log) if part.log else str(a.state)
            click.echo(f"{gap}==> attempt {a.attempt_no} (fence {a.id}): {head} <==")
        if not part.stream and part.log is not None and part.log.trimmed_at is not None:
            click.echo(f"(output {shapes.TRIMMED}, {render.when(part.log.trimmed_at)})")
        elif not part.stream:
            click.echo("(no output)")
        elif self.at != (a.id, part.stream):
            self.end_line()
            click.echo(f"--- {part.stream} ---")
        self.at = (a.id, part.stream)
        click.echo(part.text, nl=False)
        self.line_open = not part.text.endswith("\n")
        self.printed = True

    def end_line(self) -> None:
        if self.line_open:
            click.echo()
            self.line_open = False

    def end(self) -> None:
        self.end_line()
        if self.as_json and not self.lines:
            print_json(self.parts)
        elif not self.printed and not self.as_json:
            err.print("no output kept for this job yet")


@jobs.command("explain")
@click.argument("job_id", type=JOB_ID)
@json_option
@config_option
@click.pass_obj
def jobs_explain(state: State, job_id: int, as_json: bool) -> None:
    """Say in one line why a job is not running now (backoff, not due, ...)."""

    async def go() -> tuple[model.Job, str]:
        async with state.connect(platforms=False) as c:
            return (await c.job(job_id)).job, await c.explain(job_id)

    job, said = run(go())
    if as_json:
        print_json({"id": job.id, "state": job.state, **shapes.explanation(said)})
        return
    out.print(f"job {job_id}: {said}", markup=False)


@jobs.command("cancel")
@click.argument("job_id", type=JOB_ID)
@config_option
@click.pass_obj
def jobs_cancel(state: State, job_id: int) -> None:
    """Cancel a job; a running attempt is stopped (SIGTERM, then SIGKILL after the grace)."""

    async def go() -> model.Attempt | None:
        async with state.connect() as c:
            return await c.cancel(job_id)

    attempt = run(go())
    stopped = f"; stopped attempt {attempt.launch_name}" if attempt else ""
    out.print(f"job {job_id} cancelled{stopped}")


@jobs.command("rerun")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the new job's id as JSON.")
@config_option
@click.pass_obj
def jobs_rerun(state: State, job_id: int, as_json: bool) -> None:
    """Run a failed or cancelled job again, as a new job labelled rerun-of=ID."""

    async def go() -> int:
        async with state.connect(platforms=False) as c:
            return await c.rerun(job_id)

    made = run(go())
    if as_json:
        print_json({"id": made, "rerun_of": job_id})
        return
    out.print(made)
    err.print(f"job {made} runs job {job_id} again")


@jobs.command("bulk")
@click.argument("action", type=click.Choice(["retry", "cancel", "discard"]))
@click.option("--state", "states", multiple=True, help="Only jobs in this state (repeatable).")
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--executor", default=None, help="Only jobs of this executor.")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE: only jobs with it (repeatable).")
@click.option("--schedule", default=None, help="Only jobs this schedule fired.")
@click.option("--tenant", default=None, help="Only jobs of this tenant (default: every tenant).")
@click.option("--since", type=click.DateTime(), default=None, help="Created at or after (UTC).")
@click.option("--until", type=click.DateTime(), default=None, help="Created before (UTC).")
@click.option(
    "--yes", is_flag=True, help="Do not ask before acting on the jobs the preview counts."
)
@json_option
@config_option
@click.pass_obj
def jobs_bulk(
    state: State,
    action: str,
    states: tuple[str, ...],
    queue: str | None,
    executor: str | None,
    labels: tuple[str, ...],
    schedule: str | None,
    tenant: str | None,
    since: datetime | None,
    until: datetime | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Retry, cancel or discard every job a filter matches: shows how many and which, then
    acts on that snapshot of ids, with its progress (a retry or discard takes quarantined
    jobs, a cancel jobs not ended)."""
    from corral import model

    bulk = model.BulkAction(action)
    chosen = _bulk_filter(bulk, states, queue, executor, labels, schedule, since, until)

    async def preview() -> model.Preview:
        async with state.connect(platforms=False) as c:
            return await c.bulk_preview(bulk, chosen, tenant=tenant)

    seen = run(preview())
    more = ", ..." if seen.count > len(seen.sample) else ""
    ids = ", ".join(str(i) for i in seen.sample) + more
    err.print(f"{action} would touch {seen.count} jobs" + (f": {ids}" if seen.count else ""))
    if seen.count and not yes:
        click.confirm(f"{action} these {seen.count} jobs?", abort=True, err=True)
    _print_operation(run(_bulk_run(state, bulk, chosen, tenant, seen.count, as_json)), as_json)


def _print_operation(op: model.Operation, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "id": op.id,
                "state": op.state,
                "total": op.total,
                "applied": op.applied,
                "skipped": op.skipped,
            }
        )
        return
    out.print(f"operation {op.id} {op.state}: {op.applied} applied, {op.skipped} skipped")


def _bulk_filter(
    action: model.BulkAction,
    states: tuple[str, ...],
    queue: str | None,
    executor: str | None,
    labels: tuple[str, ...],
    schedule: str | None,
    since: datetime | None,
    until: datetime | None,
) -> model.JobFilter:
    """The filter of the options; a bad one is a usage error naming the option."""
    from corral import client

    try:
        return client.operations.job_filter(
            action,
            states=states,
            queue=queue,
            executor=executor,
            labels=labels,
            schedule=schedule,
            since=None if since is None else since.replace(tzinfo=UTC),
            until=None if until is None else until.replace(tzinfo=UTC),
            prefix="--",
        )
    except errors.InvalidInput as exc:
        option, _, rule = str(exc).partition(": ")
        raise click.BadParameter(rule, param_hint=option) from None


async def _bulk_run(
    state: State,
    action: model.BulkAction,
    chosen: model.JobFilter,
    tenant: str | None,
    expect: int,
    quiet: bool,
) -> model.Operation:
    """Start the operation, then step it here (beside any serve or api process) with a
    progress bar until it has ended."""
    from rich.progress import Progress

    async with state.connect() as c:
        op = await c.bulk_start(
            action, chosen, tenant=tenant, expect=expect, made_by="command line"
        )
        runner = c.runner()
        with Progress(console=err, transient=True, disable=quiet) as bar:
            task = bar.add_task(f"operation {op.id}: {action}", total=op.total)
            while op.state == "running":
                if not await runner.run_once():
                    await c.clock.sleep(c.settings.timeouts.operation_interval.total_seconds())
                op = await c.operation(op.id)
                bar.update(task, completed=op.applied + op.skipped)
        return op


@click.group()
def dead() -> None:
    """Quarantined jobs (poison pills): look at them, retry after a fix, or discard."""


@dead.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@config_option
@click.pass_obj
def dead_list(state: State, limit: int, as_json: bool) -> None:
    """List quarantined jobs with their last failure."""

    async def go() -> list[client.jobs.JobView]:
        async with state.connect(platforms=False) as c:
            return await c.dead(limit=limit)

    views = run(go())
    if as_json:
        print_json([shapes.view_dict(v) for v in views])
        return
    out.print(render.dead_table(views))
    err.print(
        f"{len(views)} quarantined job{'s' * (len(views) != 1)}; after a fix"
        " `corral dead retry ID`, to give up `corral dead discard ID`"
        if views
        else "no quarantined jobs"
    )


@dead.command("retry")
@click.argument("job_id", type=JOB_ID)
@config_option
@click.pass_obj
def dead_retry(state: State, job_id: int) -> None:
    """Send a quarantined job back to the queue for a new attempt (after a fix)."""

    async def go() -> None:
        async with state.connect(platforms=False) as c:
            await c.dead_retry(job_id)

    run(go())
    out.print(f"job {job_id} queued again")


@dead.command("discard")
@click.argument("job_id", type=JOB_ID)
@config_option
@click.pass_obj
def dead_discard(state: State, job_id: int) -> None:
    """Give up on a quarantined job (it ends cancelled; its run log stays)."""

    async def go() -> None:
        async with state.connect(platforms=False) as c:
            await c.dead_discard(job_id)

    run(go())
    out.print(f"job {job_id} discarded")
