"""corral's vocabulary as plain data: jobs, attempts, events, their states and labels.

What an executor is handed and reads back (launches, observations, run logs) is in
corral.launching. Pure: no I/O, no clock, nothing of corral but its error tree. The
transition tables here are the single source of truth for which state changes exist; the
store applies them with compare-and-set, and everything else asks `check_transition` first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from corral import errors

Entity = Literal["job", "attempt", "schedule", "monitor"]


class JobState(StrEnum):
    """Where a job is in its life."""

    SCHEDULED = "scheduled"
    QUEUED = "queued"
    PARKED = "parked"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    QUARANTINED = "quarantined"
    CANCELLED = "cancelled"


class AttemptState(StrEnum):
    """Where one launch of a job is in its life."""

    LAUNCHING = "launching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"


class FailureClass(StrEnum):
    """What a failed attempt says about the next one."""

    TRANSIENT = "transient"  # worth retrying: a timeout, a kill, a lost node
    PERMANENT = "permanent"  # retrying cannot help: quarantine the job at once
    UNKNOWN = "unknown"  # retry, but the same failure again and again makes it a poison pill
    # An answer that came, with a status that succeeded, failed an assertion the job makes
    # of it (an HTTP job's expect_body, expect_json, max_response_time): permanent, unless
    # a failure rule on this class says otherwise.
    ASSERTION = "assertion"


J, A = JobState, AttemptState

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    J.SCHEDULED: frozenset({J.QUEUED, J.CANCELLED}),
    J.QUEUED: frozenset({J.PARKED, J.RUNNING, J.CANCELLED}),
    J.PARKED: frozenset({J.QUEUED, J.CANCELLED}),
    # running -> queued is a retry: the attempt failed and attempts remain. running ->
    # parked: a Python task's worker went away and no live worker reads its payload.
    J.RUNNING: frozenset({J.SUCCEEDED, J.FAILED, J.QUARANTINED, J.CANCELLED, J.QUEUED, J.PARKED}),
    # A person may send a quarantined job back (after a fix) or discard it.
    J.QUARANTINED: frozenset({J.QUEUED, J.CANCELLED}),
    J.SUCCEEDED: frozenset(),
    J.FAILED: frozenset(),
    J.CANCELLED: frozenset(),
}

ATTEMPT_TRANSITIONS: Mapping[AttemptState, frozenset[AttemptState]] = {
    # A launching attempt may finish before `running` is recorded (a fast job, or a
    # completion seen by recovery), so the end states are reachable from both.
    A.LAUNCHING: frozenset({A.RUNNING, A.SUCCEEDED, A.FAILED, A.LOST, A.CANCELLED, A.SUPERSEDED}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.LOST, A.CANCELLED, A.SUPERSEDED}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.LOST: frozenset(),
    A.CANCELLED: frozenset(),
    A.SUPERSEDED: frozenset(),
}

FINAL_JOB_STATES = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)
FINAL_ATTEMPT_STATES = frozenset(s for s, nxt in ATTEMPT_TRANSITIONS.items() if not nxt)
ACTIVE_ATTEMPT_STATES = frozenset({A.LAUNCHING, A.RUNNING})


def check_transition(entity: Entity, frm: str, to: str) -> None:
    """Raise IllegalTransition unless `frm -> to` is in the entity's transition table."""
    table: Mapping[Any, frozenset[Any]] = (
        JOB_TRANSITIONS if entity == "job" else ATTEMPT_TRANSITIONS
    )
    states = JobState if entity == "job" else AttemptState
    try:
        allowed = table[states(frm)]
        target = states(to)
    except ValueError as exc:
        raise errors.IllegalTransition(f"{entity} state {exc.args[0]}") from None
    if target not in allowed:
        raise errors.IllegalTransition(
            f"{entity} cannot go from {frm!r} to {to!r}"
            f" (allowed from {frm!r}: {', '.join(sorted(allowed)) or 'none, it is final'})"
        )


# --- launch names -----------------------------------------------------------------------

MAX_NAME = 63
_DNS_BAD = re.compile(r"[^a-z0-9-]+")


def launch_name(job_id: int | str, attempt_no: int) -> str:
    """The deterministic platform name of an attempt: `corral-<job id>-<attempt no>`.

    Always a DNS-1123 label (lower-case alphanumerics and '-', starting and ending with
    an alphanumeric, at most 63 characters), for any job id: an id that is too long or
    not DNS-safe is cleaned and shortened, with a hash of the original keeping it unique.
    """
    if type(job_id) is int and job_id >= 0:  # a store's id: safe as it is, and short
        name = f"corral-{job_id}-{attempt_no}"
        if len(name) <= MAX_NAME:
            return name
    raw = str(job_id)
    clean = _DNS_BAD.sub("-", raw.lower()).strip("-")
    suffix = f"-{attempt_no}"
    room = MAX_NAME - len("corral-") - len(suffix)
    if clean != raw or len(clean) > room:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
        keep = room - len(digest) - 1
        clean = f"{clean[:keep].strip('-')}-{digest}".strip("-")
    return f"corral-{clean}{suffix}"


