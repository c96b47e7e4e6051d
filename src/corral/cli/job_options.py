"""The options that say what a job is (`corral submit`'s, and the job of each firing of
`corral schedules add` and `update`), read once from click's parameters into one typed
value, JobOptions, which gives `Client.submit`'s arguments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import IO, Any, ClassVar, Protocol, Self

import click

from corral import errors
from corral.cli import job_fields
from corral.executors import registry


def _executor_help() -> str:
    return "Where it runs: " + ", ".join(registry.known()) + " (enabled in executors.enabled)."


JOB_OPTIONS = [
    click.option("--queue", default="default", show_default=True),
    click.option("--pool", default=None, help="A pool from [pools]: caps how many run at once."),
    click.option(
        "--flow", default=None, help="A flow of its tenant (`corral flows`): how fast it starts."
    ),
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
    click.option(
        "--expect-body",
        default=None,
        metavar="REGEX",
        help="The --http response's body must contain a match of REGEX (RE2 syntax).",
    ),
    click.option(
        "--expect-json",
        multiple=True,
        metavar="'PATH OP VALUE'",
        help="The --http response's body, as JSON, must say so, e.g. '$.ok == true' (OP: =="
        " != < <= > >= exists; repeatable).",
    ),
    click.option(
        "--max-response-time",
        default=None,
        metavar="DURATION",
        help="The --http response must have come within it, e.g. 2s.",
    ),
    click.option(
        "--callback",
        default=None,
        metavar="URL",
        help="POST the job's result (JSON) here when it succeeds; '' removes it (update).",
    ),
    click.option(
        "--failure-callback",
        default=None,
        metavar="URL",
        help="POST the job's result here when it fails or is quarantined; '' removes it.",
    ),
]
"""The options that say what a job is: `corral submit`'s, and each firing's job of
`corral schedules add`."""


def job_options(fn: Any) -> Any:
    """Add JOB_OPTIONS to a command."""
    for option in reversed(JOB_OPTIONS):
        fn = option(fn)
    return fn


@dataclass(frozen=True, slots=True)
class JobOptions:
    """JOB_OPTIONS' values, each field named as its option's parameter."""

    queue: str = "default"
    pool: str | None = None
    flow: str | None = None
    priority: int = 0
    tenant: str = "default"
    code_version: str | None = None
    max_attempts: int | None = None
    label_pairs: tuple[str, ...] = ()
    executor: str = "process"
    task: str | None = None
    task_version: int | None = None
    spec_json: str | None = None
    payload_json: str | None = None
    payload_file: IO[str] | None = None
    policy_json: str | None = None
    deadline: str | None = None
    heartbeat: bool = False
    on_unknown: str | None = None
    sla: str | None = None
    image: str | None = None
    placement: str | None = None
    http_request: tuple[str, str] | None = None
    header_lines: tuple[str, ...] = ()
    data: str | None = None
    json_body: str | None = None
    expect: str | None = None
    expect_body: str | None = None
    expect_json: tuple[str, ...] = ()
    max_response_time: str | None = None
    callback: str | None = None
    failure_callback: str | None = None

    @classmethod
    def take(cls, params: dict[str, Any]) -> Self:
        """The job options of a command's `params`, taken out of them."""
        return cls(**{f.name: params.pop(f.name) for f in dataclasses.fields(cls)})

    def arguments(self, command: tuple[str, ...]) -> dict[str, Any]:
        """These options (and the command after --) as `Client.submit`'s arguments."""
        policy = job_fields.policy_from(
            self.policy_json,
            deadline=self.deadline,
            heartbeat=self.heartbeat,
            on_unknown=self.on_unknown,
            sla=self.sla,
        )
        if self.task_version is not None and self.task is None:
            raise errors.InvalidInput("--task-version: only with --task NAME")
        if self.task is not None:
            self._alone_with_task(command)
            what: dict[str, Any] = {"task": self.task, "task_version": self.task_version}
        else:
            executor, spec = self._spec(command)
            what = {"spec": spec, "executor": executor}
        return {
            **what,
            "labels": job_fields.labels_from(self.label_pairs),
            "payload": job_fields.payload_from(self.payload_json, self.payload_file),
            "policy": policy,
            "queue": self.queue,
            "pool": self.pool,
            "flow": self.flow,
            "priority": self.priority,
            "tenant": self.tenant,
            "code_version": self.code_version,
            "max_attempts": self.max_attempts,
            "callback": self.callback or None,
            "failure_callback": self.failure_callback or None,
        }

    def _alone_with_task(self, command: tuple[str, ...]) -> None:
        """InvalidInput for what says what runs beside --task, which says it all."""
        beside = [
            name
            for name, value in (
                ("a command", command),
                ("--spec", self.spec_json),
                ("--http", self.http_request),
                ("--image", self.image),
                ("--placement", self.placement),
            )
            if value
        ]
        if beside or self.executor != "process":
            raise errors.InvalidInput(
                f"--task is the whole job: give no {(beside or ['--executor'])[0]} with it"
            )

    def _spec(self, command: tuple[str, ...]) -> tuple[str, Any]:
        """The executor and its spec: of --http and its options, else of --spec or the
        command."""
        given = [
            option
            for option, value in (
                ("--header", self.header_lines or None),
                ("--data", self.data),
                ("--json-body", self.json_body),
                ("--expect", self.expect),
                ("--expect-body", self.expect_body),
                ("--expect-json", self.expect_json or None),
                ("--max-response-time", self.max_response_time),
            )
            if value is not None
        ]
        if self.http_request is not None:
            return "http", self._http_spec(command)
        if given:
            raise errors.InvalidInput(f"{', '.join(given)}: only with --http METHOD URL")
        spec = job_fields.spec_from(
            self.executor, command, self.spec_json, image=self.image, placement=self.placement
        )
        return self.executor, spec

    def _http_spec(self, command: tuple[str, ...]) -> dict[str, Any]:
        """The `http` spec of --http and its options, alone: no other says what runs."""
        assert self.http_request is not None
        if command or self.spec_json is not None or self.image or self.placement:
            raise errors.InvalidInput(
                "--http is the whole job: give no command, --spec, --image or --placement with it"
            )
        if self.executor not in ("process", "http"):  # process: the default, untouched
            raise errors.InvalidInput(f"--http runs on --executor http, not {self.executor}")
        method, url = self.http_request
        return job_fields.http_spec(
            method,
            url,
            headers=self.header_lines,
            data=self.data,
            json_body=self.json_body,
            expect=self.expect,
            assertions={
                "expect_body": self.expect_body,
                "expect_json": list(self.expect_json) or None,
                "max_response_time": self.max_response_time,
            },
        )


class _Taken(Protocol):
    """A typed value a command's function takes in place of some of its parameters."""

    @classmethod
    def take(cls, params: dict[str, Any]) -> Any: ...


class JobCommand(click.Command):
    """A command whose function takes its job options as one JobOptions, `job` (and, for
    each name of `takes` besides, that value in place of the parameters it reads)."""

    takes: ClassVar[dict[str, type[_Taken]]] = {"job": JobOptions}

    def invoke(self, ctx: click.Context) -> Any:
        params = dict(ctx.params)  # ctx.params stay whole: which were given, in what order
        for name, kind in self.takes.items():
            params[name] = kind.take(params)
        assert self.callback is not None
        return ctx.invoke(self.callback, **params)
