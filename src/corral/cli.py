"""The `corral` command. Each subcommand checks its arguments, then makes one call.

Exit codes: 0 ok; 1 the operation failed (database unreachable, job not found, ...);
2 bad usage, bad settings or refused input; 3 a heartbeat from an attempt that a newer
one replaced (the job should stop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from corral import client, clock, config, errors, health, lint, model, runtime, store, worker

T = TypeVar("T")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_FAILED, EXIT_USAGE, EXIT_STALE = 1, 2, 3
JOB_ID = click.IntRange(1, 2**63 - 1)
DEMO_JOBS: list[dict[str, Any]] = [
    {"key": "demo-hello", "command": ["sh", "-c", "echo hello from corral; sleep 1"]},
    {"key": "demo-urgent", "command": ["sh", "-c", "echo urgent work first"], "priority": 10},
    {"key": "demo-slow", "command": ["sh", "-c", "echo working; sleep 5; echo done"]},
    {
        "key": "demo-env",
        "command": [
            "sh",
            "-c",
            "echo job $CORRAL_JOB_ID attempt $CORRAL_ATTEMPT fence $CORRAL_FENCE",
        ],
    },
    {
        "key": "demo-flaky",
        "command": ["sh", "-c", "echo failing on purpose >&2; exit 3"],
        "max_attempts": 2,
    },
]


class State:
    """What the top-level options hand to subcommands."""

    def __init__(self, config_file: Path | None) -> None:
        self.config_file = config_file

    def settings(self, **overrides: Any) -> config.Settings:
        return config.Settings.load(self.config_file, **overrides)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="Settings file (default ./corral.toml).",
)
@click.pass_context
def main(ctx: click.Context, config_file: Path | None) -> None:
    """corral: a crash-safe job dispatcher."""
    ctx.obj = State(config_file)


# --- db -----------------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@click.pass_obj
def db_upgrade(state: State) -> None:
    """Create or upgrade the schema to this corral's newest revision."""
    settings = state.settings()

    async def upgrade() -> tuple[str | None, str | None]:
        db = store.Store.connect(settings.database_url, timeouts=settings.timeouts)
        try:
            return await db.migrate()
        finally:
            await db.close()

    before, after = run(upgrade())
    if before == after:
        out.print(f"database is up to date (revision {after})")
    else:
        out.print(f"database upgraded from {before or 'empty'} to revision {after}")


# --- submit -------------------------------------------------------------------------------------


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"--label {pair!r}: use KEY=VALUE")
        model.check_label(key, value)
        labels[key] = value
    return labels


