"""The Executor protocol: how corral launches, observes and cancels attempts on a platform.

Every executor is idempotent by launch name: launching a name that already exists is not
an error and never starts a second copy. Observations say only what the platform says;
a platform that cannot be asked raises ExecutorError rather than guessing `absent`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from corral import config, errors, launching, model, policy, tenancy


@runtime_checkable
class Executor(Protocol):
    """A plug-in that runs attempts on one platform."""

    kind: str

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec, normalised; raise InvalidInput naming the field and the rule it broke.
        Called at submit, so a job that cannot launch is refused before it is stored."""
        ...

    async def start(self) -> None:
        """Get ready (connect, create folders). Called once before any other method."""
        ...

    async def close(self) -> None:
        """Release what `start` took. Running attempts keep running."""
        ...

    async def launch(self, launch: launching.Launch) -> None:
        """Create `launch.name` on the platform; an existing name with this identity counts
        as launched, one with another identity raises LaunchConflict."""
        ...

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """What the platform shows for each name (`absent` when it shows nothing)."""
        ...

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Every launch whose labels include all of `selector`."""
        ...

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Stop a launch: ask politely, then force after `grace`. Absent names are fine."""
        ...

    def events(self) -> AsyncIterator[launching.Observation]:
        """Pushed observations of launches that changed (finished ones matter most).
        An executor without push yields nothing; the dispatcher polls it instead."""
        ...


