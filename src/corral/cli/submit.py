"""`corral submit`: a job from the command line, checked at the edge like any other, or
the platform object its first attempt would create (`--dry-run`), or many jobs from a
file of JSON lines (`--from-file`), every line checked before any is stored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

import click

from corral import errors, model
from corral.cli.common import (
    State,
    collect_from_here,
    config_option,
    err,
    out,
    print_json,
    run,
    warn,
)
from corral.cli.job_options import JobCommand, JobOptions, job_options
from corral.executors import registry

if TYPE_CHECKING:
    from corral import client


@click.command(cls=JobCommand, context_settings={"allow_interspersed_args": False})
@job_options
@click.option(
    "--idempotency-key", default=None, help="Submitting the same key again returns the first job."
)
@click.option(
    "--at",
    "at",
    default=None,
    help="Run at this time (ISO 8601, e.g. 2026-12-24T09:00+01:00): scheduled until then.",
)
@click.option(
    "--delay",
    default=None,
    help="Run after this long, e.g. 10m, 1h30m or 90 (seconds): scheduled until then.",
)
@click.option(
    "--allow-past",
    is_flag=True,
    help="Take an --at more than a second before now (the job runs at once).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the Job or Workflow the first attempt would create; store and create nothing.",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["yaml", "json"]),
    default=None,
    help="With --dry-run: the format (default yaml).",
)
@click.option(
    "--from-file",
    "from_file",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Submit the jobs in this file (- for stdin): one JSON object a line, with the"
    ' arguments of the Python client\'s submit, e.g. {"spec": {"command": ["echo", "hi"]},'
    ' "queue": "q", "idempotency_key": "k"}.',
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@config_option
@click.argument("command", nargs=-1)
@click.pass_context
def submit(
    ctx: click.Context,
    /,
    command: tuple[str, ...],
    from_file: IO[str] | None,
    as_json: bool,
    dry_run: bool,
    output: str | None,
    at: str | None,
    delay: str | None,
    allow_past: bool,
    idempotency_key: str | None,
    job: JobOptions,
) -> None:
    """Submit a job: corral submit [OPTIONS] -- CMD [ARGS...]; or many: --from-file PATH"""
    state: State = ctx.obj
    if from_file is not None:
        _alone_with_file(ctx, command)
        submit_file(state, from_file, as_json=as_json)
        return
    _check_output(output, dry_run=dry_run, as_json=as_json)
    args = {**job.arguments(command), "idempotency_key": idempotency_key}
    if dry_run:
        print_dry_run(state, args, output=output or "yaml")
        return

    named = [job.tenant] if _given(ctx, "tenant") else []

    async def go() -> tuple[int, bool, list[str]]:
        async with state.connect(platforms=False) as c:
            run_at = _run_at(at, delay, c.clock.now(), allow_past=allow_past)
            job_id, created = await c.submit(**args, run_at=run_at)
            return job_id, created, await c.quota_warnings(named) if named else []

    job_id, created, warned = run(go())
    _print_submitted(job_id, created, as_json=as_json, warned=warned)


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT


def _alone_with_file(ctx: click.Context, command: tuple[str, ...]) -> None:
    """InvalidInput for a command or an option given beside --from-file, whose every line
    says all of its job."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in ctx.params
        if name not in ("from_file", "as_json", "command") and _given(ctx, name)
    ]
    if command or given:
        raise errors.InvalidInput(
            f"--from-file: each line says all of its job; give no {(given or ['command'])[0]}"
            " beside it"
        )


def _check_output(output: str | None, *, dry_run: bool, as_json: bool) -> None:
    """InvalidInput for -o without --dry-run, or --json with it."""
    if output is not None and not dry_run:
        raise errors.InvalidInput(
            "-o/--output is the format of --dry-run's object; to print the submitted job"
            " as JSON, use --json"
        )
    if dry_run and as_json:
        raise errors.InvalidInput("--dry-run prints the object itself: use -o json, not --json")


def _print_submitted(job_id: int, created: bool, *, as_json: bool, warned: list[str]) -> None:
    """The job's id (or JSON) on stdout; on stderr, that it existed already, and each quota
    of its tenant it took the tenant past (`warned`)."""
    if as_json:
        print_json({"id": job_id, "created": created})
    else:
        out.print(job_id)
    if not created and not as_json:
        err.print(
            f"job {job_id} already exists for this idempotency key; nothing new was submitted"
        )
    warn(warned)


