"""`corral schedules` (make, change, pause, look at and preview schedules) and `corral
backfill` (one job per nominal time of a schedule in a range)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self

import click

from corral import autopause, errors, scheduling, shapes
from corral.cli import render, schedule_firings
from corral.cli.common import State, config_option, err, out, print_json, run, warn
from corral.cli.job_options import JobCommand, JobOptions, job_options

if TYPE_CHECKING:
    from corral import cadence, config

TENANT = click.option("--tenant", "tenant", default="default", show_default=True)
JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
_MICRO = timedelta(microseconds=1)

RULE_OPTIONS = [
    click.option("--cron", default=None, help="A cron expression, e.g. '0 9 * * 1-5'."),
    click.option(
        "--tz", default=None, help="The cron expression's time zone, e.g. Europe/Berlin (UTC)."
    ),
    click.option("--every", default=None, help="A fixed interval instead, e.g. 30s, 10m, 1h30m."),
    click.option(
        "--start",
        default=None,
        help="No firing before it; an interval's origin (default: now). ISO 8601.",
    ),
    click.option("--until", default=None, help="No firing at or after it. ISO 8601."),
    click.option(
        "--catchup",
        type=click.Choice(["none", "all"]),
        default=None,
        help="After downtime: fire the latest missed time only (none, the default), or each"
        " one within --catchup-window, at most --catchup-max (all).",
    ),
    click.option("--catchup-window", default=None, help="How far back catch-up all goes (7d)."),
    click.option(
        "--catchup-max", type=int, default=None, help="At most this many caught up (100)."
    ),
    click.option(
        "--overlap",
        type=click.Choice(["allow", "forbid", "replace"]),
        default=None,
        help="While the previous firing's job runs: fire anyway (allow, the default), skip"
        " (forbid), or cancel it and fire (replace).",
    ),
    click.option(
        "--jitter",
        default=None,
        help="Delay each firing's job by up to this much (the same delay on every scheduler).",
    ),
    click.option(
        "--pause-after",
        type=int,
        default=None,
        help="Pause the schedule once this many of its firings' jobs in a row ended failed or"
        " quarantined (0: never; unset: its tenant's [tenants.NAME] pause_after).",
    ),
]


@dataclass(frozen=True, slots=True)
class RuleOptions:
    """RULE_OPTIONS' values (None: not given), each named as `Client.schedule_create`'s
    argument."""

    cron: str | None = None
    tz: str | None = None
    every: str | None = None
    start: str | None = None
    until: str | None = None
    catchup: str | None = None
    catchup_window: str | None = None
    catchup_max: int | None = None
    overlap: str | None = None
    jitter: str | None = None
    pause_after: int | None = None

    @classmethod
    def take(cls, params: dict[str, Any]) -> Self:
        """The rule options of a command's `params`, taken out of them."""
        return cls(**{f.name: params.pop(f.name) for f in dataclasses.fields(cls)})

    def given(self, ctx: click.Context | None = None) -> dict[str, Any]:
        """The options given: those not None, or (with `ctx`) those given on the command
        line."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if (getattr(self, f.name) is not None if ctx is None else _given(ctx, f.name))
        }


class ScheduleCommand(JobCommand):
    """A schedule's command: its job options as one JobOptions, `job`, and its rule's as
    one RuleOptions, `rule`."""

    takes: ClassVar[dict[str, Any]] = {"job": JobOptions, "rule": RuleOptions}


def _given(ctx: click.Context, param: str) -> bool:
    return ctx.get_parameter_source(param) is not click.core.ParameterSource.DEFAULT


# Which template fields each job option says (for `update`: only the ones given change).
_JOB_FIELDS = {
    "command": "spec",
    "spec_json": "spec",
    "image": "spec",
    "placement": "spec",
    "http_request": "spec",
    "header_lines": "spec",
    "data": "spec",
    "json_body": "spec",
    "expect": "spec",
    "expect_body": "spec",
    "expect_json": "spec",
    "max_response_time": "spec",
    "label_pairs": "labels",
    "payload_json": "payload",
    "payload_file": "payload",
    "policy_json": "policy",
    "deadline": "policy",
    "heartbeat": "policy",
    "on_unknown": "policy",
    "sla": "policy",
}


def schedule_options(fn: Any) -> Any:
    """NAME, the rule's options, the job's (as `corral submit`'s) and the command."""
    decorators: list[Callable[[Any], Any]] = [
        click.argument("name"),
        *RULE_OPTIONS,
        job_options,
        JSON,
        config_option,
        click.argument("command", nargs=-1),
        click.pass_context,
    ]
    for option in reversed(decorators):
        fn = option(fn)
    return fn


@click.group()
def schedules() -> None:
    """Make and manage schedules (cron, intervals)."""


schedules.add_command(schedule_firings.firings)


@schedules.command("add", cls=ScheduleCommand)
@schedule_options
def schedules_add(
    ctx: click.Context,
    /,
    name: str,
    command: tuple[str, ...],
    as_json: bool,
    job: JobOptions,
    rule: RuleOptions,
) -> None:
    """Make a schedule: corral schedules add NAME (--cron EXPR [--tz TZ] | --every DUR)
    [OPTIONS] -- CMD [ARGS...]"""
    state: State = ctx.obj
    given = rule.given()
    args = job.arguments(command)
    named = [job.tenant] if _given(ctx, "tenant") else []

    async def go() -> tuple[scheduling.Schedule, list[str]]:
        async with state.connect(platforms=False) as c:
            made = await c.schedule_create(name, **given, **args)
            return made, await c.quota_warnings(named, schedules=True) if named else []

    made, warned = run(go())
    _print_made(state, made, as_json)
    warn(warned)


@schedules.command("update", cls=ScheduleCommand)
@schedule_options
def schedules_update(
    ctx: click.Context,
    /,
    name: str,
    command: tuple[str, ...],
    as_json: bool,
    job: JobOptions,
    rule: RuleOptions,
) -> None:
    """Change a schedule: only the options given (and the command, if given) change."""
    state: State = ctx.obj
    changes = rule.given(ctx)
    fields = _fields_given(ctx, command, job)
    if not (changes or fields):
        raise errors.InvalidInput("nothing to change: give an option or a command")

    async def go() -> scheduling.Schedule:
        async with state.connect(platforms=False) as c:
            if fields:
                old = (await c.schedule(name, tenant=job.tenant)).template
                changes.update(_template_changes(old, fields, command, job))
            return await c.schedule_update(name, tenant=job.tenant, **changes)

    _print_made(state, run(go()), as_json, verb="updated")


def _fields_given(ctx: click.Context, command: tuple[str, ...], job: JobOptions) -> set[str]:
    """The template fields the job options (and the command) given change."""
    names = [f.name for f in dataclasses.fields(job)]
    fields = {_JOB_FIELDS.get(p, p) for p in [*names, "command"] if _given(ctx, p)} - {"tenant"}
    if command:
        fields.add("spec")
    if job.http_request:
        fields.add("executor")  # an HTTP request runs on the http executor
    if "spec" in fields and not (command or job.spec_json or job.http_request):
        raise errors.InvalidInput(
            "to change what runs, give the whole command after -- (or --spec, or --http)"
        )
    return fields


def _template_changes(
    old: Any, fields: set[str], command: tuple[str, ...], job: JobOptions
) -> dict[str, Any]:
    """The job template's `fields` as the options say them now, over template `old`."""
    if job.policy_json is None:  # --deadline and the like change it
        job = dataclasses.replace(job, policy_json=json.dumps(_policy_but(old, job)))
    # What runs stays as it is unless given: a stand-in command lets the other options be
    # read, and is dropped.
    args = job.arguments(command if "spec" in fields else ("true",))
    if "labels" in fields:  # --label adds to the labels, or changes one
        args["labels"] = {**old.get("labels", {}), **args["labels"]}
    return {k: v for k, v in args.items() if k in fields}


def _policy_but(template: Any, job: JobOptions) -> dict[str, Any]:
    """A stored policy without what the shortcut options given say again."""
    policy = dict(template.get("policy") or {})
    if job.deadline is not None and isinstance(policy.get("limits"), dict):
        policy["limits"] = {k: v for k, v in policy["limits"].items() if k != "attempt_deadline"}
    if job.heartbeat:
        policy.pop("heartbeat", None)
    if job.on_unknown is not None:
        policy.pop("on_unknown", None)
    if job.sla is not None:
        policy.pop("sla", None)
    return policy


def _print_made(state: State, made: scheduling.Schedule, as_json: bool, verb: str = "made") -> None:
    if as_json:
        print_json(_as_json(made, state.settings()))
        return
    out.print(made.name)
    nxt = render.when(made.next_due) if made.next_due else "never (past --until)"
    err.print(f"schedule {made.name!r} {verb}; it fires next at {nxt} UTC")


@schedules.command("list")
@click.option("--tenant", "tenant", default=None, help="Only this tenant's.")
@JSON
@config_option
@click.pass_obj
def schedules_list(state: State, tenant: str | None, as_json: bool) -> None:
    """The schedules, with their next firings."""

    async def go() -> list[scheduling.Schedule]:
        async with state.connect(platforms=False) as c:
            return await c.schedules(tenant=tenant)

    found = run(go())
    if as_json:
        print_json([shapes.schedule_dict(s) for s in found])
        return
    out.print(render.schedules_table(found))


@schedules.command("show")
@click.argument("name")
@TENANT
@click.option("--firings", "limit", type=int, default=10, show_default=True)
@JSON
@config_option
@click.pass_obj
def schedules_show(state: State, name: str, tenant: str, limit: int, as_json: bool) -> None:
    """A schedule, its next firings and its latest ones."""

    async def go() -> tuple[
        scheduling.Schedule, list[scheduling.Firing], list[cadence.Nominal], int
    ]:
        async with state.connect(platforms=False) as c:
            found = await c.schedule(name, tenant=tenant)
            firings = await c.firings(name, tenant=tenant, limit=limit)
            return found, firings, c.upcoming(found), autopause.effective(found, c.settings.tenants)

    found, firings, upcoming, pause_after = run(go())
    if as_json:
        print_json(
            {
                **_as_json(found, settings=None, pause_after=pause_after),
                "upcoming": [shapes.nominal_dict(n) for n in upcoming],
                "firings": [shapes.firing_dict(f) for f in firings],
            }
        )
        return
    render.print_schedule(found, upcoming, firings, pause_after)


def _as_json(
    found: scheduling.Schedule, settings: config.Settings | None, *, pause_after: int = 0
) -> dict[str, Any]:
    """A schedule as `--json` prints it: the API's fields, with the pause_after in effect
    (its own, or its tenant's default from `settings` when given)."""
    if settings is not None:
        pause_after = autopause.effective(found, settings.tenants)
    return {**shapes.schedule_dict(found), "pause_after_in_effect": pause_after}


def _far(at: datetime) -> datetime:
    return at + timedelta(days=30 * 366)


def _take(found: Any, count: int, until: datetime | None) -> list[cadence.Nominal]:
    taken: list[cadence.Nominal] = []
    for nominal in found:
        if len(taken) >= count or (until is not None and nominal.at >= until):
            break
        taken.append(nominal)
    return taken


def _simple(verb: str, doc: str) -> click.Command:
    @click.argument("name")
    @TENANT
    @JSON
    @config_option
    @click.pass_obj
    def command(state: State, name: str, tenant: str, as_json: bool) -> None:
        async def go() -> scheduling.Schedule | None:
            async with state.connect(platforms=False) as c:
                method = getattr(c, f"schedule_{verb}")
                return await method(name, tenant=tenant)  # type: ignore[no-any-return]

        done = run(go())
        if as_json:
            print_json(shapes.schedule_dict(done) if done else {"name": name, "deleted": True})
            return
        err.print(f"schedule {name!r} {verb}d" if verb != "pause" else f"schedule {name!r} paused")

    command.__doc__ = doc
    return schedules.command(verb)(command)


_simple("pause", "Pause a schedule: nothing fires until it is resumed.")
_simple(
    "resume",
    "Resume a paused schedule: the times that passed meanwhile are recorded as skipped, not fired.",
)
_simple("delete", "Delete a schedule and its firings; the jobs it made stay.")


@schedules.command("trigger")
@click.argument("name")
@TENANT
@JSON
@config_option
@click.pass_obj
def schedules_trigger(state: State, name: str, tenant: str, as_json: bool) -> None:
    """Fire a schedule now, outside its times: prints the job's id."""

    async def go() -> int:
        async with state.connect(platforms=False) as c:
            return await c.schedule_trigger(name, tenant=tenant)

    job_id = run(go())
    if as_json:
        print_json({"id": job_id, "schedule": name})
        return
    out.print(job_id)


@schedules.command("duplicate")
@click.argument("name")
@click.argument("new_name", metavar="NEW")
@TENANT
@JSON
@config_option
@click.pass_obj
def schedules_duplicate(state: State, name: str, new_name: str, tenant: str, as_json: bool) -> None:
    """Copy a schedule as NEW (its rule, options and job template): a new schedule that
    fires from now, even while NAME is paused."""

    async def go() -> scheduling.Schedule:
        async with state.connect(platforms=False) as c:
            return await c.schedule_duplicate(name, new_name, tenant=tenant)

    _print_made(state, run(go()), as_json, verb=f"made (a copy of {name!r})")


@schedules.command("preview")
@click.argument("name", required=False)
@TENANT
@click.option("--cron", default=None, help="Preview an expression instead of a schedule.")
@click.option("--tz", default="UTC", show_default=True)
@click.option("--every", default=None, help="Preview an interval instead of a schedule.")
@click.option("--count", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--from", "start", default=None, help="From this time (default: now). ISO 8601.")
@JSON
@config_option
@click.pass_obj
def schedules_preview(
    state: State,
    name: str | None,
    tenant: str,
    cron: str | None,
    tz: str,
    every: str | None,
    count: int,
    start: str | None,
    as_json: bool,
) -> None:
    """The next firings of a schedule, or of --cron EXPR --tz TZ, marking those a DST
    change moved."""
    from corral import cadence, clock

    now = clock.SystemClock().now()
    if name is not None and (cron or every):
        raise errors.InvalidInput("give a schedule's name or --cron/--every, not both")
    until: datetime | None = None
    if name is None:
        since = cadence.parse_instant(start, "--from", tz) if start else now
        if (cron is None) == (every is None):
            raise errors.InvalidInput(
                "give a schedule's name, or --cron EXPR [--tz TZ], or --every"
            )
        when: cadence.When = (
            cadence.parse_cron(cron, tz) if cron else cadence.parse_every(every or "", since)
        )
    else:
        when, since, until = _schedule_rule(state, name, tenant, start, now)
    first = cadence.after(when, since - _MICRO)
    upcoming = _take(cadence.between(when, first.at, _far(first.at)), count, until)
    if as_json:
        print_json([shapes.nominal_dict(n) for n in upcoming])
        return
    out.print(render.nominals_table(upcoming))


def _schedule_rule(
    state: State, name: str, tenant: str, start: str | None, now: datetime
) -> tuple[cadence.When, datetime, datetime | None]:
    """A stored schedule's rule, from when to preview it (--from, in the schedule's own
    zone when it has no offset; else now; never before its start), and its end."""
    from corral import cadence, planning

    async def go() -> scheduling.Schedule:
        async with state.connect(platforms=False) as c:
            return await c.schedule(name, tenant=tenant)

    found = run(go())
    since = cadence.parse_instant(start, "--from", found.tz) if start else now
    return planning.rule(found, found.anchor), max(since, found.anchor), found.until


@click.command(
    "backfill",
    epilog="Running it again creates nothing new. Each job's CORRAL_INTERVAL_START and"
    " CORRAL_INTERVAL_END say its interval.",
)
@click.argument("schedule")
@click.option("--from", "start", required=True, help="The first nominal time's lower bound.")
@click.option("--to", "end", required=True, help="The upper bound (not included).")
@TENANT
@click.option("--pool", default=None, help="Run the backfill's jobs in this pool.")
@click.option("--code-version", default=None, help="Stamp every job with this code version.")
@click.option("--dry-run", is_flag=True, help="Count the nominal times; store nothing.")
@JSON
@config_option
@click.pass_obj
def backfill(
    state: State,
    schedule: str,
    start: str,
    end: str,
    tenant: str,
    pool: str | None,
    code_version: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """One job per nominal time of a schedule in [--from, --to), idempotently."""
    from rich.progress import Progress

    async def go() -> tuple[int, int]:
        async with state.connect(platforms=False) as c:
            with Progress(console=err, transient=True, disable=as_json) as bar:
                task = bar.add_task("backfilling", total=None)
                return await c.backfill(
                    schedule,
                    start=start,
                    end=end,
                    tenant=tenant,
                    pool=pool,
                    code_version=code_version,
                    dry_run=dry_run,
                    progress=lambda n: bar.advance(task, n),
                )

    created, there = run(go())
    if as_json:
        print_json({"created": created, "existing": there, "dry_run": dry_run})
        return
    if dry_run:
        out.print(f"{created} nominal times in the range; dry run: nothing stored")
        return
    out.print(f"{created} jobs created, {there} there already")