# --- self-describing labels ---------------------------------------------------------------

LABEL_PREFIX = "corral.dev/"
MANAGED_BY = LABEL_PREFIX + "managed-by"
JOB_ID = LABEL_PREFIX + "job-id"
ATTEMPT = LABEL_PREFIX + "attempt"
FENCE = LABEL_PREFIX + "fence"
TENANT = LABEL_PREFIX + "tenant"
CAPABILITY = LABEL_PREFIX + "capability"
IDEMPOTENCY_KEY = LABEL_PREFIX + "idempotency-key"
INSTALLATION = LABEL_PREFIX + "installation"
"""The label of the installation (its store's id) that made an object on a shared platform."""
LAUNCH_NAME_PREFIX = "corral-"
"""What every launch name starts with (`launch_name`); a cluster executor puts its name
prefix in its place."""
MANAGER = "corral"

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_label(key: str, value: str) -> None:
    """Raise InvalidInput unless key=value is a valid Kubernetes label a user may set."""
    if problem := label_problem(key, value):
        raise errors.InvalidInput(problem)
    if key.startswith(LABEL_PREFIX):
        raise errors.InvalidInput(
            f"label key {key!r}: the prefix {LABEL_PREFIX!r} is reserved for corral"
        )
    if key in _SET_BY_KUBERNETES or key.startswith(_KUBERNETES_PREFIXES):
        raise errors.InvalidInput(
            f"label key {key!r}: Kubernetes sets it on a Job's pods; choose another key"
        )


_SET_BY_KUBERNETES = frozenset({"job-name", "controller-uid"})
_KUBERNETES_PREFIXES = ("batch.kubernetes.io/", "kubernetes.io/", "k8s.io/")


def label_problem(key: str, value: str) -> str | None:
    """What is wrong with key=value as a Kubernetes label, or None."""
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or (
        prefix and (len(prefix) > 253 or not _LABEL_PREFIX_RE.match(prefix))
    ):
        return (
            f"label key {key!r}: must be [prefix/]name, name 1-63 characters of [A-Za-z0-9-_.]"
            " starting and ending alphanumeric, prefix a DNS subdomain"
        )
    if not _LABEL_VALUE.match(value):
        return (
            f"label {key}={value!r}: value must be at most 63 characters of [A-Za-z0-9-_.]"
            " starting and ending alphanumeric"
        )
    return None


def label_safe(value: str) -> str:
    """`value` itself if it is a valid label value, else a stable hash of it."""
    if _LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class Identity:
    """Which attempt a launch belongs to, as read back from its labels."""

    job_id: int
    attempt_no: int
    fence: int


def describe_identity(identity: Identity | None, labels: Mapping[str, str]) -> str:
    """An attempt's identity in words, for conflicts: whose launch a name holds."""
    if identity is None:
        return f"a launch corral does not manage (labels {dict(labels)})"
    return f"job {identity.job_id} attempt {identity.attempt_no} fence {identity.fence}"


def identity_labels(
    *,
    job_id: int,
    attempt_no: int,
    fence: int,
    tenant: str,
    capability: str,
    idempotency_key: str | None,
) -> dict[str, str]:
    """The labels every launch carries, on every platform."""
    labels = {
        MANAGED_BY: MANAGER,
        JOB_ID: str(job_id),
        ATTEMPT: str(attempt_no),
        FENCE: str(fence),
        TENANT: label_safe(tenant),
        CAPABILITY: label_safe(capability),
    }
    if idempotency_key is not None:
        labels[IDEMPOTENCY_KEY] = label_safe(idempotency_key)
    return labels


def identity_from_labels(labels: Mapping[str, str]) -> Identity | None:
    """Rebuild an attempt's identity from a launch's labels; None if corral does not manage it."""
    if labels.get(MANAGED_BY) != MANAGER:
        return None
    try:
        return Identity(int(labels[JOB_ID]), int(labels[ATTEMPT]), int(labels[FENCE]))
    except (KeyError, ValueError):
        return None