def _json_option(name: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.InvalidInput(f"{name}: not valid JSON ({exc})") from None


def _policy(
    text: str | None, *, deadline: str | None, heartbeat: bool, on_unknown: str | None
) -> dict[str, Any]:
    """--policy with the shortcut options laid over it."""
    policy = _json_option("--policy", text) or {}
    if not isinstance(policy, dict):
        raise errors.InvalidInput("--policy: must be a JSON object")
    if deadline is not None:
        policy.setdefault("limits", {})["attempt_deadline"] = deadline
    if heartbeat:
        policy["heartbeat"] = True
    if on_unknown is not None:
        policy["on_unknown"] = on_unknown
    return policy


_DryRun = Callable[[model.NewJob, config.Settings, datetime], dict[str, Any]]
CONTAINER_EXECUTORS = ("argo", "kubernetes")
"""The executors that run a container image (--image, --placement) on Kubernetes."""


def _container_executor(
    kind: str,
) -> tuple[Callable[[config.Settings], client.SpecChecker], _DryRun]:
    """What checks a container executor's spec, and what makes the object --dry-run
    prints. Imported on use: the cluster clients take most of a second to load, which
    every other command (`corral heartbeat` inside a job, say) would pay for nothing."""
    if kind == "argo":
        from corral.executors import argo

        return argo.WorkflowTemplate, argo.dry_run
    from corral.executors import kubernetes

    return kubernetes.JobTemplate, kubernetes.dry_run


def _spec(
    executor: str,
    command: tuple[str, ...],
    spec_json: str | None,
    *,
    image: str | None,
    placement: str | None,
) -> Any:
    """The executor spec from --spec (checked by its executor), or from the command."""
    spec = _json_option("--spec", spec_json)
    if spec is not None:
        if command or image or placement:
            raise errors.InvalidInput(
                "give either --spec or a command after -- (with --image, --placement), not both"
            )
        return spec
    if executor in CONTAINER_EXECUTORS:
        made: dict[str, Any] = {"image": image, "command": list(command)}
        if placement is not None:
            made["placement"] = placement
        return made
    if image or placement:
        raise errors.InvalidInput(
            f"--image and --placement are for --executor {_container_kinds()}"
        )
    return {"command": list(command)}


def _container_kinds() -> str:
    return " or ".join(sorted(CONTAINER_EXECUTORS))


def _dry_run(
    state: State,
    *,
    spec: Any,
    executor: str,
    max_attempts: int | None,
    output: str = "yaml",
    **fields: Any,
) -> None:
    """Print the platform object the first attempt would create; nothing is stored."""
    settings = state.settings()
    if executor not in CONTAINER_EXECUTORS:
        raise errors.InvalidInput(
            f"--dry-run: prints the Kubernetes object of --executor {_container_kinds()},"
            f" not of {executor!r}"
        )
    template, dry_run = _container_executor(executor)
    draft = model.NewJob(
        executor=executor,
        spec=spec,
        max_attempts=settings.default_max_attempts if max_attempts is None else max_attempts,
        **fields,
    )
    job = client.check_job(draft, executors={executor: template(settings)}, settings=settings)
    doc = dry_run(job, settings, clock.SystemClock().now())
    # Plain writes: a console would wrap long lines, and the output is meant for kubectl.
    text = (
        json.dumps(doc, indent=2) + "\n"
        if output == "json"
        else yaml.safe_dump(doc, sort_keys=False)
    )
    click.echo(text, nl=False)
    err.print("dry run: nothing stored or created; job id and fence read 0 until it is stored")


@main.command(context_settings={"allow_interspersed_args": False})
@click.option("--queue", default="default", show_default=True)
@click.option("--pool", default=None)
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--tenant", default="default", show_default=True)
@click.option(
    "--idempotency-key", default=None, help="Submitting the same key again returns the first job."
)
@click.option(
    "--code-version",
    default=None,
    help="What the job's code is (a git sha, an image tag): CORRAL_CODE_VERSION in each"
    " attempt, stamped by the fenced sinks on what it writes.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=None,
    help="Attempts before the job fails (default from settings).",
)
@click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE")
@click.option("--executor", default="process", show_default=True)
@click.option(
    "--spec", "spec_json", default=None, help="Executor spec as JSON (instead of a command)."
)
@click.option("--payload", "payload_json", default=None, help="Payload as JSON.")
@click.option(
    "--payload-file",
    type=click.File("r"),
    default=None,
    help="Payload as JSON from a file (- for stdin).",
)
@click.option(
    "--policy",
    "policy_json",
    default=None,
    help='The job\'s own policy as JSON, e.g. \'{"failure_rules": [{"on_exit_codes":'
    ' {"operator": "In", "values": [3]}, "action": "fail"}]}\'.',
)
@click.option("--deadline", default=None, help="Tighten the attempt deadline, e.g. 30s or 5m.")
@click.option(
    "--heartbeat",
    is_flag=True,
    help="The job sends heartbeats (`corral heartbeat`); silence past its lease is unknown.",
)
@click.option(
    "--on-unknown",
    type=click.Choice(["wait", "fence_and_relaunch"]),
    default=None,
    help="What to do when the attempt's state is unknown (default wait).",
)
@click.option("--image", default=None, help="Container image (executor kubernetes or argo).")
@click.option("--placement", default=None, help="Placement class (executor kubernetes or argo).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the Job or Workflow the first attempt would create; store and create nothing.",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["yaml", "json"]),
    default="yaml",
    show_default=True,
    help="With --dry-run: the format.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.argument("command", nargs=-1)
@click.pass_obj
def submit(
    state: State,
    /,
    command: tuple[str, ...],
    label_pairs: tuple[str, ...],
    spec_json: str | None,
    payload_json: str | None,
    payload_file: Any,
    as_json: bool,
    policy_json: str | None,
    deadline: str | None,
    heartbeat: bool,
    on_unknown: str | None,
    image: str | None,
    placement: str | None,
    dry_run: bool,
    output: str,
    **options: Any,
) -> None:
    """Submit a job: corral submit [OPTIONS] -- CMD [ARGS...]"""
    policy = _policy(policy_json, deadline=deadline, heartbeat=heartbeat, on_unknown=on_unknown)
    spec = _spec(options["executor"], command, spec_json, image=image, placement=placement)
    labels = _labels(label_pairs)
    if payload_file is not None:
        if payload_json is not None:
            raise errors.InvalidInput("give either --payload or --payload-file, not both")
        try:
            payload_json = payload_file.read()
        except UnicodeDecodeError as exc:
            raise errors.InvalidInput(f"--payload-file: not UTF-8 text ({exc.reason})") from None
    payload = _json_option("--payload", payload_json)
    if dry_run:
        _dry_run(
            state,
            spec=spec,
            payload=payload,
            labels=labels,
            policy=policy,
            output=output,
            **options,
        )
        return

    async def go() -> tuple[int, bool]:
        async with runtime.connect(state.settings()) as c:
            return await c.submit(
                spec=spec, payload=payload, labels=labels, policy=policy, **options
            )

    job_id, created = run(go())
    if as_json:
        out.print_json(json.dumps({"id": job_id, "created": created}))
    elif created:
        out.print(job_id)
    else:
        out.print(job_id)
        err.print(
            f"job {job_id} already exists for this idempotency key; nothing new was submitted"
        )


# --- serve and dispatcher -------------------------------------------------------------------------


def _logging(settings: config.Settings) -> None:
    logging.basicConfig(
        level=settings.log_level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=True)],
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