@runtime_checkable
class Forgets(Protocol):
    """An executor whose platform keeps finished launches until told to forget them (a
    platform with its own TTL, like Kubernetes, needs none of this). The reconciler asks
    it to forget launches that finished more than `retention` ago and whose attempts the
    store holds as ended, so nothing recovery still needs is ever removed.

    Such a platform piles up history, so it also indexes its launches: the reconciler's
    pass lists the live ones and the old finished ones, never every launch it keeps."""

    kind: str
    retention: timedelta

    async def list_live(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """The launches that may still go on whose labels include all of `selector`."""
        ...

    async def list_ended(self, before: datetime) -> list[launching.Observation]:
        """Some launches that finished before `before` (a batch: each pass offers more)."""
        ...

    async def forget(self, names: Sequence[str]) -> None:
        """Remove these finished launches and everything they left."""
        ...


@dataclass(frozen=True, slots=True)
class Stray:
    """A process a launch left running apart from the launch itself (a Kubernetes pod):
    where it is, its launch's identity from its labels, and whether the launch it belongs
    to is gone from the platform (a Job deleted without a propagation policy leaves its
    pods running)."""

    name: str
    namespace: str
    uid: str
    launch_name: str
    identity: model.Identity | None
    launch_gone: bool


@runtime_checkable
class LeavesStrays(Protocol):
    """An executor whose launches run as parts that can outlive them (Jobs and their pods).
    The reconciler's orphan sweep stops a stray whose launch is gone, so nothing keeps
    running once its attempt is lost and the job runs again."""

    async def list_strays(self, selector: Mapping[str, str]) -> list[Stray]:
        """The live parts whose labels include all of `selector` (not those already
        stopping), each with whether its launch is gone."""
        ...

    async def stop_stray(self, stray: Stray) -> None:
        """Stop it with its own grace; one already gone is fine."""
        ...


@runtime_checkable
class StopsSlowly(Protocol):
    """An executor whose launches go on for a while after they are stopped (a Kubernetes
    Job's pods get SIGTERM, then their termination grace before SIGKILL; its Job may be
    gone well before they are). The reconciler ends an attempt it stopped only once
    nothing of it runs, so a retry never starts beside it; `stop_grace` bounds that wait
    (past it, what still runs is taken for stuck on a lost node, and the attempt ends)."""

    stop_grace: timedelta

    async def last_output(self, name: str) -> launching.RunLog | None:
        """The end of what launch `name` has written so far (its pod's log), read before it
        is stopped, for the run log of an attempt that ran past its deadline; None when
        nothing of it has run."""
        ...

    async def still_running(self, names: Sequence[str]) -> dict[str, str]:
        """Of these launches, those some part of which still runs (its launch deleted or
        not), each with what runs, in words: `pod corral-5-1-x7kq2 (Terminating)`."""
        ...


@runtime_checkable
class SharesPlatform(Protocol):
    """An executor whose platform another corral installation may share (a cluster's
    namespace): what it makes carries this installation's id (the label
    corral.dev/installation), and it reads, watches and stops only what does. Objects an
    earlier corral made without the label are found by `list_unlabelled`; recovery labels
    (`label`) those whose attempts its store holds, so an upgrade loses none of them."""

    def use_installation(self, installation: str) -> None:
        """The installation's id, from the store; given before `start`."""
        ...

    async def list_unlabelled(self) -> list[launching.Observation]:
        """corral's launches with no installation label, in every allowed namespace."""
        ...

    async def label(self, names: Sequence[str]) -> list[str]:
        """Give these launches (found by `list_unlabelled`) this installation's label; the
        names of those it labelled."""
        ...


@runtime_checkable
class Drains(Protocol):
    """An executor whose launches run inside corral's process (HTTP requests): before the
    dispatcher stops it lets them end, and hands over what ended that `events` has not."""

    async def drain(self) -> list[launching.Observation]: ...


@runtime_checkable
class FollowsLogs(Protocol):
    """An executor whose running attempts' output can be read as it is written, away from
    the machine they run on (a Kubernetes pod's log): `corral jobs logs --follow`."""

    def follow_log(self, name: str) -> AsyncIterator[bytes]:
        """The output of launch `name` as it comes (the end of what it wrote before, first),
        ending when it has ended, or at once when it is not there."""
        ...


@runtime_checkable
class SignsRequests(Protocol):
    """An executor that signs what it sends with its tenant's secrets (the http executor):
    the runtime gives it a way to read them from the store."""

    def use_signing_keys(self, keys: Callable[[str], Awaitable[list[str]]]) -> None: ...


def observable(executor: Executor) -> bool:
    """Whether a launch leaves something on its platform to observe and list later. One that
    does not (`observable = False` on the executor: an HTTP request) is recorded running
    before it is launched, and never launched again under the same name once it may have
    been: recovery calls it lost instead."""
    return bool(getattr(executor, "observable", True))


def spec_error(kind: str, field: str, rule: str) -> str:
    """The one wording for a refused spec field, so every executor names field and rule alike."""
    return f"{kind} spec: {field}: {rule}"


DEADLINE_BEFORE_LAUNCH = "its deadline passed before it reached its platform"
"""Why an attempt can no longer be launched: it is superseded as never launched."""


class Reaches:
    """How an attempt reaches corral under these settings (launching.Reach), made once for each
    heartbeat interval and kind of job: a dispatcher launches many attempts with few
    distinct ones. Which tenants' process jobs are strangers is worked out once a tenant."""

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self._database_url = settings.database_url_for_jobs
        self._made: dict[tuple[float | None, bool, bool], launching.Reach] = {}
        self._granted_process: dict[str, bool] = {}

    def of(
        self, policy: policy.JobPolicy, executor: str = "", *, stranger: bool = False
    ) -> launching.Reach:
        """How an attempt of `executor` reaches corral: api_url when set; else a process
        job reaches the attempt API this process answers on its Unix socket, if it does. A
        stranger's (`stranger_of`) never gets the database's URL."""
        every = policy.heartbeat_every(self.settings).total_seconds() if policy.heartbeat else None
        local = executor == "process" and not self.settings.api_url
        if (reach := self._made.get((every, local, stranger))) is None:
            api_url = self.settings.api_url or (self.settings.local_api_url if local else None)
            reach = launching.Reach(
                api_url=api_url,
                database_url=None if stranger else self._database_url,
                heartbeat_seconds=every,
                attempt_key=self.settings.attempt_key,
            )
            self._made[every, local, stranger] = reach
        return reach

    def stranger(self, job: model.Job) -> bool:
        """`stranger_of(settings, job)`, each tenant's grant read once."""
        if job.executor != "process":
            return False
        if job.tenant_made:
            return True
        if (granted := self._granted_process.get(job.tenant)) is None:
            granted = self._granted_process[job.tenant] = granted_process(self.settings, job.tenant)
        return granted


def launch_for(
    claimed: model.Claimed,
    settings: config.Settings,
    now: datetime,
    *,
    relaunch: bool = False,
    reaches: Reaches | None = None,
) -> launching.Launch:
    """The Launch of a claimed attempt as these settings make it: its env says how to reach
    corral and how often to send heartbeats, and its platform deadline is what is left of
    the attempt's own (fixed at the claim); LaunchTooLate when none is left. `relaunch`
    says the name may have been launched before (see `launching.Launch.relaunch`); `reaches`,
    the caller's Reaches for these settings, if it launches many."""
    own = policy.JobPolicy.read(claimed.job.policy)
    deadline = claimed.attempt.deadline_at
    if deadline is None:
        seconds = own.deadline(settings).total_seconds()
    elif (seconds := (deadline - now).total_seconds()) <= 0:
        raise errors.LaunchTooLate(f"{claimed.attempt.launch_name}: {DEADLINE_BEFORE_LAUNCH}")
    reaches = reaches or Reaches(settings)
    stranger = reaches.stranger(claimed.job)
    reach = reaches.of(own, claimed.job.executor, stranger=stranger)
    return launching.build_launch(
        claimed, reach=reach, deadline_seconds=seconds, relaunch=relaunch, stranger=stranger
    )


def stranger_of(settings: config.Settings, job: model.Job) -> bool:
    """Whether `job` runs code corral's operator never saw, on corral's host: a process job
    a tenant made (through the API, the dashboard, its schedule: even once its grant is
    withdrawn), or of a tenant granted `process` (whoever submitted it). Its command then
    runs as a stranger to corral (executors.process.uid_range, .sandbox), never as corral."""
    return job.executor == "process" and (job.tenant_made or granted_process(settings, job.tenant))


def granted_process(settings: config.Settings, tenant: str) -> bool:
    """Whether `tenant` is granted `process`: every process job of it runs as a stranger."""
    return "process" in tenancy.granted(settings.tenants, tenant)
