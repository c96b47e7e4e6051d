"""The Python API for submitting, inspecting and cancelling jobs.

Everything a user sends is checked here, at the edge, before anything is written: a
refused job raises InvalidInput naming the field and the rule, and leaves no trace.

    async with corral.connect() as client:
        job_id, created = await client.submit(spec={"command": ["echo", "hello"]})
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from corral import clock, config, errors, loops, model, plain, store
from corral.executors import base, registry
from corral.executors import python as python_executor
from corral.executors.base import Executor

if TYPE_CHECKING:
    from argon2 import PasswordHasher

    from corral import cadence

log = logging.getLogger("corral.client")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_CODE_VERSION = re.compile(r"^[!-~]{1,200}$")
PRIORITY_RANGE = (-1000, 1000)


@dataclass(frozen=True, slots=True)
class JobView:
    """A job with its attempts and its run log."""

    job: model.Job
    attempts: list[model.Attempt]
    events: list[model.Event]
    logs: Mapping[int, model.RunLog] = dataclasses.field(default_factory=dict)  # by fence


@dataclass(frozen=True, slots=True)
class LogPart:
    """A piece of an attempt's output, as `Client.follow` yields it: `text` of `stream`
    (stdout, stderr, request, response), read live from a running process's run folder
    or from the run log the attempt left; an ended attempt that left nothing to read is
    one part with no stream."""

    attempt: model.Attempt
    stream: str
    text: str
    log: model.RunLog | None = None  # the stored run log it comes from, if it does


class _Logs:
    """A job's run logs, read from the store once, when first asked."""

    def __init__(self, db: store.Store, job_id: int) -> None:
        self.db, self.job_id = db, job_id
        self.found: Mapping[int, model.RunLog] | None = None

    async def get(self, fence: int) -> model.RunLog | None:
        if self.found is None:
            self.found = await self.db.runlogs.of_job(job_id=self.job_id)
        return self.found.get(fence)


class _Tail:
    """A running process's stdout and stderr, read as they grow from its run folder (the
    last STREAM_BYTES of each at first); nothing while the folder is not there."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.at: dict[str, int] = {}
        self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in _STREAMS}

    def read(self, *, last: bool = False) -> list[tuple[str, str]]:
        """What each stream gained since the last read; `last`: the command has ended, so
        a character cut at the end is shown as such, not held back."""
        parts = []
        for name in _STREAMS:
            try:
                with (self.run_dir / f"{name}.log").open("rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    at = min(self.at.setdefault(name, max(size - model.STREAM_BYTES, 0)), size)
                    f.seek(at)
                    data = f.read(size - at)
            except OSError:
                continue
            self.at[name] = at + len(data)
            if text := self.decoders[name].decode(data, final=last):
                parts.append((name, text))
        return parts

    async def take(self, *, last: bool = False) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self.read, last=last)

    def close(self) -> None:
        """Nothing to stop: each read opens the files anew."""


class _Follow:
    """A running attempt's output read as it comes from its platform, away from the machine
    it runs on (a Kubernetes pod's log, through the executor's `follow_log`), in a task of
    its own; a follow that breaks leaves the attempt's run log to be read at its end."""

    def __init__(self, follower: base.FollowsLogs, name: str) -> None:
        self.chunks: list[bytes] = []
        self.at = 0  # bytes handed out
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.task = asyncio.create_task(self._read(follower, name))

    async def _read(self, follower: base.FollowsLogs, name: str) -> None:
        try:
            async for chunk in follower.follow_log(name):
                self.chunks.append(chunk)
        except Exception as exc:  # any failure of the platform: the run log is read instead
            log.info("following the output of %s stopped: %r", name, exc)

    async def take(self, *, last: bool = False) -> list[tuple[str, str]]:
        """What came since the last take; `last`: the attempt has ended, so what is still
        on its way is waited for a little (FOLLOW_END_WAIT), and the follow ends."""
        if last:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), FOLLOW_END_WAIT)
            self.close()
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.at += len(data)
        text = self.decoder.decode(data, final=last)
        return [(_FOLLOWED, text)] if text else []

    def close(self) -> None:
        self.task.cancel()


FOLLOW_END_WAIT = 5.0
"""How long, once an attempt has ended, its followed output may take to finish arriving."""
_FOLLOWED = "log"  # a followed platform log is one stream, named as its run log names it
_STREAMS = ("stdout", "stderr")
_GOES_ON = frozenset({model.JobState.SCHEDULED, model.JobState.QUEUED, model.JobState.RUNNING})
"""A job in these states has attempts to come: `follow` waits for them. (A quarantined or
parked one waits for a person or a worker: following stops.)"""