# --- jobs, attempts, events ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job as submitted, already validated at the edge (see corral.client)."""

    executor: str
    spec: Mapping[str, Any]
    payload: Any = None
    queue: str = "default"
    pool: str | None = None
    tenant: str = "default"
    priority: int = 0
    max_attempts: int = 3
    idempotency_key: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    run_at: datetime | None = None
    policy: Mapping[str, Any] = field(default_factory=dict)
    code_version: str | None = None  # what the job's code is (a git sha, an image tag)
    tenant_made: bool = False  # made by a tenant, not the operator: see Job.tenant_made
    callback: str | None = None  # a URL sent the result when the job succeeds (callbacks.py)
    failure_callback: str | None = None  # the same when it fails or is quarantined
    callback_of: int | None = None  # a callback job: the job whose result it sends
    flow: str | None = None  # the tenant's flow it goes through (corral.flows); None: none


@dataclass(frozen=True, slots=True)
class Job:
    """A durable request for work, as the store holds it."""

    id: int
    tenant: str
    queue: str
    pool: str | None
    priority: int
    executor: str
    spec: Mapping[str, Any]
    payload: Any
    state: JobState
    run_at: datetime
    idempotency_key: str | None
    max_attempts: int
    attempt_count: int
    labels: Mapping[str, str]
    created_at: datetime
    updated_at: datetime
    policy: Mapping[str, Any] = field(default_factory=dict)
    code_version: str | None = None
    uncharged_attempts: int = 0  # attempts that never reached their platform (see `End`)
    tenant_made: bool = False  # a tenant's (API, dashboard, its schedule): never corral's own
    callback: str | None = None  # sent the result when the job succeeds (corral.callbacks)
    failure_callback: str | None = None  # sent the result when it fails or is quarantined
    callback_of: int | None = None  # a callback job: the job whose result it sends
    flow: str | None = None  # the tenant's flow it goes through (corral.flows)

    @property
    def charged_attempts(self) -> int:
        """The attempts that count toward max_attempts: all but the never-launched ones."""
        return self.attempt_count - self.uncharged_attempts


NEVER_LAUNCHED = "never launched"
"""The reason of an attempt that never reached its platform: it is superseded, and its
job pays for it with neither an attempt nor a token of its retry budget."""


HANDED_BACK = "handed back at shutdown"
"""The reason of a Python task's attempt that its worker, told to stop, handed back
unfinished (with its checkpoint): the job is queued again and pays nothing for it."""

NO_COMPATIBLE_WORKER = "no compatible worker"
"""The reason of a Python task's attempt whose worker went away while no live worker
reads its payload's version: the job is parked, and pays nothing for it."""


@dataclass(frozen=True, slots=True)
class End:
    """How an attempt ended, as its job pays for it: the reason it is recorded with, and
    whether it is charged (counts toward max_attempts, the retry budget, and a streak of
    the same failure). The end decides, not the state: an attempt superseded because its
    state was unknown ran, and is charged; one superseded because it never reached its
    platform, or handed back by a worker told to stop, or parked for want of a worker
    that reads it, is not (UNCHARGED)."""

    reason: str
    charged: bool = True

    @classmethod
    def of(cls, reason: str | None) -> End:
        """The end of a stored attempt, read back from the reason it was recorded with."""
        return UNCHARGED.get(reason or "") or cls(reason or "")


UNCHARGED: Mapping[str, End] = {
    reason: End(reason, charged=False)
    for reason in (NEVER_LAUNCHED, HANDED_BACK, NO_COMPATIBLE_WORKER)
}
"""The ends that count toward neither max_attempts nor the retry budget, by reason."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One launch of a job. Its id is global and only grows: it is the fence token."""

    id: int
    job_id: int
    attempt_no: int
    launch_name: str
    executor: str
    state: AttemptState
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    exit_code: int | None
    reason: str | None
    last_seen_at: datetime | None
    deadline_at: datetime | None = None  # stopped here, whatever the platform does
    lease_until: datetime | None = None  # a job that sends heartbeats is silent after this
    lease_seconds: float | None = None  # its lease, renewed from each heartbeat
    failure_class: FailureClass | None = None
    fingerprint: str | None = None

    @property
    def fence(self) -> int:
        return self.id

    @property
    def end(self) -> End:
        """How this attempt ended, as its job pays for it (see `End`)."""
        return End.of(self.reason)

    @property
    def charged(self) -> bool:
        """Whether this attempt counts toward its job's max_attempts (see `End`)."""
        return self.end.charged


