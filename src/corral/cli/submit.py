"""`corral submit`: a job from the command line, checked at the edge like any other, or
the platform object its first attempt would create (`--dry-run`), or many jobs from a
file of JSON lines (`--from-file`), every line checked before any is stored."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import click

from corral import durations, errors, model
from corral.cli.common import (
    State,
    collect_from_here,
    config_option,
    err,
    out,
    parse_json,
    print_json,
    run,
)
from corral.executors import registry


def labels_from(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"--label {pair!r}: use KEY=VALUE")
        model.check_label(key, value)
        labels[key] = value
    return labels


def policy_from(
    text: str | None,
    *,
    deadline: str | None,
    heartbeat: bool,
    on_unknown: str | None,
    sla: str | None = None,
) -> dict[str, Any]:
    """--policy, with the shortcut options (--deadline, --heartbeat, --on-unknown, --sla)
    added.
    A shortcut that says something else than --policy is refused: neither wins silently."""
    policy = parse_json("--policy", text)
    if text is not None and not isinstance(policy, dict):
        raise errors.InvalidInput(
            f'--policy: must be a JSON object, e.g. \'{{"limits": {{"attempt_deadline":'
            f' "30s"}}}}\', not {text.strip()!r}'
        )
    policy = dict(policy or {})
    if deadline is not None:
        _seconds(deadline, "--deadline")
        limits = policy.get("limits")
        limits = dict(limits) if isinstance(limits, dict) else {}
        given = limits.get("attempt_deadline")
        if given is not None and _seconds(given) != _seconds(deadline, "--deadline"):
            raise errors.InvalidInput(
                f"--deadline {deadline} and --policy limits.attempt_deadline {given} disagree;"
                " give one of them"
            )
        limits["attempt_deadline"] = deadline
        policy["limits"] = limits
    _agree(policy, "heartbeat", True if heartbeat else None, "--heartbeat")
    _agree(policy, "on_unknown", on_unknown, "--on-unknown")
    if sla is not None:
        _seconds(sla, "--sla")
    _agree(policy, "sla", sla, "--sla")
    return policy


def _agree(policy: dict[str, Any], field: str, value: Any, option: str) -> None:
    if value is None:
        return
    if field in policy and policy[field] != value:
        raise errors.InvalidInput(
            f"{option} and --policy {field} {json.dumps(policy[field])} disagree; give one of them"
        )
    policy[field] = value


def _seconds(value: Any, where: str = "--policy limits.attempt_deadline") -> timedelta | None:

    try:
        return durations.parse_duration(value)
    except ValueError as exc:
        if where in ("--deadline", "--sla"):
            raise errors.InvalidInput(f"{where}: {exc}") from None
        return None  # the policy's own check names it


def spec_from(
    executor: str,
    command: tuple[str, ...],
    spec_json: str | None,
    *,
    image: str | None,
    placement: str | None,
) -> Any:
    """The executor spec from --spec (checked by its executor), or from the command."""
    spec = parse_json("--spec", spec_json)
    if spec_json is not None:
        if command or image or placement:
            raise errors.InvalidInput(
                "give either --spec or a command after -- (with --image, --placement), not both"
            )
        return spec
    containers = registry.containers()
    if executor in containers:
        made: dict[str, Any] = {"image": image, "command": list(command)}
        if placement is not None:
            made["placement"] = placement
        return made
    if image or placement:
        raise errors.InvalidInput(
            f"--image and --placement are for --executor {' or '.join(containers)}"
        )
    if not command:
        raise errors.InvalidInput(
            "nothing to run: give the command after --, e.g. corral submit -- echo hi"
        )
    return {"command": list(command)}


def print_dry_run(
    state: State,
    *,
    spec: Any,
    executor: str,
    max_attempts: int | None,
    output: str,
    **fields: Any,
) -> None:
    """Print the platform object the first attempt would create; nothing is stored."""
    import yaml

    from corral import client, clock

    settings = state.settings()
    reg = registry.get(executor) if executor in registry.known() else None
    if reg is None or reg.dry_run is None:
        with_dry_run = [k for k in registry.known() if registry.get(k).dry_run]
        raise errors.InvalidInput(
            f"--dry-run: prints the platform object of --executor {' or '.join(with_dry_run)},"
            f" not of {executor!r}"
        )
    now = clock.SystemClock().now()
    draft = model.NewJob(
        executor=executor,
        spec=spec,
        max_attempts=settings.default_max_attempts if max_attempts is None else max_attempts,
        **fields,
    )
    checker = registry.checker(executor, settings, clock.SystemClock())
    job = client.check_job(draft, executors={executor: checker}, settings=settings)
    doc = reg.dry_run(job, settings, now)
    # Plain writes: a console would wrap long lines, and the output is meant for kubectl.
    text = (
        json.dumps(doc, indent=2) + "\n"
        if output == "json"
        else yaml.safe_dump(doc, sort_keys=False)
    )
    click.echo(text, nl=False)
    err.print("dry run: nothing stored or created; job id and fence read 0 until it is stored")


def _payload(payload_json: str | None, payload_file: Any) -> Any:
    if payload_file is not None:
        if payload_json is not None:
            raise errors.InvalidInput("give either --payload or --payload-file, not both")
        try:
            payload_json = payload_file.read()
        except UnicodeDecodeError as exc:
            raise errors.InvalidInput(f"--payload-file: not UTF-8 text ({exc.reason})") from None
        return parse_json("--payload-file", payload_json)
    return parse_json("--payload", payload_json)


def http_spec(
    method: str,
    url: str,
    *,
    headers: tuple[str, ...],
    data: str | None,
    json_body: str | None,
    expect: str | None,
) -> dict[str, Any]:
    """The `http` spec of --http and its options (the executor checks it at submit)."""
    spec: dict[str, Any] = {"method": method, "url": url}
    if headers:
        spec["headers"] = {}
        for name, value in map(_header, headers):
            if name.lower() in (given.lower() for given in spec["headers"]):
                raise errors.InvalidInput(f"--header {name}: given twice; give each header once")
            spec["headers"][name] = value
    if data is not None and json_body is not None:
        raise errors.InvalidInput("--data and --json-body: give one body, not both")
    if data is not None:
        spec["body"] = _read_data(data)
    if json_body is not None:
        spec["json"] = parse_json("--json-body", json_body)
    if expect is not None:
        spec["expect"] = expect
    return spec


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon or not name.strip():
        raise errors.InvalidInput(f"--header {line!r}: write it as 'Name: value'")
    return name.strip(), value.strip()


def _read_data(data: str) -> str:
    if not data.startswith("@"):
        return data
    try:
        with open(data[1:], encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.InvalidInput(f"--data {data}: cannot read it ({exc})") from None


def _executor_help() -> str:
    return "Where it runs: " + ", ".join(registry.known()) + " (enabled in executors.enabled)."


JOB_OPTIONS = [
    click.option("--queue", default="default", show_default=True),
    click.option("--pool", default=None, help="A pool from [pools]: caps how many run at once."),
    click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first."),
    click.option("--tenant", default="default", show_default=True),
    click.option(
        "--code-version",
        default=None,
        help="What the job's code is (a git sha, an image tag): CORRAL_CODE_VERSION in each"
        " attempt, stamped by the fenced sinks on what it writes.",
    ),
    click.option(
        "--max-attempts",
        type=int,
        default=None,
        help="Attempts before the job fails (default from settings).",
    ),
    click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE"),
    click.option("--executor", default="process", show_default=True, help=_executor_help()),
    click.option(
        "--task",
        default=None,
        metavar="NAME",
        help="A Python task (run by `corral worker`) instead of a command: its --payload is"
        " checked against the schema its live workers registered.",
    ),
    click.option(
        "--task-version",
        type=click.IntRange(1),
        default=None,
        help="The --task payload's version (default: the newest a live worker writes); one no"
        " live worker reads parks until one registers.",
    ),
    click.option(
        "--spec", "spec_json", default=None, help="Executor spec as JSON (instead of a command)."
    ),
    click.option("--payload", "payload_json", default=None, help="Payload as JSON."),
    click.option(
        "--payload-file",
        type=click.File("r"),
        default=None,
        help="Payload as JSON from a file (- for stdin).",
    ),
    click.option(
        "--policy",
        "policy_json",
        default=None,
        help='The job\'s own policy as a JSON object, e.g. \'{"failure_rules": [{"on_exit_codes":'
        ' {"operator": "In", "values": [3]}, "action": "fail"}]}\'.',
    ),
    click.option(
        "--deadline",
        default=None,
        help="Tighten the attempt deadline, e.g. 30s or 5m; the inner limits shrink with it.",
    ),
    click.option(
        "--heartbeat",
        is_flag=True,
        help="The job sends heartbeats (`corral heartbeat`); silence past its lease is unknown.",
    ),
    click.option(
        "--on-unknown",
        type=click.Choice(["wait", "fence_and_relaunch"]),
        default=None,
        help="What to do when the attempt's state is unknown (default wait).",
    ),
    click.option(
        "--sla",
        default=None,
        metavar="DURATION",
        help="By when the job must have succeeded, e.g. 15m, from its run_at (a schedule's"
        " firings: from each nominal time); past it, rules on sla_missed alert.",
    ),
    click.option("--image", default=None, help="Container image (executor kubernetes or argo)."),
    click.option(
        "--placement", default=None, help="Placement class (executor kubernetes or argo)."
    ),
    click.option(
        "--http",
        "http_request",
        nargs=2,
        metavar="METHOD URL",
        default=None,
        help="An HTTP job (executor http): the request, e.g. --http POST https://example.com/hook.",
    ),
    click.option(
        "--header",
        "header_lines",
        multiple=True,
        metavar="'NAME: VALUE'",
        help="A header of the --http request (repeatable).",
    ),
    click.option(
        "--data", default=None, help="The --http request's body as text, or @FILE to read it."
    ),
    click.option(
        "--json-body",
        default=None,
        help="The --http request's body as JSON (and Content-Type: application/json).",
    ),
    click.option(
        "--expect",
        default=None,
        help="The --http statuses that mean success: 2xx (the default), or e.g. 200,204.",
    ),
]
"""The options that say what a job is: `corral submit`'s, and each firing's job of
`corral schedules add`."""


def job_options(fn: Any) -> Any:
    """Add JOB_OPTIONS to a command."""
    for option in reversed(JOB_OPTIONS):
        fn = option(fn)
    return fn


def job_arguments(
    command: tuple[str, ...],
    *,
    label_pairs: tuple[str, ...],
    spec_json: str | None,
    payload_json: str | None,
    payload_file: Any,
    policy_json: str | None,
    deadline: str | None,
    heartbeat: bool,
    on_unknown: str | None,
    image: str | None,
    placement: str | None,
    sla: str | None = None,
    http_request: tuple[str, str] | None = None,
    header_lines: tuple[str, ...] = (),
    data: str | None = None,
    json_body: str | None = None,
    expect: str | None = None,
    task: str | None = None,
    task_version: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """JOB_OPTIONS' values as `Client.submit`'s arguments."""
    policy = policy_from(
        policy_json, deadline=deadline, heartbeat=heartbeat, on_unknown=on_unknown, sla=sla
    )
    if task_version is not None and task is None:
        raise errors.InvalidInput("--task-version: only with --task NAME")
    if task is not None:
        beside = [
            name
            for name, value in (
                ("a command", command),
                ("--spec", spec_json),
                ("--http", http_request),
                ("--image", image),
                ("--placement", placement),
            )
            if value
        ]
        if beside or options.get("executor", "process") != "process":
            raise errors.InvalidInput(
                f"--task is the whole job: give no {(beside or ['--executor'])[0]} with it"
            )
        options.pop("executor", None)
        return {
            "task": task,
            "task_version": task_version,
            "labels": labels_from(label_pairs),
            "payload": _payload(payload_json, payload_file),
            "policy": policy,
            **options,
        }
    given = [
        option
        for option, value in (
            ("--header", header_lines or None),
            ("--data", data),
            ("--json-body", json_body),
            ("--expect", expect),
        )
        if value is not None
    ]
    if http_request is not None:
        if command or spec_json is not None or image or placement:
            raise errors.InvalidInput(
                "--http is the whole job: give no command, --spec, --image or --placement with it"
            )
        if options["executor"] not in ("process", "http"):  # process: the default, untouched
            raise errors.InvalidInput(f"--http runs on --executor http, not {options['executor']}")
        options["executor"] = "http"
        spec = http_spec(
            *http_request, headers=header_lines, data=data, json_body=json_body, expect=expect
        )
    elif given:
        raise errors.InvalidInput(f"{', '.join(given)}: only with --http METHOD URL")
    else:
        spec = spec_from(options["executor"], command, spec_json, image=image, placement=placement)
    return {
        "spec": spec,
        "labels": labels_from(label_pairs),
        "payload": _payload(payload_json, payload_file),
        "policy": policy,
        **options,
    }


@click.command(context_settings={"allow_interspersed_args": False})
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
    from_file: Any,
    as_json: bool,
    dry_run: bool,
    output: str | None,
    at: str | None,
    delay: str | None,
    allow_past: bool,
    **options: Any,
) -> None:
    """Submit a job: corral submit [OPTIONS] -- CMD [ARGS...]; or many: --from-file PATH"""
    state: State = ctx.obj
    if from_file is not None:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ctx.params
            if name not in ("from_file", "as_json", "command")
            and ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        ]
        if command or given:
            raise errors.InvalidInput(
                f"--from-file: each line says all of its job; give no {(given or ['command'])[0]}"
                " beside it"
            )
        submit_file(state, from_file, as_json=as_json)
        return
    if output is not None and not dry_run:
        raise errors.InvalidInput(
            "-o/--output is the format of --dry-run's object; to print the submitted job"
            " as JSON, use --json"
        )
    if dry_run and as_json:
        raise errors.InvalidInput("--dry-run prints the object itself: use -o json, not --json")
    args = job_arguments(command, **options)
    if dry_run and "task" in args:
        raise errors.InvalidInput(
            "--dry-run prints the platform object a job makes; a --task runs in a worker"
        )
    if dry_run:
        print_dry_run(state, output=output or "yaml", **args)
        return

    async def go() -> tuple[int, bool]:
        async with state.connect(platforms=False) as c:
            run_at = _run_at(at, delay, c.clock.now(), allow_past=allow_past)
            return await c.submit(**args, run_at=run_at)

    job_id, created = run(go())
    if as_json:
        print_json({"id": job_id, "created": created})
        return
    out.print(job_id)
    if not created:
        err.print(
            f"job {job_id} already exists for this idempotency key; nothing new was submitted"
        )


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
        if not allow_past and client.past_by(when, now):
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
            jobs.append((number, client.submit_arguments(given, now=now)))
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(f"line {number}: {exc}") from None
    return jobs


def submit_file(state: State, text: Any, *, as_json: bool) -> None:
    """Check every job of the file, then store them in batches of 1,000, with a progress
    bar; nothing is stored when a line is wrong."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    collect_from_here()  # a file may hold many jobs
    try:
        from corral import clock

        jobs = read_jobs(text, clock.SystemClock().now())  # delay, allow_past: as the API
    except UnicodeDecodeError as exc:
        raise errors.InvalidInput(f"--from-file: not UTF-8 text ({exc.reason})") from None

    async def go() -> list[tuple[int, bool]]:
        async with state.connect(platforms=False) as c:
            checked = []
            for number, args in jobs:
                try:
                    checked.append(c.validate(await c.task_checked(c.new_job(**args))))
                except errors.InvalidInput as exc:
                    raise errors.InvalidInput(f"line {number}: {exc}") from None
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

    stored = run(go())
    created = sum(made for _, made in stored)
    if as_json:
        print_json(
            {
                "jobs": [{"id": job_id, "created": made} for job_id, made in stored],
                "created": created,
                "existing": len(stored) - created,
            }
        )
        return
    click.echo("\n".join(str(job_id) for job_id, _ in stored))
    err.print(
        f"submitted {len(stored)} jobs: {created} new, {len(stored) - created} already there"
        " (same idempotency key)"
    )