class JobArgs(TypedDict, total=False):
    """A job as `Client.submit` takes it, and as a line of `corral submit --from-file`
    gives it (as JSON: client.submit_arguments). Left out, a field takes the default
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
    policy: Mapping[str, Any] | config.JobPolicy | None  # None: the settings' policy
    code_version: str | None  # None
    task: Any  # a Python task's name (or corral.worker Task), instead of spec and executor
    task_version: int | None  # its payload's version; None: the newest a live worker writes


class Client:
    """Submit and manage jobs against one store."""

    def __init__(
        self,
        *,
        store: store.Store,
        executors: Mapping[str, Executor],
        settings: config.Settings,
        clock: clock.Clock,
        checkers: Mapping[str, registry.SpecChecker] | None = None,
    ) -> None:
        """`executors`, started, cancel runs on their platforms; `checkers` (default: the
        executors) check the specs of jobs to store."""
        self.store = store
        self.executors = executors
        self.settings = settings
        self.clock = clock
        self._attempt_key: str | None = None
        self._tokens: dict[str, tuple[float, model.Token]] = {}  # digest -> (fresh until, token)
        self._sessions: dict[str, tuple[float, model.WebSession]] = {}  # the same, of cookies
        self.checkers = executors if checkers is None else checkers
        self.loops = loops.Service(store, settings, clock)
        """The loops table: this process's pulse, which loops live, work nobody can do."""

    async def submit(self, **args: Unpack[JobArgs]) -> tuple[int, bool]:
        """Store a job (its arguments and their defaults: JobArgs); returns (job id,
        created). A repeated idempotency key returns the existing job with created=False.

        `policy` is the job's own retry, limit and failure policy (config.JobPolicy), e.g.
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
    ) -> list[tuple[int, bool]]:
        """Store jobs checked already (`validate`), `batch` to a transaction, in order;
        (job id, created) for each. A repeated idempotency key returns the existing job,
        so running the same jobs again after a failure half-way creates nothing twice.
        `progress` is told how many were stored after each batch."""
        stored: list[tuple[int, bool]] = []
        for start in range(0, len(jobs), batch):
            chunk = list(jobs[start : start + batch])
            stored += await self.store.jobs.submit(
                new=chunk, now=self.clock.now(), since=self.since()
            )
            if progress is not None:
                progress(len(chunk))
        return stored

    def new_job(self, **args: Unpack[JobArgs]) -> model.NewJob:
        """The job `submit` would store for these arguments, not checked yet (`validate`).
        TypeError for a keyword it does not take, as for any function."""
        if unknown := sorted(set(args) - set(SUBMIT_FIELDS)):
            raise TypeError(f"submit() got an unexpected keyword argument {unknown[0]!r}")
        policy = args.get("policy")
        stored_policy = (
            policy.stored() if isinstance(policy, config.JobPolicy) else dict(policy or {})
        )
        if args.get("task") is not None:
            if "spec" in args or "executor" in args:
                raise errors.InvalidInput("task: give a task, or a spec and an executor; not both")
            executor, task_spec, payload = _task_job(
                args["task"], args.get("task_version"), args.get("payload")
            )
            spec: Mapping[str, Any] = task_spec
            # A worker renews its attempts' leases: recovery knows a dead one by its silence.
            stored_policy["heartbeat"] = True
        elif "spec" not in args:
            raise TypeError("submit() missing the required keyword argument 'spec' (or 'task')")
        else:
            executor, spec = args.get("executor", "process"), args["spec"]
            payload = args.get("payload")
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
        )

    def validate(self, job: model.NewJob) -> model.NewJob:
        """The job as it will be stored, or InvalidInput naming the first field that is wrong.
        A Python task's job is checked against its workers' schemas by `task_checked`
        first (it settles the payload version)."""
        return check_job(job, executors=self.checkers, settings=self.settings)

    def since(self) -> datetime:
        """When a worker last heard of is still live (its lease)."""
        return self.clock.now() - self.settings.timeouts.lease_timeout

    async def task_checked(self, job: model.NewJob) -> model.NewJob:
        """A Python task's job with its payload version settled (none given: the newest a
        live worker writes) and its data checked against that version's schema, as live
        workers registered it (else as any worker last did). A version no worker has ever
        registered is taken as it is: the job parks until one that reads it registers.
        InvalidInput names the field and the rule. Any other job is returned as it is."""
        if job.executor != model.PYTHON:
            return job
        task, version = model.task_of(job.spec)
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
        if schema is not None and (problem := schema_problem(schema, data)):
            raise errors.InvalidInput(
                f"payload.data{problem} (task {task} version {version}'s schema, as its"
                " workers registered it)"
            )
        return dataclasses.replace(
            job,
            spec={"task": task, "version": version},
            payload=model.envelope(task, version, data),
        )

    async def job(self, job_id: int) -> JobView:
        """A job with its attempts and events; NotFound if there is none."""
        return JobView(*await self.store.jobs.record(job_id=job_id))

    async def follow(
        self,
        job_id: int,
        *,
        attempt_no: int | None = None,
        every: float = 0.25,
        once: bool = False,
    ) -> AsyncIterator[LogPart]:
        """A job's output as it comes, until the job has finished, or stopped for a person
        (or attempt `attempt_no` has ended): each ended attempt's run log, and a running
        process's stdout and stderr live from its run folder when this machine has it, or a
        running pod's log through an executor that follows logs (else its run log once it
        ends). `once`: what there is now, without waiting."""
        done: set[int] = set()
        tails: dict[int, _Tail | _Follow] = {}  # running attempts followed live, by fence
        try:
            async for part in self._follow(job_id, attempt_no, every, once, done, tails):
                yield part
        finally:
            for tail in tails.values():
                tail.close()

    async def _follow(
        self,
        job_id: int,
        attempt_no: int | None,
        every: float,
        once: bool,
        done: set[int],
        tails: dict[int, _Tail | _Follow],
    ) -> AsyncIterator[LogPart]:
        while True:
            job = await self.store.jobs.get(job_id=job_id)  # then its attempts: none missed
            attempts = await self.store.attempts.list(job_id=job_id)
            wanted = [a for a in attempts if attempt_no in (None, a.attempt_no)]
            logs = _Logs(self.store, job_id)  # read once an ended attempt needs them
            for a in wanted:
                if a.id not in done:
                    parts, ended = await self._output_now(a, tails, logs)
                    for part in parts:
                        yield part
                    if ended:
                        done.add(a.id)
            over = job.state not in _GOES_ON or (
                attempt_no is not None and bool(wanted) and wanted[0].id in done
            )
            if once or (over and all(a.id in done for a in wanted)):
                return
            await self.clock.sleep(every)

    async def _output_now(
        self, a: model.Attempt, tails: dict[int, _Tail | _Follow], logs: _Logs
    ) -> tuple[list[LogPart], bool]:
        """What attempt `a` has to show now, and whether that is all it will show: a
        running attempt's new output (its run folder, its pod's log), or an ended attempt's run log
        (unless its output was read live here, to its end)."""
        live = a.state in model.ACTIVE_ATTEMPT_STATES
        if a.id not in tails and live and (reader := self._live_output(a)) is not None:
            tails[a.id] = reader
        parts = []
        if (tail := tails.get(a.id)) is not None:
            read = await tail.take(last=not live)
            parts = [LogPart(a, stream, text) for stream, text in read]
            if not live:
                tails.pop(a.id)
        if live or (tail is not None and tail.at):
            return parts, not live
        found = await logs.get(a.id)
        if found is None or not found.streams:  # it ended with nothing to read
            return [*parts, LogPart(a, "", "", found)], True
        return [*parts, *(LogPart(a, s.name, s.text, found) for s in found.streams)], True

    def _live_output(self, a: model.Attempt) -> _Tail | _Follow | None:
        """Where a running attempt's output is read as it comes, if anywhere: a process's
        run folder, or an executor that follows its platform's log."""
        if a.executor == "process":
            return _Tail(self.settings.process_root / a.launch_name)
        follower = self.executors.get(a.executor)
        if isinstance(follower, base.FollowsLogs):
            return _Follow(follower, a.launch_name)
        return None

    async def explain(self, job_id: int) -> str:
        """One line: why the job is not running now (or what it is doing)."""
        view = await self.job(job_id)
        slots = self.settings.pools.get(view.job.pool or "")
        if slots is None or view.job.state != model.JobState.QUEUED:
            return explain(view, self.clock.now())
        running = await self.store.jobs.pool_running(pools=[view.job.pool or ""])
        return explain(view, self.clock.now(), pool=(running.get(view.job.pool or "", 0), slots))

    async def jobs(self, given: model.JobFilter, *, limit: int = 100) -> list[model.Job]:
        """The newest jobs `given` matches; InvalidInput for a state that is not one."""
        for state in given.states:
            if state not in model.JobState.__members__.values():
                raise errors.InvalidInput(
                    f"state: {state!r} is not a job state; use one of {', '.join(model.JobState)}"
                )
        return await self.store.jobs.list(given, limit=limit)

    async def heartbeat(self, job_id: int, fence: int) -> datetime | None:
        """News from inside attempt `fence`: renews its lease (returns the lease's new end, or
        None for a job without one). StaleFence when a newer attempt replaced it: stop."""
        return await self.store.attempts.heartbeat(job_id=job_id, fence=fence, now=self.clock.now())

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

    # --- bulk operations (retry, cancel, discard by filter) --------------------------------

    async def bulk_preview(
        self, action: model.BulkAction, given: model.JobFilter, *, tenant: str | None
    ) -> model.Preview:
        """How many jobs of `tenant` (None: every tenant) `action` would touch now, and the
        newest of their ids; InvalidInput past store.operations.MAX_JOBS."""
        return await self.store.operations.preview(tenant=tenant, action=action, given=given)

    async def bulk_start(
        self,
        action: model.BulkAction,
        given: model.JobFilter,
        *,
        tenant: str | None,
        expect: int | None,
        made_by: str,
        token_id: int | None = None,
    ) -> model.Operation:
        """Start `action` on the snapshot of the jobs the preview counts now; the runner of
        each serve and api process then applies it. Changed (a Conflict, with the new
        count) when that is not `expect` jobs: preview again."""
        return await self.store.operations.create(
            tenant=tenant,
            action=action,
            given=given,
            expect=expect,
            token_id=token_id,
            made_by=made_by,
            now=self.clock.now(),
        )

    async def operation(self, operation_id: int) -> model.Operation:
        """A bulk operation and its progress (NotFound when there is none)."""
        return await self.store.operations.get(operation_id=operation_id)

    async def operations(
        self, *, tenant: str | None, limit: int = 100, before: int | None = None
    ) -> list[model.Operation]:
        """Bulk operations, the newest first: of `tenant`, or of every tenant (None)."""
        return await self.store.operations.list(tenant=tenant, limit=limit, before=before)

    async def operation_skipped(
        self, operation_id: int, *, limit: int = 20
    ) -> list[model.OperationItem]:
        """The first jobs an operation skipped, each with why."""
        return await self.store.operations.items(
            operation_id=operation_id, outcome=model.ItemOutcome.SKIPPED, limit=limit
        )

    async def operation_cancel(self, operation_id: int) -> model.Operation:
        """Stop a bulk operation: the jobs it has not reached yet are left as they are."""
        return await self.store.operations.cancel(operation_id=operation_id, now=self.clock.now())

    # --- API tokens -----------------------------------------------------------------------

    async def first_admin_token(self) -> tuple[model.Token, str] | None:
        """An all-tenant admin token and its secret (shown this once), made only where no
        all-tenant admin token was ever made: what `serve --http` hands a new installation.
        None otherwise (exactly one, however many corrals start at once)."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        made = await self.store.tokens.add_first_admin(
            name="first admin", secret_sha256=token_digest(secret), now=self.clock.now()
        )
        return None if made is None else (made, secret)

    async def token_create(
        self,
        *,
        name: str,
        tenant: str | None,
        role: str,
        expires: timedelta | None = None,
    ) -> tuple[model.Token, str]:
        """Make an API token for `tenant` (None: every tenant) in `role`: the token as
        listed, and its secret, which is shown this once and stored only hashed."""
        if tenant is not None and not _NAME.match(tenant):
            raise errors.InvalidInput(
                f"tenant: {tenant!r} must be 1-200 characters of [A-Za-z0-9_.-],"
                " starting alphanumeric"
            )
        if role not in model.Role.__members__.values():
            raise errors.InvalidInput(
                f"role: {role!r} is not a role; use one of {', '.join(model.Role)}"
            )
        if not name.strip() or len(name) > 200:
            raise errors.InvalidInput("name: must be 1-200 characters")
        if (rule := plain.fault(name)) is not None:
            raise errors.InvalidInput(f"name: {rule}")
        if expires is not None and expires <= timedelta(0):
            raise errors.InvalidInput("expires: must be longer than zero")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self.clock.now()
        made = await self.store.tokens.add(
            name=name,
            tenant=tenant,
            role=model.Role(role),
            secret_sha256=token_digest(secret),
            now=now,
            expires_at=None if expires is None else now + expires,
        )
        return made, secret

    async def token_check(self, secret: str) -> model.Token | None:
        """The token of `secret` if it may be used now (not revoked, not expired). A token
        read from the store is trusted for TOKEN_FRESH_SECONDS: a revoke made by another
        process reaches this one within that; one made through this client, at once."""
        if not secret.startswith(TOKEN_PREFIX):
            return None
        digest, now = token_digest(secret), self.clock.monotonic()
        kept = self._tokens.get(digest)
        if kept is not None and kept[0] > now:
            found: model.Token | None = kept[1]
        else:
            found = await self.store.tokens.find(secret_sha256=digest)
            if found is not None:  # unknown secrets are not kept: guesses fill no memory
                if len(self._tokens) >= TOKENS_KEPT:
                    self._tokens.clear()
                self._tokens[digest] = (now + TOKEN_FRESH_SECONDS, found)
        return found if found is not None and found.valid(self.clock.now()) else None

    async def token_revoke(self, token_id: int) -> model.Token:
        """Revoke token `token_id` (NotFound: there is none); refused here at once, and by
        other API processes within TOKEN_FRESH_SECONDS."""
        done = await self.store.tokens.revoke(token_id=token_id, now=self.clock.now())
        self._tokens.clear()
        self._sessions.clear()  # the sessions signed in with it end with it
        return done

    async def attempt_of(self, token: str) -> tuple[int, int] | None:
        """(job_id, fence) of an attempt token this installation made; None for any other.
        Whether that attempt may still act is for the store to say (`store.attempts.check`)."""
        if not token.startswith(model.ATTEMPT_TOKEN_PREFIX):
            return None
        if self._attempt_key is None:
            self._attempt_key = await attempt_key(self.settings, self.store, self.clock)
        return model.attempt_token_read(self._attempt_key, token)

    # --- dashboard users and sign-ins -------------------------------------------------------

    async def user_add(
        self, name: str, *, password: str, tenant: str | None, role: str
    ) -> model.User:
        """Make a dashboard user for `tenant` (None: every tenant) in `role`; the password is
        kept only as its argon2 hash. Conflict when the name is taken."""
        if not _NAME.match(name or ""):
            raise errors.InvalidInput(
                f"name: {name!r} must be 1-200 characters of [A-Za-z0-9_.-], starting alphanumeric"
            )
        _check_tenant_role(tenant, role)
        if len(password) < PASSWORD_MIN:
            raise errors.InvalidInput(f"password: must be at least {PASSWORD_MIN} characters")
        hashed = await asyncio.to_thread(_password_hasher().hash, password)
        return await self.store.users.add(
            name=name,
            password_hash=hashed,
            tenant=tenant,
            role=model.Role(role),
            now=self.clock.now(),
        )

    async def user_remove(self, name: str) -> model.User:
        """Remove a dashboard user (NotFound: there is none); their sessions end at once
        (in other processes within TOKEN_FRESH_SECONDS)."""
        removed = await self.store.users.remove(name=name, now=self.clock.now())
        self._sessions.clear()
        return removed

    async def users(self) -> list[model.User]:
        return await self.store.users.list()

    async def sign_in(self, name: str, password: str) -> tuple[str, model.WebSession] | None:
        """A new session for the user `name` if `password` is theirs: its secret (for the
        cookie; stored only hashed) and the session; None otherwise. An unknown name costs
        the same hash as a wrong password, so the time taken does not tell names apart."""
        found = await self.store.users.password(name=name)
        stored = found[1] if found is not None else _decoy_hash()
        if not await asyncio.to_thread(_password_matches, stored, password) or found is None:
            return None
        return await self._session_open(user_id=found[0].id, token_id=None)

    async def sign_in_token(self, secret: str) -> tuple[str, model.WebSession] | None:
        """A new session acting as the API token `secret` (while the token stays valid)."""
        token = await self.token_check(secret.strip())
        if token is None:
            return None
        return await self._session_open(user_id=None, token_id=token.id)

    async def _session_open(
        self, *, user_id: int | None, token_id: int | None
    ) -> tuple[str, model.WebSession] | None:
        secret, now = secrets.token_urlsafe(32), self.clock.now()
        await self.store.users.session_add(
            secret_sha256=token_digest(secret),
            user_id=user_id,
            token_id=token_id,
            csrf=secrets.token_urlsafe(32),
            now=now,
            expires_at=now + SESSION_LIFETIME,
        )
        made = await self.session(secret)
        return None if made is None else (secret, made)

    async def session(self, secret: str) -> model.WebSession | None:
        """The valid session of a cookie's secret, or None (unknown, expired, its user
        removed or its token revoked). As a token is, a session read from the store is
        trusted for TOKEN_FRESH_SECONDS: one ended through this client ends at once, one
        ended by another process (`corral users remove`) within that."""
        if not secret:
            return None
        digest, fresh, now = token_digest(secret), self.clock.monotonic(), self.clock.now()
        kept = self._sessions.get(digest)
        if kept is not None and kept[0] > fresh:
            return kept[1] if kept[1].expires_at > now else None
        found = await self.store.users.session_find(secret_sha256=digest, now=now)
        if found is not None:  # unknown secrets are not kept: guesses fill no memory
            if len(self._sessions) >= TOKENS_KEPT:
                self._sessions.clear()
            self._sessions[digest] = (fresh + TOKEN_FRESH_SECONDS, found)
        return found

    async def sign_out(self, secret: str) -> None:
        digest = token_digest(secret)
        self._sessions.pop(digest, None)
        await self.store.users.session_remove(secret_sha256=digest)

    # --- schedules ------------------------------------------------------------------------

    def new_schedule(
        self,
        name: str,
        *,
        cron: str | None = None,
        tz: str = "UTC",
        every: str | None = None,
        start: str | datetime | None = None,
        until: str | datetime | None = None,
        catchup: str = "none",
        catchup_window: str = "7d",
        catchup_max: int = 100,
        overlap: str = "allow",
        jitter: str | None = None,
        tenant_made: bool = False,
        **job: Unpack[JobArgs],
    ) -> tuple[model.NewSchedule, datetime]:
        """The schedule `schedule_create` would store, checked, with its anchor (the
        origin of an interval, and no firing before it); InvalidInput naming the field and
        the rule otherwise. `job` is its job template, as `submit` takes a job.
        `tenant_made`: made by a tenant (the API, the dashboard), its firings check the
        tenant's grant; the operator's are checked by none."""
        from corral import cadence, scheduler

        now = self.clock.now()
        if not _NAME.match(name or ""):
            raise errors.InvalidInput(
                f"name: {name!r} must be 1-200 characters of [A-Za-z0-9_.-], starting alphanumeric"
            )
        if (cron is None) == (every is None):
            raise errors.InvalidInput("give either cron (with tz) or every, not both or neither")
        anchor = _instant(start, "start", tz) if start is not None else now.replace(microsecond=0)
        when: cadence.When = (
            cadence.parse_cron(cron, tz)
            if cron is not None
            else cadence.parse_every(every or "", anchor)
        )
        if every is not None and tz != "UTC":
            cadence.parse_cron("* * * * *", tz)  # the zone is still checked
        end = _instant(until, "until", tz) if until is not None else None
        if end is not None and end <= anchor:
            raise errors.InvalidInput(
                f"until: {model.iso(end)} is not after the start {model.iso(anchor)}"
            )
        if job.get("run_at") is not None or job.get("idempotency_key") is not None:
            raise errors.InvalidInput(
                "run_at and idempotency_key are each firing's own: a schedule's job has neither"
            )
        if job.get("payload") is not None and not isinstance(job.get("payload"), Mapping):
            raise errors.InvalidInput(
                "payload: a schedule's payload must be a JSON object: each firing adds what"
                f" it is for under {model.FIRING!r}"
            )
        template = model.job_template(self.validate(self.new_job(**job)))
        try:
            mode = model.Catchup(catchup)
        except ValueError:
            raise errors.InvalidInput(f"catchup: {catchup!r} must be none or all") from None
        try:
            how = model.Overlap(overlap)
        except ValueError:
            raise errors.InvalidInput(
                f"overlap: {overlap!r} must be allow, forbid or replace"
            ) from None
        if not 1 <= catchup_max <= 10_000:
            raise errors.InvalidInput(f"catchup_max: {catchup_max} must be between 1 and 10000")
        window = cadence.parse_duration(catchup_window, "catchup_window")
        spread = cadence.parse_duration(jitter, "jitter") if jitter is not None else None
        new = model.NewSchedule(
            name=name,
            template=template,
            tenant=template["tenant"],
            cron=when.expr if isinstance(when, cadence.Cron) else None,
            tz=when.tz if isinstance(when, cadence.Cron) else tz,
            every_seconds=when.seconds if isinstance(when, cadence.Every) else None,
            anchor=anchor,
            catchup=mode,
            catchup_window_seconds=window.total_seconds(),
            catchup_max=catchup_max,
            overlap=how,
            jitter_seconds=spread.total_seconds() if spread else 0.0,
            until=end,
            tenant_made=tenant_made,
        )
        scheduler.rule(new, anchor)  # every rule builds
        return new, anchor

    async def schedule_create(self, name: str, **args: Any) -> model.Schedule:
        """Store a schedule (`new_schedule`'s arguments); it fires first at its first
        nominal time after now (or at its start)."""
        from corral import scheduler

        if isinstance(args.get("task"), str):
            # Its jobs run the version the newest live worker writes today (unless it names
            # one), their payload checked against that version's schema as a submit's is.
            draft = self.new_job(
                task=args["task"],
                task_version=args.get("task_version"),
                payload=args.get("payload"),
            )
            args["task_version"] = model.task_of((await self.task_checked(draft)).spec)[1]
        new, anchor = self.new_schedule(name, **args)
        now = self.clock.now()
        first = scheduler.first_due(
            scheduler.rule(new, anchor), now=now, anchor=anchor, until=new.until
        )
        return await self.store.schedules.create(new=new, anchor=anchor, next_due=first, now=now)

    def upcoming(self, found: model.Schedule, count: int = 5) -> list[cadence.Nominal]:
        """A schedule's next `count` nominal times (none while it is paused or over),
        marking those a DST change moved."""
        from corral import cadence, scheduler

        if found.next_due is None or found.paused_at is not None:
            return []
        rule = scheduler.rule(found, found.anchor)
        far = found.next_due + timedelta(days=30 * 366)
        taken: list[cadence.Nominal] = []
        for nominal in cadence.between(rule, found.next_due, far):
            if len(taken) >= count or (found.until is not None and nominal.at >= found.until):
                break
            taken.append(nominal)
        return taken

    async def schedule(self, name: str, *, tenant: str = "default") -> model.Schedule:
        return await self.store.schedules.get(name=name, tenant=tenant)

    async def secret_make(
        self, *, tenant: str = "default", rotate: bool = False
    ) -> tuple[str, model.SigningSecret]:
        """A new signing secret for `tenant`'s HTTP requests (`whsec_` and 32 random bytes in
        base64, the Standard Webhooks form): the secret, shown this once, and its record.
        `rotate`: it replaces the current one, which signs alongside it for
        secrets.rotation_overlap."""
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        made = await self.store.tokens.secret_add(
            tenant=tenant,
            secret=secret,
            now=self.clock.now(),
            overlap=self.settings.secrets.rotation_overlap,
            rotate=rotate,
        )
        return secret, made

    async def signing_secrets(self, *, tenant: str | None = None) -> list[model.SigningSecret]:
        """The signing secrets that still sign (never their values)."""
        return await self.store.tokens.secrets_list(tenant=tenant, now=self.clock.now())

    async def schedules(self, *, tenant: str | None = None) -> list[model.Schedule]:
        return await self.store.schedules.list(tenant=tenant)

    async def schedule_update(
        self, name: str, *, tenant: str = "default", **args: Any
    ) -> model.Schedule:
        """Change a schedule: the arguments given replace its own (the rule, the options,
        any field of the job template); the rest stay. Its next nominal time is computed
        again from now."""
        from corral import scheduler

        old = await self.store.schedules.get(name=name, tenant=tenant)
        given = {**_schedule_args(old), **args}
        if "cron" in args:
            given.pop("every", None)
        if "every" in args:
            given.pop("cron", None)
        new, anchor = self.new_schedule(name, **given)
        if new.tenant != old.tenant:
            raise errors.InvalidInput("tenant: a schedule cannot move to another tenant")
        now = self.clock.now()
        first = scheduler.first_due(
            scheduler.rule(new, anchor),
            now=now,
            anchor=anchor,
            until=new.until,
            recorded=old.last_nominal,
        )
        changes = {
            f.name: getattr(new, f.name)
            for f in dataclasses.fields(new)
            if f.name not in ("name", "tenant")
        }
        return await self.store.schedules.update(
            schedule_id=old.id,
            changes={**changes, "template": dict(new.template)},
            next_due=first,
            now=now,
        )

    async def schedule_delete(self, name: str, *, tenant: str = "default") -> None:
        old = await self.store.schedules.get(name=name, tenant=tenant)
        await self.store.schedules.delete(schedule_id=old.id)

    async def schedule_pause(self, name: str, *, tenant: str = "default") -> model.Schedule:
        old = await self.store.schedules.get(name=name, tenant=tenant)
        return await self.store.schedules.pause(schedule_id=old.id, now=self.clock.now())

    async def schedule_resume(self, name: str, *, tenant: str = "default") -> model.Schedule:
        """Resume a paused schedule: what passed while it was paused is recorded as
        skipped, never fired; it fires next at its first nominal time after now."""
        from corral import scheduler

        old = await self.store.schedules.get(name=name, tenant=tenant)
        if old.paused_at is None:
            return old
        now = self.clock.now()
        skipped, more, first = scheduler.resume_skips(old, now)
        return await self.store.schedules.resume(
            schedule_id=old.id, skipped=skipped, skipped_count=more, next_due=first, now=now
        )

    async def schedule_trigger(self, name: str, *, tenant: str = "default") -> int:
        """Fire a schedule now, outside its times (its next nominal time stays): the job's
        id. Its firing is recorded at this instant."""
        from corral import scheduler

        old = await self.store.schedules.get(name=name, tenant=tenant)
        now = self.clock.now()
        fire = scheduler.firing(
            old, scheduler.rule(old, old.anchor), now, model.FiringOutcome.FIRED
        )
        fire = dataclasses.replace(fire, note="triggered by hand")
        await self.store.schedules.backfill(schedule=old, fires=[fire], now=now)
        [firing] = await self.store.schedules.firings(
            schedule_id=old.id, limit=1, before=now + _TICK
        )
        assert firing.job_id is not None
        return firing.job_id

    async def firings(
        self, name: str, *, tenant: str = "default", limit: int = 20
    ) -> list[model.Firing]:
        old = await self.store.schedules.get(name=name, tenant=tenant)
        return await self.store.schedules.firings(schedule_id=old.id, limit=limit)

    async def backfill(
        self,
        name: str,
        *,
        start: str | datetime,
        end: str | datetime,
        tenant: str = "default",
        pool: str | None = None,
        code_version: str | None = None,
        dry_run: bool = False,
        batch: int = 500,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        """One job per nominal time of the schedule in [start, end), idempotently: running
        it again creates nothing new. Returns (created, there already); with `dry_run`,
        (how many nominal times, 0) and nothing stored."""
        from corral import scheduler

        old = await self.store.schedules.get(name=name, tenant=tenant)
        first = _instant(start, "from", old.tz)
        last = _instant(end, "to", old.tz)
        if last <= first:
            raise errors.InvalidInput(f"to: {model.iso(last)} is not after from {model.iso(first)}")
        overrides: dict[str, Any] = {}
        if pool is not None:
            overrides["pool"] = pool
        if code_version is not None:
            overrides["code_version"] = code_version
        if overrides:  # checked as any job is
            sample = model.job_from_template(old.template, **overrides)
            self.validate(sample)
        fires = scheduler.backfill_fires(old, first, last, **overrides)
        created = there = 0
        chunk: list[model.Fire] = []
        for fire in fires:
            chunk.append(fire)
            if len(chunk) == batch:
                made = (len(chunk), 0) if dry_run else await self._backfill(old, chunk)
                created, there = created + made[0], there + made[1]
                if progress is not None:
                    progress(len(chunk))
                chunk = []
        if chunk:
            made = (len(chunk), 0) if dry_run else await self._backfill(old, chunk)
            created, there = created + made[0], there + made[1]
            if progress is not None:
                progress(len(chunk))
        return created, there

    async def _backfill(self, schedule: model.Schedule, fires: list[model.Fire]) -> tuple[int, int]:
        return await self.store.schedules.backfill(
            schedule=schedule, fires=fires, now=self.clock.now()
        )

    async def rerun(self, job_id: int, *, tenant_made: bool = False) -> int:
        """A failed or cancelled job again, as a new job (the same spec, payload and
        options) labelled with the old one's id: the new job's id. It is a tenant's when
        the old one was, or `tenant_made` (asked for through the API)."""
        old = await self.store.jobs.get(job_id=job_id)
        if old.state not in (model.JobState.FAILED, model.JobState.CANCELLED):
            raise errors.InvalidInput(
                f"job {job_id} is {old.state}: only a failed or cancelled job is run again"
                " (a quarantined one: `corral dead retry`)"
            )
        new = dataclasses.replace(
            model.job_from_template({f: getattr(old, f) for f in model.TEMPLATE_FIELDS}),
            labels={**old.labels, RERUN_OF: str(job_id)},
            tenant_made=old.tenant_made or tenant_made,
        )
        [(made, _)] = await self.store.jobs.submit(new=[self.validate(new)], now=self.clock.now())
        return made


SpecChecker = registry.SpecChecker

_TEXT_OF_A_JOB = (
    "executor", "spec", "payload", "queue", "pool", "tenant", "idempotency_key", "labels",
    "policy", "code_version",
)  # fmt: skip
"""The fields of a job that hold text (each checked by corral.plain)."""

_TEXT_FIELDS = ("executor", "queue", "tenant", "pool", "idempotency_key", "code_version")
_NULLABLE = frozenset(
    {"pool", "idempotency_key", "code_version", "max_attempts", "run_at", "task_version"}
)
SUBMIT_FIELDS = tuple(JobArgs.__annotations__)
RERUN_OF = "rerun-of"
"""The label of a job `rerun` made: the id of the job it runs again."""
_TICK = timedelta(microseconds=1)


def _instant(value: str | datetime, field: str, tz: str) -> datetime:
    from corral import cadence

    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise errors.InvalidInput(f"{field}: must carry a timezone")
        return value.astimezone(UTC)
    return cadence.parse_instant(value, field, tz)


def _schedule_args(schedule: model.Schedule) -> dict[str, Any]:
    """A stored schedule as `new_schedule`'s arguments (what `schedule_update` starts from)."""
    args: dict[str, Any] = {
        "tz": schedule.tz,
        "start": schedule.anchor,
        "until": schedule.until,
        "catchup": schedule.catchup.value,
        "catchup_window": _duration_text(schedule.catchup_window_seconds),
        "catchup_max": schedule.catchup_max,
        "overlap": schedule.overlap.value,
        "jitter": _duration_text(schedule.jitter_seconds) if schedule.jitter_seconds else None,
        "tenant_made": schedule.tenant_made,
        **{k: v for k, v in schedule.template.items() if k in SUBMIT_FIELDS},
    }
    if schedule.cron is not None:
        args["cron"] = schedule.cron
    else:
        args["every"] = _duration_text(schedule.every_seconds or 0)
    return args


