"""Jobs: submit, read, list, cancel and run again; and the quarantine's retry and discard.

Everything a user sends is checked at the edge (client.checks) before anything is
written: a refused job raises InvalidInput naming the field and the rule, and leaves no
trace.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from corral import errors, launching, model, python_tasks, quotas, scheduling
from corral.client import checks, service
from corral.policy import JobPolicy
from corral.store import job_lists

log = logging.getLogger("corral.client")


@dataclass(frozen=True, slots=True)
class JobView:
    """A job with its attempts and its run log."""

    job: model.Job
    attempts: list[model.Attempt]
    events: list[model.Event]
    logs: Mapping[int, launching.RunLog] = dataclasses.field(default_factory=dict)  # by fence


class JobArgs(TypedDict, total=False):
    """A job as `Client.submit` takes it, and as a line of `corral submit --from-file`
    gives it (as JSON: client.arguments.submit_arguments). Left out, a field takes the default
    below."""

    spec: Mapping[str, Any]  # the executor's spec, e.g. {"command": [...]}; or a task (below)
    executor: str  # "process"
    payload: Any  # None
    queue: str  # "default"
    pool: str | None  # None: no pool
    tenant: str  # "default"
    priority: int  # 0; higher runs first
    max_attempts: int | None  # None: settings.default_max_attempts
    idempotency_key: str | None  # None
    labels: Mapping[str, str] | None  # none
    run_at: datetime | None  # None: now
    policy: Mapping[str, Any] | JobPolicy | None  # None: the settings' policy
    code_version: str | None  # None
    flow: str | None  # None: no flow; else the name of one of the tenant's flows
    task: Any  # a Python task's name (or corral.worker Task), instead of spec and executor
    task_version: int | None  # its payload's version; None: the newest a live worker writes
    callback: str | None  # None; a URL sent the job's result when it succeeds (callbacks.md)
    failure_callback: str | None  # None; sent the result when it fails or is quarantined


SUBMIT_FIELDS = tuple(JobArgs.__annotations__)
"""The arguments of `Client.submit`, which a job given as JSON has as its keys."""
RERUN_OF = "rerun-of"
"""The label of a job `rerun` made: the id of the job it runs again."""
JobPage = job_lists.Page
"""A page of the job list: its jobs, the last run of each, and the id to read on from."""
LastRun = job_lists.LastRun
"""What the job list shows of a job's last attempt."""
URL_SEARCH_CHARS = 200
"""The longest text the job list's URL search takes."""
_URL_WORD = re.compile(r"[^\W_]{3}")
"""Three letters or digits in a row: the least a URL search needs, for its index
(trigrams) to find the jobs it matches rather than read every one."""


def check_filter(given: model.JobFilter) -> None:
    """InvalidInput naming the field of a job list's filter that is wrong: a state that is
    not one, a URL search without three letters or digits in a row, too long, or with a
    control character."""
    for state in given.states:
        if state not in model.JobState.__members__.values():
            raise errors.InvalidInput(
                f"state: {state!r} is not a job state; use one of {', '.join(model.JobState)}"
            )
    url = given.url
    if url is None:
        return
    if not _URL_WORD.search(url):
        raise errors.InvalidInput(
            f"url: {url!r} is too short to look for: give at least three letters or digits"
            " in a row (a part of a host's or a path's name)"
        )
    if len(url) > URL_SEARCH_CHARS:
        raise errors.InvalidInput(f"url: at most {URL_SEARCH_CHARS} characters to look for")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise errors.InvalidInput("url: a control character is in no URL")