async def _until_signalled(body: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `body(stop)`; SIGTERM or SIGINT sets `stop` so the body can end cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await body(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _serve(settings: config.Settings, *, demo: bool, dispatch: bool, reconcile: bool) -> None:
    async def ready(rt: runtime.Runtime) -> None:
        if demo:
            await _submit_demo(
                client.Client(
                    store=rt.store, executors=rt.executors, settings=settings, clock=rt.clock
                )
            )
        doing = " and ".join(
            what for what, on in (("dispatching", dispatch), ("reconciling", reconcile)) if on
        )
        err.print(
            f"corral is {doing} on {rt.store.url} with executors: {', '.join(rt.executors)}."
            " Press Ctrl+C (or send SIGTERM) to stop."
        )

    await _until_signalled(
        lambda stop: runtime.serve(
            settings, stop, dispatch=dispatch, reconcile=reconcile, on_ready=ready
        )
    )


async def _submit_demo(c: client.Client) -> None:
    made = 0
    for job in DEMO_JOBS:
        _, created = await c.submit(
            spec={"command": job["command"]},
            idempotency_key=job["key"],
            queue="demo",
            priority=job.get("priority", 0),
            max_attempts=job.get("max_attempts"),
        )
        made += created
    if made:
        err.print(
            f"submitted {made} demo jobs; watch them with `.venv/bin/corral jobs list`"
            " in another terminal"
        )


HEALTH_FILE = click.option(
    "--health-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Note every finished tick and pass in this file, for `corral health`"
    " (default: the health_file setting).",
)


@main.command()
@click.option("--demo", is_flag=True, help="Submit a few demo jobs on first start.")
@HEALTH_FILE
@click.pass_obj
def serve(state: State, demo: bool, health_file: Path | None) -> None:
    """Run corral: the dispatcher and the reconciler."""
    _run_loops(state, health_file, demo=demo, dispatch=True, reconcile=True)


@main.command("dispatcher")
@HEALTH_FILE
@click.pass_obj
def dispatcher_cmd(state: State, health_file: Path | None) -> None:
    """Run the dispatcher loop alone."""
    _run_loops(state, health_file, demo=False, dispatch=True, reconcile=False)


@main.command("reconciler")
@HEALTH_FILE
@click.pass_obj
def reconciler_cmd(state: State, health_file: Path | None) -> None:
    """Run the reconciler loop alone (recovery: adopt, relaunch, complete, time out, lost)."""
    _run_loops(state, health_file, demo=False, dispatch=False, reconcile=True)


def _run_loops(
    state: State, health_file: Path | None, *, demo: bool, dispatch: bool, reconcile: bool
) -> None:
    overrides = {"health_file": health_file} if health_file is not None else {}
    settings = state.settings(**overrides)
    _logging(settings)
    run(_serve(settings, demo=demo, dispatch=dispatch, reconcile=reconcile))


@main.command("health")
@click.option(
    "--file",
    "path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The health file (default: the health_file setting).",
)
@click.option(
    "--max-age",
    default=None,
    help=f"A loop whose last tick or pass ended longer ago than this is stuck, e.g. 90s"
    f" (default {health.DEFAULT_MAX_AGE.total_seconds():g}s; with --ready, no age check).",
)
@click.option(
    "--ready",
    is_flag=True,
    help="Only check that every loop has finished its first tick or pass.",
)
@click.pass_obj
def health_cmd(state: State, path: Path | None, max_age: str | None, ready: bool) -> None:
    """Exit 0 when a running corral's loops are alive (its health file is fresh), else 1.

    For liveness and readiness probes: run corral with --health-file PATH (or the
    health_file setting), and check that file here."""
    if path is None:
        path = config.Settings.load(state.config_file, check_chain=False).health_file
    if path is None:
        raise errors.InvalidInput(
            "no health file to check: give --file PATH or set health_file (CORRAL_HEALTH_FILE)"
        )
    limit = None if ready else health.DEFAULT_MAX_AGE
    if max_age is not None:
        try:
            limit = config.parse_duration(max_age)
        except ValueError as exc:
            raise errors.InvalidInput(f"--max-age: {exc}") from None
    said = health.check(path, now=clock.SystemClock().now(), max_age=limit)
    out.print(said, markup=False, soft_wrap=True)


# --- check ----------------------------------------------------------------------------------------


@main.command()
@click.pass_obj
def check(state: State) -> None:
    """Show how the limits nest (inner < outer, with the margin); exit 1 if one does not."""
    settings = config.Settings.load(state.config_file, check_chain=False)
    table = Table("inner < outer", "values", "to spare", "needs", "", box=box.SIMPLE_HEAD)
    table.columns[0].overflow = "fold"
    table.title = "each inner limit must be shorter than the outer one by the margin it needs"
    links = config.chain(settings)
    for c in links:
        link = c.link
        inner = _short(link.inner) + (f" + {_short(link.extra)}" if link.extra else "")
        table.add_row(
            f"{inner} {'<' if link.margin else '<='} {_short(link.outer)}",
            f"{c.show(c.inner + c.extra)} vs {c.show(c.outer)}",
            c.show(c.spare),
            f"{c.show(c.needed)} ({_short(link.margin)})" if link.margin else "-",
            _status(c),
        )
    # Piped (CI logs, a file), the table is not squeezed into the 80 columns of no terminal.
    (out if out.is_terminal else Console(highlight=False, width=160)).print(table)
    broken = config.chain_violations(settings)
    for line in broken:
        err.print(f"error: {line}", markup=False)
    if broken:
        raise SystemExit(EXIT_FAILED)
    margin = settings.timeouts.margin.total_seconds()
    tick = settings.timeouts.tick_margin.total_seconds()
    unused = sum(not c.applies for c in links)
    out.print(
        f"all {len(links) - unused} limits nest (margin {margin:g}s, tick margin {tick:g}s)"
        + (f"; n/a: {unused} links for PostgreSQL, unused on SQLite" if unused else "")
    )


def _status(c: config.LinkCheck) -> str:
    if not c.applies:
        return "[dim]n/a[/dim]"
    return "ok" if c.ok else "[red]BROKEN[/red]"


def _short(setting: str) -> str:
    return setting.removeprefix("timeouts.").removeprefix("executors.")


# --- jobs ---------------------------------------------------------------------------------------


@main.group()
def jobs() -> None:
    """Look at and manage jobs."""


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else "-"


def _job_dict(job: model.Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state,
        "queue": job.queue,
        "pool": job.pool,
        "tenant": job.tenant,
        "priority": job.priority,
        "executor": job.executor,
        "spec": job.spec,
        "payload": job.payload,
        "attempts": job.attempt_count,
        "max_attempts": job.max_attempts,
        "run_at": job.run_at.isoformat(),
        "idempotency_key": job.idempotency_key,
        "labels": job.labels,
        "policy": job.policy,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


@jobs.command("list")
@click.option("--state", "states", multiple=True, help="Only jobs in this state (repeatable).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def jobs_list(state: State, states: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List the newest jobs."""

    async def go() -> list[model.Job]:
        async with runtime.connect(state.settings()) as c:
            return await c.jobs(states=states, limit=limit)

    found = run(go())
    if as_json:
        out.print_json(json.dumps([_job_dict(j) for j in found]))
        return
    table = Table("id", "state", "queue", "executor", "prio", "attempts", "updated")
    for j in found:
        table.add_row(
            str(j.id),
            j.state,
            j.queue,
            j.executor,
            str(j.priority),
            f"{j.attempt_count}/{j.max_attempts}",
            _when(j.updated_at),
        )
    out.print(table)


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def jobs_show(state: State, job_id: int, as_json: bool) -> None:
    """Show a job, its attempts and its events (the run log)."""

    async def go() -> client.JobView:
        async with runtime.connect(state.settings()) as c:
            return await c.job(job_id)

    view = run(go())
    if as_json:
        out.print_json(json.dumps(_view_dict(view)))
        return
    _print_view(view)


def _view_dict(view: client.JobView) -> dict[str, Any]:
    return {
        **_job_dict(view.job),
        "attempt_list": [
            {
                "fence": a.id,
                "attempt": a.attempt_no,
                "launch_name": a.launch_name,
                "state": a.state,
                "started_at": _iso(a.started_at),
                "finished_at": _iso(a.finished_at),
                "exit_code": a.exit_code,
                "reason": a.reason,
                "last_seen_at": _iso(a.last_seen_at),
                "deadline_at": _iso(a.deadline_at),
                "lease_until": _iso(a.lease_until),
                "failure_class": a.failure_class,
                "fingerprint": a.fingerprint,
            }
            for a in view.attempts
        ],
        "events": [
            {
                "at": e.at.isoformat(),
                "entity": e.entity,
                "attempt_id": e.attempt_id,
                "from": e.from_state,
                "to": e.to_state,
                "reason": e.reason,
                "details": e.details,
            }
            for e in view.events
        ],
    }


def _print_view(view: client.JobView) -> None:
    j = view.job
    out.print(
        f"[bold]job {j.id}[/bold]  {j.state}  queue={j.queue} executor={j.executor}"
        f" priority={j.priority}"
        f" attempts={j.attempt_count}/{j.max_attempts} tenant={j.tenant}"
    )
    out.print(f"spec: {json.dumps(j.spec)}")
    if j.idempotency_key:
        out.print(f"idempotency key: {j.idempotency_key}")
    attempts = Table(
        "fence", "attempt", "launch name", "state", "started", "finished", "exit", "class", "reason"
    )
    for a in view.attempts:
        attempts.add_row(
            str(a.id),
            str(a.attempt_no),
            a.launch_name,
            a.state,
            _when(a.started_at),
            _when(a.finished_at),
            "-" if a.exit_code is None else str(a.exit_code),
            a.failure_class or "",
            a.reason or "",
        )
    out.print(attempts)
    events = Table("at", "what", "from", "to", "reason")
    for e in view.events:
        what = e.entity if e.attempt_id is None else f"{e.entity} (fence {e.attempt_id})"
        events.add_row(_when(e.at), what, e.from_state or "-", e.to_state, e.reason)
    out.print(events)


@jobs.command("explain")
@click.argument("job_id", type=JOB_ID)
@click.pass_obj
def jobs_explain(state: State, job_id: int) -> None:
    """Say in one line why a job is not running now (backoff, not due, ...)."""

    async def go() -> str:
        async with runtime.connect(state.settings()) as c:
            return await c.explain(job_id)

    out.print(f"job {job_id}: {run(go())}", markup=False)


@jobs.command("cancel")
@click.argument("job_id", type=JOB_ID)
@click.pass_obj
def jobs_cancel(state: State, job_id: int) -> None:
    """Cancel a job; a running attempt is stopped (SIGTERM, then SIGKILL after the grace)."""

    async def go() -> model.Attempt | None:
        async with runtime.connect(state.settings()) as c:
            return await c.cancel(job_id)

    attempt = run(go())
    stopped = f"; stopped attempt {attempt.launch_name}" if attempt else ""
    out.print(f"job {job_id} cancelled{stopped}")


# --- lint ----------------------------------------------------------------------------------------


@main.command("lint")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.pass_obj
def lint_cmd(state: State, paths: tuple[Path, ...], as_json: bool) -> None:
    """Check Kubernetes manifests for what would hurt corral; exit 1 on findings."""
    settings = config.Settings.load(state.config_file, check_chain=False)
    findings = lint.lint_paths(paths, settings)
    if as_json:
        out.print_json(json.dumps([f.as_dict() for f in findings]))
    else:
        for finding in findings:
            out.print(str(finding), markup=False, highlight=False, soft_wrap=True)
        err.print(f"{len(findings)} finding{'s' * (len(findings) != 1)}")
    if findings:
        raise SystemExit(EXIT_FAILED)


# --- dead (quarantined jobs) ---------------------------------------------------------------------


@main.group()
def dead() -> None:
    """Quarantined jobs (poison pills): look at them, retry after a fix, or discard."""


@dead.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def dead_list(state: State, limit: int, as_json: bool) -> None:
    """List quarantined jobs with their last failure."""

    async def go() -> list[client.JobView]:
        async with runtime.connect(state.settings()) as c:
            return await c.dead(limit=limit)

    views = run(go())
    if as_json:
        out.print_json(json.dumps([_view_dict(v) for v in views]))
        return
    table = Table("id", "queue", "attempts", "last failure", "since")
    table.add_column("class", no_wrap=True)
    table.add_column("fingerprint", no_wrap=True)
    for v in views:
        last = v.attempts[-1] if v.attempts else None
        table.add_row(
            str(v.job.id),
            v.job.queue,
            f"{v.job.attempt_count}/{v.job.max_attempts}",
            (last.reason or "") if last else "",
            _when(v.job.updated_at),
            (last.failure_class or "") if last else "",
            (last.fingerprint or "") if last else "",
        )
    out.print(table)
    err.print(
        f"{len(views)} quarantined job{'s' * (len(views) != 1)}; after a fix"
        " `corral dead retry ID`, to give up `corral dead discard ID`"
        if views
        else "no quarantined jobs"
    )


@dead.command("retry")
@click.argument("job_id", type=JOB_ID)
@click.pass_obj
def dead_retry(state: State, job_id: int) -> None:
    """Send a quarantined job back to the queue for a new attempt (after a fix)."""

    async def go() -> None:
        async with runtime.connect(state.settings()) as c:
            await c.dead_retry(job_id)

    run(go())
    out.print(f"job {job_id} queued again")


@dead.command("discard")
@click.argument("job_id", type=JOB_ID)
@click.pass_obj
def dead_discard(state: State, job_id: int) -> None:
    """Give up on a quarantined job (it ends cancelled; its run log stays)."""

    async def go() -> None:
        async with runtime.connect(state.settings()) as c:
            await c.dead_discard(job_id)

    run(go())
    out.print(f"job {job_id} discarded")


# --- inside a job --------------------------------------------------------------------------------


@main.command("heartbeat")
@click.pass_obj
def heartbeat_cmd(state: State) -> None:
    """Inside a job: tell corral this attempt is alive (reads CORRAL_JOB_ID, CORRAL_FENCE).

    Exits 3 when a newer attempt has replaced this one: the job should stop."""
    settings = config.Settings.load(state.config_file, check_chain=False)
    lease = worker.heartbeat(worker.current_attempt(), settings)
    if lease is not None:
        out.print(f"lease renewed until {lease.isoformat()}")


def entrypoint() -> None:
    """Run the CLI, mapping corral's errors to one line and an exit code."""
    try:
        code = main.main(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(EXIT_FAILED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (errors.ConfigError, errors.InvalidInput) as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(EXIT_USAGE)
    except errors.StaleFence as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(EXIT_STALE)
    except errors.CorralError as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