def _duration_text(seconds: float) -> str:
    """Whole seconds as cadence.parse_duration reads them back, e.g. 90061 -> 1d1h1m1s."""
    rest, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"


"""The arguments of `Client.submit`, which a job given as JSON has as its keys."""


def _wrong(field: str, value: Any) -> str | None:
    """What is wrong with a job's field given as JSON, or None (the values themselves are
    checked by `check_job`, as for any job)."""
    if field in _TEXT_FIELDS or field == "run_at":
        return None if isinstance(value, str) else "must be a string"
    if field == "task":
        return None if isinstance(value, str) else "must be a string: the task's name"
    if field in ("priority", "max_attempts", "task_version"):
        whole = isinstance(value, int) and not isinstance(value, bool)
        return None if whole else "must be a whole number"
    if field in ("spec", "policy"):
        return None if isinstance(value, dict) else "must be a JSON object"
    if field == "labels":
        strings = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return None if strings else "must be an object of strings"
    return None


ATTEMPT_KEY = "attempts"
"""The service key (store.tokens.service_key) attempt tokens are signed with."""


async def attempt_key(settings: config.Settings, db: store.Store, clk: clock.Clock) -> str:
    """The key of attempt tokens: settings.attempt_key, else the one kept in the store (made
    by the first process that asks), so every dispatcher and API process agrees on it."""
    if settings.attempt_key:
        return settings.attempt_key
    made = secrets.token_urlsafe(48)
    return await db.tokens.service_key(name=ATTEMPT_KEY, secret=made, now=clk.now())