@dataclass(frozen=True, slots=True)
class Event:
    """One row of a job's run log: a state change of the job or one of its attempts; or
    a schedule's news, of no job (entity "schedule", job_id 0): nominal times that did not
    run (to_state "missed" or "overlap"); or a monitor's going down, failing or coming back
    up (entity "monitor", job_id 0), which alert rules read."""

    id: int
    job_id: int
    attempt_id: int | None
    entity: Entity
    from_state: str | None
    to_state: str
    reason: str
    at: datetime
    details: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job the dispatcher has claimed, with the attempt created for it (in `launching`)."""

    job: Job
    attempt: Attempt


def first_claim(new: NewJob, now: datetime) -> Claimed:
    """The claim of a job not stored yet, as its first attempt would get it: job id and
    fence are placeholders (0). For dry runs and for checking what a spec would launch."""
    job = Job(
        id=0,
        tenant=new.tenant,
        queue=new.queue,
        pool=new.pool,
        priority=new.priority,
        executor=new.executor,
        spec=new.spec,
        payload=new.payload,
        state=JobState.RUNNING,
        run_at=new.run_at or now,
        idempotency_key=new.idempotency_key,
        max_attempts=new.max_attempts,
        attempt_count=1,
        labels=new.labels,
        created_at=now,
        updated_at=now,
        policy=new.policy,
        code_version=new.code_version,
    )
    attempt = Attempt(
        id=0,
        job_id=0,
        attempt_no=1,
        launch_name=launch_name(0, 1),
        executor=new.executor,
        state=AttemptState.LAUNCHING,
        created_at=now,
        updated_at=now,
        started_at=None,
        finished_at=None,
        exit_code=None,
        reason=None,
        last_seen_at=None,
    )
    return Claimed(job, attempt)


def iso(at: datetime) -> str:
    """A time as corral writes it for people and jobs: ISO 8601 in UTC, to the second (or
    finer when it has a fraction)."""
    text = at.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


# --- bulk operations -------------------------------------------------------------------------


class BulkAction(StrEnum):
    """What a bulk operation does to each job of its snapshot."""

    RETRY = "retry"  # a quarantined job back to its queue
    CANCEL = "cancel"  # a job not ended yet, cancelled
    DISCARD = "discard"  # a quarantined job given up on (cancelled)


BULK_STATES: Mapping[BulkAction, frozenset[JobState]] = {
    BulkAction.RETRY: frozenset({JobState.QUARANTINED}),
    BulkAction.DISCARD: frozenset({JobState.QUARANTINED}),
    BulkAction.CANCEL: frozenset(set(JobState) - FINAL_JOB_STATES),
}
"""The states a job must be in for each action to touch it: a filter matches only these."""
BULK_MAX_JOBS = 100_000
"""The most jobs one preview counts and one operation takes."""


class OperationState(StrEnum):
    """Where a bulk operation is: running until no item is left, or cancelled by a person."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"


class ItemOutcome(StrEnum):
    """What became of one job of an operation's snapshot."""

    APPLIED = "applied"
    SKIPPED = "skipped"  # it no longer fit the action (its note says why)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a job list shows, or a bulk action is about: each field given narrows it
    (states: any of them; labels: each of them; created in [since, until); url: HTTP jobs
    whose URL, as shown, contains it, in any case: the job list's alone, a bulk action
    does not take it). The one filter of every job list: the API's, the dashboard's, the
    CLI's and the client's."""

    states: Collection[str] = ()
    queue: str | None = None
    tenant: str | None = None
    pool: str | None = None
    executor: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    schedule: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        # Kept as given would let a caller's list change the filter after it was made.
        object.__setattr__(self, "states", tuple(self.states))

    def as_json(self) -> dict[str, Any]:
        """The filter as stored with its operation and shown back: only what was given (an
        operation keeps its tenant apart)."""
        said: dict[str, Any] = {
            "state": list(self.states),
            "queue": self.queue,
            "pool": self.pool,
            "executor": self.executor,
            "label": [f"{k}={v}" for k, v in self.labels.items()],
            "schedule": self.schedule,
            "since": None if self.since is None else iso(self.since),
            "until": None if self.until is None else iso(self.until),
        }
        return {k: v for k, v in said.items() if v not in (None, [])}


@dataclass(frozen=True, slots=True)
class Preview:
    """What a bulk action would touch now: how many jobs, exactly, and some of their ids."""

    count: int
    sample: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Operation:
    """A bulk action running on the snapshot of ids it was made with."""

    id: int
    tenant: str | None  # None: every tenant (an admin's)
    action: BulkAction
    filter: Mapping[str, Any]
    state: OperationState
    total: int
    applied: int
    skipped: int
    token_id: int | None
    made_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def left(self) -> int:
        """Items not done yet (those a cancel stopped included)."""
        return self.total - self.applied - self.skipped


@dataclass(frozen=True, slots=True)
class OperationItem:
    """One job of an operation's snapshot, and what became of it (None: not done yet)."""

    job_id: int
    outcome: ItemOutcome | None
    note: str | None
    done_at: datetime | None