class Jobs(service.Service):
    """Submit, read, list, cancel and run jobs again."""

    async def submit(self, **args: Unpack[JobArgs]) -> tuple[int, bool]:
        """Store a job (its arguments and their defaults: JobArgs); returns (job id,
        created). A repeated idempotency key returns the existing job with created=False.

        `policy` is the job's own retry, limit and failure policy (JobPolicy), e.g.
        `{"limits": {"attempt_deadline": "30s"}, "failure_rules": [{"on_exit_codes":
        {"operator": "In", "values": [3]}, "action": "fail"}]}`."""
        job = self.validate(await self.task_checked(self.new_job(**args)))
        [(job_id, created)] = await self.store.jobs.submit(
            new=[job], now=self.clock.now(), since=self.since()
        )
        return job_id, created

    async def submit_many(
        self,
        jobs: Sequence[model.NewJob],
        *,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
        limited: bool = False,
    ) -> list[tuple[int, bool]]:
        """Store jobs checked already (`validate`), `batch` to a transaction, in order;
        (job id, created) for each. A repeated idempotency key returns the existing job,
        so running the same jobs again after a failure half-way creates nothing twice.
        `progress` is told how many were stored after each batch. `limited`: a tenant's
        submit (the dashboard's), held to its quotas (`limits`)."""
        stored: list[tuple[int, bool]] = []
        for start in range(0, len(jobs), batch):
            chunk = list(jobs[start : start + batch])
            stored += await self.store.jobs.submit(
                new=chunk,
                now=self.clock.now(),
                since=self.since(),
                limits=self.limits(chunk) if limited else None,
            )
            if progress is not None:
                progress(len(chunk))
        return stored

    async def submit_audited(
        self,
        new: Sequence[model.NewJob],
        *,
        audit: Callable[[list[tuple[int, bool]]], Iterable[Mapping[str, Any]]],
        limited: bool = False,
    ) -> list[tuple[int, bool]]:
        """Store jobs checked already (`validate`) in one transaction, with the audit rows
        `audit` makes of what was stored (audit_add's fields, and `at`); (job id, created)
        for each. `limited`: a tenant's submit (the API's), held to its tenants' quotas,
        all or nothing: QuotaExceeded (403) or RateLimited (429) stores none of them."""
        return await self.store.jobs.submit(
            new=new,
            now=self.clock.now(),
            audit=audit,
            since=self.since(),
            limits=self.limits(new) if limited else None,
        )

    def limits(self, jobs: Sequence[model.NewJob]) -> dict[str, quotas.Limits]:
        """The quotas of the tenants of `jobs`, as the settings give them."""
        return {j.tenant: quotas.limits(self.settings.tenants, j.tenant) for j in jobs}

    async def quota_warnings(self, tenants: Iterable[str], *, schedules: bool = False) -> list[str]:
        """What the operator is told after its write for `tenants`: each quota its write
        could take a tenant past (max_queued; with `schedules`, max_schedules) that the
        tenant is past now. The operator is held to none, so its write stands."""
        named = sorted(set(tenants))
        of = {t: quotas.limits(self.settings.tenants, t) for t in named}
        if schedules:
            counts = {t: await self.store.quotas.schedules(tenant=t) for t in named}
            return [w for t in named for w in quotas.warnings(of[t], schedules=counts[t])]
        waiting = await self.store.quotas.waiting(tenants=named)
        return [w for t in named for w in quotas.warnings(of[t], waiting=waiting.get(t, 0))]

    def new_job(self, **args: Unpack[JobArgs]) -> model.NewJob:
        """The job `submit` would store for these arguments, not checked yet (`validate`).
        TypeError for a keyword it does not take, as for any function."""
        if unknown := sorted(set(args) - set(SUBMIT_FIELDS)):
            raise TypeError(f"submit() got an unexpected keyword argument {unknown[0]!r}")
        policy = args.get("policy")
        stored_policy = policy.stored() if isinstance(policy, JobPolicy) else dict(policy or {})
        executor, spec, payload = _what_runs(args, stored_policy)
        max_attempts = args.get("max_attempts")
        return model.NewJob(
            executor=executor,
            spec=spec,
            payload=payload,
            queue=args.get("queue", "default"),
            pool=args.get("pool"),
            tenant=args.get("tenant", "default"),
            priority=args.get("priority", 0),
            max_attempts=self.settings.default_max_attempts
            if max_attempts is None
            else max_attempts,
            idempotency_key=args.get("idempotency_key"),
            labels=dict(args.get("labels") or {}),
            run_at=args.get("run_at"),
            policy=stored_policy,
            code_version=args.get("code_version"),
            callback=args.get("callback"),
            failure_callback=args.get("failure_callback"),
            flow=args.get("flow"),
        )

    def validate(self, job: model.NewJob) -> model.NewJob:
        """The job as it will be stored, or InvalidInput naming the first field that is wrong.
        A Python task's job is checked against its workers' schemas by `task_checked`
        first (it settles the payload version)."""
        return checks.check_job(job, executors=self.checkers, settings=self.settings)

    async def task_checked(self, job: model.NewJob) -> model.NewJob:
        """A Python task's job with its payload version settled (none given: the newest a
        live worker writes) and its data checked against that version's schema, as live
        workers registered it (else as any worker last did). A version no worker has ever
        registered is taken as it is: the job parks until one that reads it registers.
        InvalidInput names the field and the rule. Any other job is returned as it is."""
        if job.executor != python_tasks.PYTHON:
            return job
        task, version = python_tasks.task_of(job.spec)
        schemas, newest = await self.store.workers.task_schemas(task=task, since=self.since())
        if version == 0:
            if newest is None:
                raise errors.InvalidInput(
                    f"task: no live worker has registered task {task!r}, so its newest payload"
                    " version is not known; give task_version (--task-version) to submit it"
                    " anyway (it parks until a worker that reads it registers)"
                )
            version = newest
        schema = schemas.get(version)
        if schema is None:
            schema = await self.store.workers.known_schema(task=task, version=version)
        data = job.payload.get("data") if isinstance(job.payload, Mapping) else None
        if schema is not None and (problem := checks.schema_problem(schema, data)):
            raise errors.InvalidInput(
                f"payload.data{problem} (task {task} version {version}'s schema, as its"
                " workers registered it)"
            )
        return dataclasses.replace(
            job,
            spec={"task": task, "version": version},
            payload=python_tasks.envelope(task, version, data),
        )

    async def job(self, job_id: int) -> JobView:
        """A job with its attempts and events; NotFound if there is none."""
        return JobView(*await self.store.jobs.record(job_id=job_id))

    async def jobs(
        self, given: model.JobFilter, *, before: int | None = None, limit: int = 100
    ) -> list[model.Job]:
        """The newest jobs `given` matches (with ids below `before`); InvalidInput names
        what is wrong with the filter (check_filter)."""
        check_filter(given)
        return await self.store.jobs.list(given, limit=limit, before=before)

    async def job_page(
        self, given: model.JobFilter, *, before: int | None = None, limit: int = 100
    ) -> JobPage:
        """A page of the job list: the newest jobs `given` matches (with ids below
        `before`), the last run of each (its HTTP status, exit code and response time),
        and the id to read on from (None: no more). A URL search lists a job only by what
        its URL shows, secrets redacted, so its page may be short of `limit` with more to
        read. InvalidInput names what is wrong with the filter (check_filter)."""
        check_filter(given)
        return await self.store.jobs.page(given, limit=limit, before=before)

    async def job_row(self, job_id: int) -> model.Job:
        """A job alone, without its attempts and run log (NotFound if there is none)."""
        return await self.store.jobs.get(job_id=job_id)

    async def jobs_by_id(self, job_ids: Sequence[int]) -> list[model.Job]:
        """The jobs of `job_ids` that exist."""
        return await self.store.jobs.get_many(job_ids=job_ids)

    async def dead(self, *, limit: int = 100) -> list[JobView]:
        """Quarantined jobs, newest first, each with its attempts and run log."""
        found = await self.store.jobs.list(
            model.JobFilter(states=[model.JobState.QUARANTINED]), limit=limit
        )
        return [await self.job(j.id) for j in found]

    async def dead_retry(self, job_id: int, *, reason: str = "retried by a person") -> None:
        """Send a quarantined job back to the queue for one more attempt (after a fix)."""
        await self.store.jobs.unquarantine(
            job_id=job_id, to=model.JobState.QUEUED, now=self.clock.now(), reason=reason
        )

    async def dead_discard(self, job_id: int, *, reason: str = "discarded by a person") -> None:
        """Give up on a quarantined job: it ends cancelled."""
        await self.store.jobs.unquarantine(
            job_id=job_id, to=model.JobState.CANCELLED, now=self.clock.now(), reason=reason
        )

    async def cancel(
        self, job_id: int, *, reason: str = "cancelled by request"
    ) -> model.Attempt | None:
        """Cancel a job; if an attempt was active, stop it on its platform too."""
        attempt = await self.store.jobs.cancel(job_id=job_id, now=self.clock.now(), reason=reason)
        if attempt is not None and attempt.executor in self.executors:
            try:
                await self.executors[attempt.executor].cancel(
                    attempt.launch_name, self.settings.timeouts.cancel_grace
                )
            except errors.ExecutorError as exc:
                log.warning(
                    "job %d: %s could not be stopped now (%s); it is cancelled in the store,"
                    " so its result will be ignored: stop it on its platform by hand",
                    job_id,
                    attempt.launch_name,
                    exc,
                )
        return attempt

    async def rerun(self, job_id: int, *, tenant_made: bool = False, limited: bool = False) -> int:
        """A failed or cancelled job again, as a new job (the same spec, payload and
        options) labelled with the old one's id: the new job's id. It is a tenant's when
        the old one was, or `tenant_made` (asked for through the API); `limited`, a
        tenant's submit, held to its quotas."""
        old = await self.store.jobs.get(job_id=job_id)
        if old.state not in (model.JobState.FAILED, model.JobState.CANCELLED):
            raise errors.InvalidInput(
                f"job {job_id} is {old.state}: only a failed or cancelled job is run again"
                " (a quarantined one: `corral dead retry`)"
            )
        new = dataclasses.replace(
            scheduling.job_from_template({f: getattr(old, f) for f in scheduling.TEMPLATE_FIELDS}),
            labels={**old.labels, RERUN_OF: str(job_id)},
            tenant_made=old.tenant_made or tenant_made,
        )
        [(made, _)] = await self.store.jobs.submit(
            new=[self.validate(new)],
            now=self.clock.now(),
            limits=self.limits([new]) if limited else None,
        )
        return made