TOKEN_FRESH_SECONDS = 5.0
"""How long an API process trusts a token it has read from the store (one read a token
every five seconds, not one a request)."""
TOKENS_KEPT = 10_000
"""Most tokens an API process keeps read at once."""
TOKEN_PREFIX = "corral_"
"""How an API token's secret starts (secret scanners can look for it)."""


PASSWORD_MIN = 8
"""The fewest characters a dashboard user's password may have."""
SESSION_LIFETIME = timedelta(hours=12)
"""How long a dashboard sign-in lasts."""


def _check_tenant_role(tenant: str | None, role: str) -> None:
    if tenant is not None and not _NAME.match(tenant):
        raise errors.InvalidInput(
            f"tenant: {tenant!r} must be 1-200 characters of [A-Za-z0-9_.-], starting alphanumeric"
        )
    if role not in model.Role.__members__.values():
        raise errors.InvalidInput(
            f"role: {role!r} is not a role; use one of {', '.join(model.Role)}"
        )


@functools.cache
def _password_hasher() -> PasswordHasher:
    """argon2id with the library's defaults (imported when first needed: the CLI starts
    without it)."""
    from argon2 import PasswordHasher

    return PasswordHasher()


@functools.cache
def _decoy_hash() -> str:
    """A hash no password is checked against for real: what an unknown user name costs."""
    return _password_hasher().hash(secrets.token_urlsafe(16))