def print_dry_run(state: State, args: Mapping[str, Any], *, output: str) -> None:
    """Print the platform object the first attempt of the job of `args` (`Client.submit`'s
    arguments, of a spec) would create; nothing is stored."""
    import yaml

    from corral import client, clock

    if "task" in args:
        raise errors.InvalidInput(
            "--dry-run prints the platform object a job makes; a --task runs in a worker"
        )
    settings = state.settings()
    executor = args["executor"]
    dry_run = _dry_run_of(executor)
    now = clock.SystemClock().now()
    rest = {k: v for k, v in args.items() if k not in ("spec", "executor", "max_attempts")}
    max_attempts = args.get("max_attempts")
    draft = model.NewJob(
        executor=executor,
        spec=args["spec"],
        max_attempts=settings.default_max_attempts if max_attempts is None else max_attempts,
        **rest,
    )
    checker = registry.checker(executor, settings, clock.SystemClock())
    job = client.checks.check_job(draft, executors={executor: checker}, settings=settings)
    doc = dry_run(job, settings, now)
    # Plain writes: a console would wrap long lines, and the output is meant for kubectl.
    text = (
        json.dumps(doc, indent=2) + "\n"
        if output == "json"
        else yaml.safe_dump(doc, sort_keys=False)
    )
    click.echo(text, nl=False)
    err.print("dry run: nothing stored or created; job id and fence read 0 until it is stored")


def _dry_run_of(executor: str) -> registry.DryRun:
    """How `executor` tells the platform object of a job; InvalidInput for one that cannot."""
    reg = registry.get(executor) if executor in registry.known() else None
    if reg is None or reg.dry_run is None:
        with_dry_run = [k for k in registry.known() if registry.get(k).dry_run]
        raise errors.InvalidInput(
            f"--dry-run: prints the platform object of --executor {' or '.join(with_dry_run)},"
            f" not of {executor!r}"
        )
    return reg.dry_run


def _run_at(
    at: str | None, delay: str | None, now: datetime, *, allow_past: bool = False
) -> datetime | None:
    """--at or --delay as the job's run_at (None: now); an --at more than a second before
    now is refused unless --allow-past."""
    from corral import cadence, client

    if at is not None and delay is not None:
        raise errors.InvalidInput("give either --at or --delay, not both")
    if at is not None:
        when = cadence.parse_instant(at, "--at")
        if not allow_past and client.arguments.past_by(when, now):
            raise errors.InvalidInput(
                f"--at: {when.isoformat()} is before now; give --allow-past to run it at once"
            )
        return when
    if delay is not None:
        return now + cadence.parse_duration(delay, "--delay")
    return None


def read_jobs(text: Any, now: datetime | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The jobs of a JSON-lines file, with their line numbers (blank lines skipped); the
    first bad line refuses them all, naming its number."""
    from corral import client

    jobs = []
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            given = json.loads(line)
        except json.JSONDecodeError as exc:
            raise errors.InvalidInput(f"line {number}: not valid JSON ({exc})") from None
        try:
            jobs.append((number, client.arguments.submit_arguments(given, now=now)))
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(f"line {number}: {exc}") from None
    return jobs


def submit_file(state: State, text: Any, *, as_json: bool) -> None:
    """Check every job of the file, then store them in batches of 1,000, with a progress
    bar; nothing is stored when a line is wrong."""
    collect_from_here()  # a file may hold many jobs
    try:
        from corral import clock

        jobs = read_jobs(text, clock.SystemClock().now())  # delay, allow_past: as the API
    except UnicodeDecodeError as exc:
        raise errors.InvalidInput(f"--from-file: not UTF-8 text ({exc.reason})") from None

    named = {args["tenant"] for _, args in jobs if "tenant" in args}

    async def go() -> tuple[list[tuple[int, bool]], list[str]]:
        async with state.connect(platforms=False) as c:
            stored = await _stored(c, await _checked(c, jobs))
            return stored, await c.quota_warnings(named) if named else []

    stored, warned = run(go())
    created = sum(made for _, made in stored)
    if as_json:
        print_json(
            {
                "jobs": [{"id": job_id, "created": made} for job_id, made in stored],
                "created": created,
                "existing": len(stored) - created,
            }
        )
    else:
        click.echo("\n".join(str(job_id) for job_id, _ in stored))
        err.print(
            f"submitted {len(stored)} jobs: {created} new, {len(stored) - created} already"
            " there (same idempotency key)"
        )
    warn(warned)


async def _checked(c: client.Client, jobs: list[tuple[int, dict[str, Any]]]) -> list[model.NewJob]:
    """Each line's job checked as a submit checks it; the first wrong one names its line."""
    checked = []
    for number, args in jobs:
        try:
            checked.append(c.validate(await c.task_checked(c.new_job(**args))))
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(f"line {number}: {exc}") from None
    return checked


async def _stored(c: client.Client, checked: list[model.NewJob]) -> list[tuple[int, bool]]:
    """The jobs stored, with a progress bar while they are."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("submitting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("jobs", total=len(checked))
        return await c.submit_many(checked, progress=lambda n: bar.advance(task, n))