def _what_runs(args: JobArgs, policy: dict[str, Any]) -> tuple[str, Mapping[str, Any], Any]:
    """A job's (executor, spec, payload): of its task, or as given. A task's job promises
    heartbeats in `policy`, since a worker renews its attempts' leases and recovery knows
    a dead one by its silence."""
    if args.get("task") is not None:
        if "spec" in args or "executor" in args:
            raise errors.InvalidInput("task: give a task, or a spec and an executor; not both")
        executor, spec, payload = _task_job(
            args["task"], args.get("task_version"), args.get("payload")
        )
        policy["heartbeat"] = True
        return executor, spec, payload
    if "spec" not in args:
        raise TypeError("submit() missing the required keyword argument 'spec' (or 'task')")
    return args.get("executor", "process"), args["spec"], args.get("payload")


def _task_job(task: Any, version: int | None, data: Any) -> tuple[str, dict[str, Any], Any]:
    """A Python task's (executor, spec, payload): `task` a name, or a corral.worker Task,
    whose own model checks `data` and gives its version (the newest its submitter knows).
    A version left None is 0 here, settled by `Client.task_checked`."""
    if not isinstance(task, str):
        if version is not None and version != task.version:
            raise errors.InvalidInput(
                f"task_version: {version}: task {task.name} here writes version {task.version}"
            )
        payload = task.payload(data)
        return python_tasks.PYTHON, task.spec(), payload
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or version < 1
    ):
        raise errors.InvalidInput(f"task_version: {version!r} must be a whole number, at least 1")
    v = version or 0
    return python_tasks.PYTHON, {"task": task, "version": v}, python_tasks.envelope(task, v, data)