def _password_matches(stored: str, password: str) -> bool:
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return _password_hasher().verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


def token_digest(secret: str) -> str:
    """What the store keeps of a token's secret: its SHA-256 (the secret is 256 random
    bits, so a fast hash is enough; a slow one is for passwords people choose)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def job_filter(
    action: model.BulkAction,
    *,
    states: Sequence[str] = (),
    queue: str | None = None,
    executor: str | None = None,
    labels: Sequence[str] = (),
    schedule: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    prefix: str = "filter.",
) -> model.JobFilter:
    """The jobs a bulk `action` is about, as the job list filters them: InvalidInput naming
    the field (after `prefix`) for a state that is not one, or that `action` never touches,
    and for a label that is not KEY=VALUE."""
    fits = model.BULK_STATES[action]
    for state in states:
        if state not in model.JobState.__members__.values():
            raise errors.InvalidInput(
                f"{prefix}state: {state!r} is not a job state; use one of"
                f" {', '.join(model.JobState)}"
            )
        if state not in fits:
            raise errors.InvalidInput(
                f"{prefix}state: a {action} touches {', '.join(sorted(fits))} jobs, not {state}"
            )
    pairs = {}
    for pair in labels:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"{prefix}label: {pair!r} is not KEY=VALUE")
        pairs[key] = value
    return model.JobFilter(
        states=tuple(dict.fromkeys(states)),
        queue=queue,
        executor=executor,
        labels=pairs,
        schedule=schedule,
        since=since,
        until=until,
    )


def submit_arguments(given: Any, *, now: datetime | None = None) -> dict[str, Any]:
    """A job as a JSON object (the keys of `Client.submit`, e.g. `{"spec": {"command":
    ["echo", "hi"]}, "queue": "q", "idempotency_key": "k"}`) as `Client.submit`'s keyword
    arguments; InvalidInput naming the field and the rule when one is wrong. Given `now`
    (a submit, not a template), it also takes `delay` (a duration: run_at is now plus it)
    and `allow_past` (a run_at more than a second before `now` is refused without it)."""
    if not isinstance(given, dict):
        raise errors.InvalidInput(
            'must be a JSON object, e.g. {"spec": {"command": ["echo", "hi"]}}'
        )
    if now is not None:
        given = dict(given)
        delay, allow_past = given.pop("delay", None), given.pop("allow_past", False)
        return _timed(submit_arguments(given), now, delay=delay, allow_past=allow_past)
    unknown = sorted(set(given) - set(SUBMIT_FIELDS))
    if unknown:
        raise errors.InvalidInput(
            f"{unknown[0]}: unknown field (allowed: {', '.join(SUBMIT_FIELDS)})"
        )
    if "spec" not in given and "task" not in given:
        raise errors.InvalidInput(
            'spec: required, e.g. {"command": ["echo", "hi"]}; or a Python task:'
            ' {"task": "send-invoice", "payload": {...}}'
        )
    args = dict(given)
    for field, value in given.items():
        if not (value is None and field in _NULLABLE) and (rule := _wrong(field, value)):
            raise errors.InvalidInput(f"{field}: {rule}")
    if (run_at := given.get("run_at")) is not None:
        try:
            args["run_at"] = datetime.fromisoformat(run_at)
        except ValueError:
            raise errors.InvalidInput(
                f"run_at: {run_at!r} is not an ISO 8601 time, e.g. 2026-12-01T09:00:00+00:00"
            ) from None
    return args


def _check_text(job: model.NewJob) -> None:
    """InvalidInput for text a database cannot hold anywhere in `job` (corral.plain), or a
    queue, tenant or pool that is not a name."""
    text = {f: getattr(job, f) for f in _TEXT_OF_A_JOB}
    if (why := plain.refusal(text)) is not None:
        raise errors.InvalidInput(why)
    for field, value in (("queue", job.queue), ("tenant", job.tenant), ("pool", job.pool)):
        if value is not None and not _NAME.match(value):
            raise errors.InvalidInput(
                f"{field}: {value!r} must be 1-200 characters of [A-Za-z0-9_.-],"
                " starting alphanumeric"
            )


PAST_SLACK = timedelta(seconds=1)
"""How far before now a run_at may be without `allow_past`: a clock's skew, no more."""


def _timed(
    args: dict[str, Any], now: datetime, *, delay: Any = None, allow_past: Any = False
) -> dict[str, Any]:
    """`args` with run_at from `delay`, and a run_at in the past refused unless
    `allow_past`."""
    from corral import cadence

    if not isinstance(allow_past, bool):
        raise errors.InvalidInput("allow_past: must be true or false")
    if delay is not None:
        if args.get("run_at") is not None:
            raise errors.InvalidInput("delay: give run_at or delay, not both")
        if isinstance(delay, bool) or not isinstance(delay, str | int | float):
            raise errors.InvalidInput("delay: must be a duration, e.g. 10m, 1h30m or 90 (seconds)")
        args["run_at"] = now + cadence.parse_duration(str(delay), "delay")
    run_at = args.get("run_at")
    if run_at is not None and not allow_past and (before := past_by(run_at, now)):
        raise errors.InvalidInput(
            f"run_at: {run_at.isoformat()} is {before} before now; send allow_past: true"
            " (corral submit --allow-past) to run it at once"
        )
    return args


def past_by(run_at: datetime, now: datetime) -> str | None:
    """How long before `now` a run_at is, in words, when that is more than PAST_SLACK (a
    typo in a date must not run a job at once: the API's `allow_past` and the CLI's
    `--allow-past` take one); None for a time to come, or a naive one."""
    if run_at.tzinfo is None or run_at >= now - PAST_SLACK:
        return None
    return config.format_duration(timedelta(seconds=int((now - run_at).total_seconds())))


def check_job(
    job: model.NewJob, *, executors: Mapping[str, SpecChecker], settings: config.Settings
) -> model.NewJob:
    """The job as it will be stored, or InvalidInput naming the first field that is wrong."""
    _check_text(job)
    if job.executor not in executors and job.executor != model.PYTHON:
        raise errors.InvalidInput(_not_running(job.executor, executors))
    if job.pool is not None and job.pool not in settings.pools:
        known = ", ".join(sorted(settings.pools)) or "none are configured"
        raise errors.InvalidInput(
            f"pool: {job.pool!r} is not a configured pool ({known}); add it to [pools]"
            " in corral.toml with its number of slots"
        )
    low, high = PRIORITY_RANGE
    if not low <= job.priority <= high:
        raise errors.InvalidInput(f"priority: {job.priority} must be between {low} and {high}")
    if not 1 <= job.max_attempts <= 1000:
        raise errors.InvalidInput(f"max_attempts: {job.max_attempts} must be between 1 and 1000")
    if job.idempotency_key is not None and not 1 <= len(job.idempotency_key) <= 500:
        raise errors.InvalidInput("idempotency_key: must be 1-500 characters")
    if job.run_at is not None and job.run_at.tzinfo is None:
        raise errors.InvalidInput("run_at: must carry a timezone")
    if job.code_version is not None and not _CODE_VERSION.match(job.code_version):
        raise errors.InvalidInput(
            f"code_version: {job.code_version!r} must be 1-200 printable characters, no spaces"
            " (a git sha, an image tag)"
        )
    for key, value in job.labels.items():
        model.check_label(key, value)
    _check_payload(job.payload, settings)
    if job.executor == model.PYTHON:
        job = _worker_leased(job)
    policy = config.job_policy(settings, job.policy)
    _check_reach(job.executor, policy, settings)
    checker = python_executor.SPEC if job.executor == model.PYTHON else executors[job.executor]
    spec = checker.validate_spec(job.spec)
    return dataclasses.replace(job, spec=spec, policy=policy.stored())


def _worker_leased(job: model.NewJob) -> model.NewJob:
    """A Python task's job: its payload the envelope of its spec's task and version, and on
    its worker's lease (the worker's heartbeats renew it, at the worker's own interval, so a
    job cannot set its own lease or heartbeat interval)."""
    task, version = model.task_of(python_executor.SPEC.validate_spec(job.spec))
    data = job.payload.get("data") if isinstance(job.payload, Mapping) else None
    if job.payload != model.envelope(task, version, data):
        raise errors.InvalidInput(
            "payload: a Python task's payload is its envelope {task, version, data}, of the"
            " spec's task and version; submit it as task=NAME with the data as payload"
        )
    limits = job.policy.get("limits") or {}
    for name in ("lease_timeout", "heartbeat_interval"):
        if isinstance(limits, Mapping) and name in limits:
            raise errors.InvalidInput(
                f"policy.limits.{name}: a Python task's lease is its worker's"
                f" (timeouts.{name}), renewed by the worker's heartbeats; it is not set per job"
            )
    return dataclasses.replace(job, policy={**job.policy, "heartbeat": True})


def _not_running(kind: str, executors: Mapping[str, SpecChecker]) -> str:
    """Why a job for `kind` is refused: an executor that exists but is not enabled says how
    to enable it; one that does not exist names those that do."""
    running = ", ".join(sorted(executors)) or "none"
    if kind in registry.known():
        enabled = ", ".join(f'"{k}"' for k in [*sorted(executors), kind])
        return (
            f"executor: {kind!r} is not enabled in this corral (it runs: {running}); add it to"
            f" executors.enabled in corral.toml (enabled = [{enabled}]) or set"
            f" CORRAL_EXECUTORS__ENABLED='[{enabled}]', with its settings"
            f" (see `[executors.{kind}]` in the settings reference)"
        )
    return (
        f"executor: unknown executor {kind!r}; known: {', '.join(registry.known())}"
        f" (this corral runs: {running})"
    )


def _check_reach(executor: str, policy: config.JobPolicy, settings: config.Settings) -> None:
    """A job that promises heartbeats must be able to send them from where it runs."""
    if not policy.heartbeat or executor not in registry.known():
        return
    reach = registry.get(executor).reach
    if reach is not None and (problem := reach(settings)):
        raise errors.InvalidInput(f"policy.heartbeat: {problem}")


def _check_payload(payload: Any, settings: config.Settings) -> None:
    try:
        size = len(json.dumps(payload, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"payload: must be JSON ({exc})") from None
    if size > settings.max_payload_bytes:
        raise errors.PayloadTooLarge(
            f"payload: {size} bytes is over the limit of {settings.max_payload_bytes}"
            " (max_payload_bytes); store large data elsewhere and pass a reference"
        )


def explain(view: JobView, now: datetime, *, pool: tuple[int, int] | None = None) -> str:
    """Why a job is where it is, in one line, from its row, attempts and run log (and, for
    a job in a pool, the pool's (running, slots))."""
    job, J = view.job, model.JobState
    changes = [e for e in view.events if not (e.details or {}).get("sla")]  # not its notes
    last = changes[-1].reason if changes else ""
    news = changes[-1].details if changes else {}
    wait = (job.run_at - now).total_seconds()
    at = job.run_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    if job.state == J.QUEUED and wait > 0 and news.get("budget") == "empty":
        return (
            f"budget empty: queue {job.queue!r} has spent its retry budget; attempt"
            f" {job.attempt_count + 1} waits for a token until {at} (in {wait:.1f}s)"
        )
    if job.state == J.QUEUED and wait > 0 and job.attempt_count:
        n = job.attempt_count
        how = view.attempts[-1].state if view.attempts else "failed"
        return f"backoff: attempt {n} {how}; attempt {n + 1} is due at {at} (in {wait:.1f}s)"
    if job.state == J.QUEUED and wait > 0:
        return f"not due yet: runs at {at} (in {wait:.0f}s)"
    if job.state == J.QUEUED and pool is not None and pool[0] >= pool[1]:
        return (
            f"pool full: pool {job.pool!r} runs {pool[0]} of its {pool[1]} slots;"
            " this job waits for one to free up"
        )
    if job.state == J.QUEUED and job.executor == model.PYTHON:
        task, version = model.task_of(job.spec)
        return (
            f"due now: waiting for a `corral worker` that reads task {task} version {version}"
            " to claim it (is one running with a free slot? `corral workers` lists them)"
        )
    if job.state == J.QUEUED:
        return (
            f"due now: waiting for a dispatcher running executor {job.executor!r} to claim it"
            " (is `corral serve` or `corral dispatcher` running?)"
        )
    if job.state == J.RUNNING and view.attempts:
        a = view.attempts[-1]
        seen = a.last_seen_at.strftime("%H:%M:%S") if a.last_seen_at else "never"
        unknown = next(
            (
                e.reason
                for e in reversed(view.events)
                if e.attempt_id == a.id and e.details.get("unknown") == "wait"
            ),
            None,
        )
        waits = next(
            (e for e in reversed(view.events) if e.attempt_id == a.id and "waiting" in e.details),
            None,
        )
        state = f"in the unknown state: {unknown}" if unknown else f"{a.state}"
        if waits is not None and waits.details["waiting"] and not unknown:
            state = f"{a.state} but not started on its platform ({waits.reason})"
        return (
            f"running: attempt {a.attempt_no} ({a.launch_name}, fence {a.id}) is {state};"
            f" last news {seen}"
        )
    if job.state == J.PARKED:
        return f"parked: no live worker can run it yet ({last})"
    if job.state == J.QUARANTINED:
        why = last.removeprefix("quarantined: ").removesuffix("; waits for a person")
        return (
            f"quarantined: waits for a person ({why}); `corral dead retry {job.id}` after a fix,"
            f" or `corral dead discard {job.id}`"
        )
    return f"{job.state}: {last}"


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
        return model.PYTHON, task.spec(), payload
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or version < 1
    ):
        raise errors.InvalidInput(f"task_version: {version!r} must be a whole number, at least 1")
    v = version or 0
    return model.PYTHON, {"task": task, "version": v}, model.envelope(task, v, data)


def schema_problem(schema: Mapping[str, Any], data: Any) -> str | None:
    """What is wrong with `data` under JSON Schema `schema`, as `.field: rule` (the first
    problem, the most telling), or None when it fits."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    found = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if found is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in found.absolute_path)
    return f"{where}: {found.message}"
