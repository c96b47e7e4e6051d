"""corral's vocabulary as plain data: jobs, attempts, events, launches, observations.

Pure: no I/O, no clock, nothing of corral but its error tree. The transition tables
here are the single source of truth for which state changes exist; the store applies
them with compare-and-set, and everything else asks `check_transition` first.
"""

from __future__ import annotations

import codecs
import hashlib
import hmac
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from corral import errors

Entity = Literal["job", "attempt", "schedule"]


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
    uncharged_attempts: int = 0  # attempts that never reached their platform (see `charged`)
    tenant_made: bool = False  # a tenant's (API, dashboard, its schedule): never corral's own

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

UNCHARGED = frozenset({NEVER_LAUNCHED, HANDED_BACK, NO_COMPATIBLE_WORKER})
"""The reasons of attempts that count toward neither max_attempts nor the retry budget."""


def charged(reason: str | None) -> bool:
    """Whether an attempt that ended for `reason` counts against its job. The reason
    decides, not the state: an attempt superseded because its state was unknown ran, and
    counts; one superseded because it never reached its platform, or handed back by a
    worker told to stop, or parked for want of a worker that reads it, does not."""
    return reason not in UNCHARGED


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
    def charged(self) -> bool:
        """Whether this attempt counts toward its job's max_attempts (see `charged`)."""
        return charged(self.reason)


@dataclass(frozen=True, slots=True)
class Event:
    """One row of a job's run log: a state change of the job or one of its attempts; or
    a schedule's news, of no job (entity "schedule", job_id 0): nominal times that did not
    run (to_state "missed" or "overlap")."""

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


@dataclass(frozen=True, slots=True)
class SigningSecret:
    """A key a tenant's HTTP requests are signed with, as it is listed: never the key."""

    id: int
    tenant: str
    created_at: datetime
    retires_at: datetime | None  # None: the current one; else it signs until then
    fingerprint: str


class Role(StrEnum):
    """What an API token may do: each role may do what the ones before it may."""

    VIEWER = "viewer"  # read
    OPERATOR = "operator"  # and submit, cancel, retry, pause
    ADMIN = "admin"  # and manage tokens

    def allows(self, needed: Role) -> bool:
        order = list(Role)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class Token:
    """An API credential as it is listed: never its secret."""

    id: int
    name: str
    tenant: str | None  # None: every tenant (an admin's)
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def valid(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class User:
    """A person who signs in to the dashboard, as listed: never their password's hash."""

    id: int
    name: str
    tenant: str | None  # None: every tenant
    role: Role
    created_at: datetime
    removed_at: datetime | None


@dataclass(frozen=True, slots=True)
class WebSession:
    """A dashboard sign-in that is still valid: who it acts as (a user, or the API token
    signed in with), in which tenant and role, and the CSRF token its forms carry."""

    name: str
    tenant: str | None
    role: Role
    csrf: str
    expires_at: datetime
    user_id: int | None
    token_id: int | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change made through the API."""

    id: int
    at: datetime
    token_id: int | None
    tenant: str | None
    action: str
    target: str
    details: Mapping[str, Any]


# --- secrets kept out of sight ----------------------------------------------------------------

REDACTED = "[redacted]"

SECRET_NAMES = {
    "contains": (
        "authorization", "cookie", "passw", "secret", "token", "signature", "credential",
        "session", "private-key", "private_key", "privatekey", "apikey", "api-key",
        "api_key", "access-key", "access_key",
    ),
    "is": ("auth", "key", "sig", "pwd", "pass", "jwt"),
    "ends with": ("-auth", "_auth", "-key", "_key", "-sig", "_sig", "-pwd", "_pwd"),
}  # fmt: skip
"""The one table of names whose values are secrets, for every surface that shows a spec,
a URL or a log line (API, CLI, run log, serve log): a key, a header or a query parameter
whose name, in any case, contains, is, or ends with one of these."""

_URL_QUERY = re.compile(
    r"^(?P<head>[a-z][a-z0-9+.-]*://[^?#]*\?)(?P<query>[^#]*)(?P<tail>#.*)?$", re.I
)
_USERINFO = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@?#]*@", re.IGNORECASE)
_URL_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def names_a_secret(name: str) -> bool:
    """Whether a key, a header or a parameter name says its value is a secret (by
    SECRET_NAMES)."""
    n = name.lower()
    return (
        n in SECRET_NAMES["is"]
        or any(part in n for part in SECRET_NAMES["contains"])
        or n.endswith(SECRET_NAMES["ends with"])
    )


def redacted_text(text: str) -> str:
    """Free text (a log line, an error) with every URL in it redacted (`redacted`)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: _redacted_url(m[0]), text)


def redacted(value: Any) -> Any:
    """`value` (a spec, a template) as it may be shown: the values of keys that name a
    secret (Authorization, cookies, tokens, keys, passwords), the password of a URL and
    the secret-named parameters of its query replaced by REDACTED. Nothing is changed in
    place; what is stored stays whole, for the executor."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED if isinstance(k, str) and names_a_secret(k) and v else redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return _redacted_url(value)
    return value


def _redacted_url(url: str) -> str:
    url = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", url)
    if (m := _URL_QUERY.match(url)) is None:
        return url
    params = []
    for part in m["query"].split("&"):
        name, eq, _ = part.partition("=")
        params.append(f"{name}={REDACTED}" if eq and names_a_secret(name) else part)
    return f"{m['head']}{'&'.join(params)}{m['tail'] or ''}"


# --- launches and observations ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything an executor needs to start one attempt, under its deterministic name."""

    name: str
    job_id: int
    attempt_no: int
    fence: int
    tenant: str
    executor: str
    spec: Mapping[str, Any]
    payload: Any
    labels: Mapping[str, str]
    env: Mapping[str, str]
    deadline_seconds: float | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)  # label values in full
    relaunch: bool = False
    """This name may have been launched before: the executor must make sure no earlier copy
    still runs before it starts one (recovery sets it; a dispatcher's first launch does not)."""
    stranger: bool = False
    """Its command is a tenant's, a stranger to corral (its tenant is granted `process`):
    the process executor runs it under its own uid or in a sandbox, never as corral."""

    @property
    def identity(self) -> Identity:
        return Identity(self.job_id, self.attempt_no, self.fence)


def payload_json(payload: Any) -> str | None:
    """The JSON text an attempt reads as its payload, the same on every executor: compact,
    non-ASCII characters as they are (UTF-8 on the wire and on disk). None for no payload
    (a JSON null): executors then deliver nothing, and a job reads that as null."""
    if payload is None:
        return None
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (sent as \ud800) has no UTF-8 form
        return json.dumps(payload, separators=(",", ":"))
    return text


class Phase(StrEnum):
    """What an executor sees of a launch name."""

    ABSENT = "absent"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in _FINISHED  # asked of every observation: no lookup of members by name


_FINISHED = frozenset({Phase.SUCCEEDED, Phase.FAILED})


@dataclass(frozen=True, slots=True)
class Observation:
    """One look at a launch name on its platform."""

    name: str
    phase: Phase
    labels: Mapping[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    reason: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failure_class: FailureClass | None = None  # the platform's own verdict, when it has one
    message: str | None = None  # the last line of stderr, or the platform's termination message
    retry_after: float | None = None  # the platform asks for no retry sooner (HTTP Retry-After)
    http_status: int | None = None  # an HTTP attempt's final status
    output: RunLog | None = None  # what the launch left to read, once it finished

    @property
    def identity(self) -> Identity | None:
        return identity_from_labels(self.labels)


STREAM_BYTES = 65_536
"""How much of each stream of an attempt's output the run log keeps, by default."""


@dataclass(frozen=True, slots=True)
class Stream:
    """One stream of an attempt's output as the run log keeps it: a process's stdout or
    stderr (their last bytes), an HTTP attempt's request or response (their first)."""

    name: str
    text: str
    size: int  # bytes the stream had, as far as known: more than `text` holds when cut
    cut: bool = (
        False  # only a part was kept: the last bytes of a process's, the first of a request's
    )

    def as_json(self) -> dict[str, Any]:
        """As the store keeps it: a NUL (binary output; PostgreSQL's JSON has no room for
        it) is replaced, so no output can keep an attempt's end from being written."""
        text = self.text.replace("\x00", "\ufffd")
        return {"name": self.name, "text": text, "bytes": self.size, "cut": self.cut}


@dataclass(frozen=True, slots=True)
class RunLog:
    """What one attempt left to read, kept in the store as long as its job: its streams and,
    for a request, how it went. `latency` is the executor's own measure, in seconds."""

    streams: tuple[Stream, ...] = ()
    latency: float | None = None
    status: int | None = None  # an HTTP attempt's final status
    address: str | None = None  # the address an HTTP attempt connected to
    fence: int | None = None  # the attempt it belongs to, when read from the store
    recorded_at: datetime | None = None

    @property
    def kept(self) -> bool:
        """Whether there is anything to keep: output, or a request's status. A quiet
        command's is not written (its attempt's times say how long it ran)."""
        return bool(self.streams) or self.status is not None

    def stream(self, name: str) -> Stream | None:
        return next((s for s in self.streams if s.name == name), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "fence": self.fence,
            "latency": self.latency,
            "status": self.status,
            "address": self.address,
            "recorded_at": None if self.recorded_at is None else self.recorded_at.isoformat(),
            "streams": [s.as_json() for s in self.streams],
        }


def decoded(data: bytes, *, cut_before: bool = False, cut_after: bool = False) -> str:
    """Bytes of output as text: a character cut at either end of a kept part dropped,
    anything else that is not UTF-8 replaced."""
    if cut_before:  # skip the continuation bytes of a character that began before
        skip = 0
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data = data[skip:]
    if cut_after:  # hold back a character whose end was not kept
        return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
    return data.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Pointer:
    """Which attempt's output a published dataset of a tenant shows: write-audit-publish's
    pointer. Each tenant has its own datasets: one name of two tenants is two pointers."""

    tenant: str
    dataset: str
    fence: int
    location: str
    code_version: str | None
    published_at: datetime


@dataclass(frozen=True, slots=True)
class Reach:
    """How an attempt reaches corral from inside (for heartbeats): passed in its env.
    With `api_url` and `attempt_key` the attempt gets CORRAL_API_URL and an attempt token
    made with the key, and never the database's URL."""

    api_url: str | None = None
    database_url: str | None = None
    heartbeat_seconds: float | None = None
    attempt_key: str | None = None


ATTEMPT_TOKEN_PREFIX = "corral_attempt_"


def attempt_token(key: str, job_id: int, fence: int) -> str:
    """The credential of attempt `fence` of job `job_id`: it names them and proves, by an
    HMAC-SHA256 under the installation's attempt key, that corral made it. It is good for
    that attempt's own calls only, and only while no newer attempt exists (the API checks
    the fence on every call), so it needs no store row and no expiry of its own."""
    return f"{ATTEMPT_TOKEN_PREFIX}{job_id}_{fence}_{_attempt_mac(key, job_id, fence)}"


def attempt_token_read(key: str, token: str) -> tuple[int, int] | None:
    """(job_id, fence) of a token `attempt_token` made with `key`; None for any other."""
    if not token.startswith(ATTEMPT_TOKEN_PREFIX):
        return None
    parts = token.removeprefix(ATTEMPT_TOKEN_PREFIX).split("_")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) < 20 for p in parts[:2]):
        return None
    job_id, fence = int(parts[0]), int(parts[1])
    if not hmac.compare_digest(parts[2], _attempt_mac(key, job_id, fence)):
        return None
    return job_id, fence


def _attempt_mac(key: str, job_id: int, fence: int) -> str:
    message = f"attempt:{job_id}:{fence}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


ATTEMPT_ENV = (
    "CORRAL_JOB_ID",
    "CORRAL_ATTEMPT",
    "CORRAL_FENCE",
    "CORRAL_TENANT",
    "CORRAL_LAUNCH_NAME",
    "CORRAL_CODE_VERSION",
    "CORRAL_API_URL",
    "CORRAL_ATTEMPT_TOKEN",
    "CORRAL_DATABASE_URL",
    "CORRAL_HEARTBEAT_INTERVAL",
    "CORRAL_RUN_DIR",  # the process executor's run folder
    "CORRAL_PAYLOAD_FILE",
    "CORRAL_PAYLOAD",
    "CORRAL_SCHEDULE",  # a schedule's firing: which schedule, and the interval it is for
    "CORRAL_NOMINAL_TIME",
    "CORRAL_INTERVAL_START",
    "CORRAL_INTERVAL_END",
)
"""Every variable corral may set in an attempt's environment (not settings, though two of
them are read as settings by `corral heartbeat` inside the job)."""


def attempt_env(
    launch_labels: Mapping[str, str],
    *,
    name: str,
    tenant: str,
    reach: Reach,
    code_version: str | None = None,
) -> dict[str, str]:
    """The CORRAL_* environment every attempt runs with."""
    env = {
        "CORRAL_JOB_ID": launch_labels[JOB_ID],
        "CORRAL_ATTEMPT": launch_labels[ATTEMPT],
        "CORRAL_FENCE": launch_labels[FENCE],
        "CORRAL_TENANT": tenant,  # the label may be a hash of a long name; this is the name
        "CORRAL_LAUNCH_NAME": name,
    }
    if code_version:
        env["CORRAL_CODE_VERSION"] = code_version  # the sinks stamp it on what this writes
    if reach.api_url:
        env["CORRAL_API_URL"] = reach.api_url
        if reach.attempt_key:
            fence = int(launch_labels[FENCE])
            job_id = int(launch_labels[JOB_ID])
            env["CORRAL_ATTEMPT_TOKEN"] = attempt_token(reach.attempt_key, job_id, fence)
    if reach.database_url:
        env["CORRAL_DATABASE_URL"] = reach.database_url
    if reach.heartbeat_seconds is not None:
        env["CORRAL_HEARTBEAT_INTERVAL"] = f"{reach.heartbeat_seconds:g}"
    return env


def build_launch(
    claimed: Claimed,
    *,
    reach: Reach,
    deadline_seconds: float | None,
    relaunch: bool = False,
    stranger: bool = False,
) -> Launch:
    """The Launch for a claimed attempt: name, identity labels, user labels and env."""
    job, attempt = claimed.job, claimed.attempt
    labels = {**job.labels}
    labels.update(
        identity_labels(
            job_id=job.id,
            attempt_no=attempt.attempt_no,
            fence=attempt.id,
            tenant=job.tenant,
            capability=job.queue,
            idempotency_key=job.idempotency_key,
        )
    )
    return Launch(
        name=attempt.launch_name,
        job_id=job.id,
        attempt_no=attempt.attempt_no,
        fence=attempt.id,
        tenant=job.tenant,
        executor=job.executor,
        spec=job.spec,
        payload=job.payload,
        labels=labels,
        env={
            **attempt_env(
                labels,
                name=attempt.launch_name,
                tenant=job.tenant,
                reach=reach,
                code_version=job.code_version,
            ),
            **firing_env(job.payload),
        },
        deadline_seconds=deadline_seconds,
        relaunch=relaunch,
        stranger=stranger,
        annotations={
            key: value
            for key, value in (
                (TENANT, job.tenant),
                (CAPABILITY, job.queue),
                (IDEMPOTENCY_KEY, job.idempotency_key),
            )
            if value is not None and label_safe(value) != value
        },
    )


# --- schedules and firings -----------------------------------------------------------------


class Catchup(StrEnum):
    """What a schedule does about nominal times that passed while nobody fired them."""

    NONE = "none"  # fire the latest one only; the others are recorded as missed
    ALL = "all"  # fire each of them, within a window and up to a number


class Overlap(StrEnum):
    """What a firing does while the previous firing's job has not ended."""

    ALLOW = "allow"
    FORBID = "forbid"  # skip this firing (recorded as `overlap`)
    REPLACE = "replace"  # cancel the previous job, then fire


class FiringOutcome(StrEnum):
    """What became of one nominal time of a schedule."""

    FIRED = "fired"  # a job was created for it
    MISSED = "missed"  # it passed while no scheduler ran, and catch-up did not fire it
    SKIPPED = "skipped"  # it passed while the schedule was paused
    OVERLAP = "overlap"  # the previous firing's job still ran, and overlap is `forbid`
    REFUSED = "refused"  # a tenant's schedule whose tenant is no longer granted its executor
    BACKFILLED = "backfilled"  # a job was created for it by `corral backfill`


TEMPLATE_FIELDS = (
    "executor",
    "spec",
    "payload",
    "queue",
    "pool",
    "tenant",
    "priority",
    "max_attempts",
    "labels",
    "policy",
    "code_version",
)
"""The fields of a NewJob a schedule keeps as its job template (run_at and the idempotency
key are the firing's)."""


def job_template(new: NewJob) -> dict[str, Any]:
    """A schedule's job template, as JSON: `new`'s fields but run_at and the key."""
    return {
        name: dict(value) if isinstance(value := getattr(new, name), Mapping) else value
        for name in TEMPLATE_FIELDS
    }


def job_from_template(template: Mapping[str, Any], **firing: Any) -> NewJob:
    """The job a firing creates from a template (`firing`: run_at, idempotency_key, and
    any field a backfill overrides)."""
    fields = {name: template[name] for name in TEMPLATE_FIELDS if name in template}
    return NewJob(**{**fields, **firing})


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A schedule as created, validated at the edge: when (`cron` in `tz`, or every
    `every_seconds` from `anchor`), and the job each firing creates."""

    name: str
    template: Mapping[str, Any]
    tenant: str = "default"
    cron: str | None = None
    tz: str = "UTC"
    every_seconds: int | None = None
    anchor: datetime | None = None  # the interval's origin, and no firing before it
    catchup: Catchup = Catchup.NONE
    catchup_window_seconds: float = 7 * 86400.0
    catchup_max: int = 100
    overlap: Overlap = Overlap.ALLOW
    jitter_seconds: float = 0.0
    until: datetime | None = None  # no firing at or after it
    tenant_made: bool = False  # through the API or the dashboard: firings check the grant


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as the store holds it. `next_due` is the next nominal time to fire
    (None once `until` has passed); `last_nominal` the latest one recorded."""

    id: int
    name: str
    tenant: str
    cron: str | None
    tz: str
    every_seconds: int | None
    anchor: datetime
    template: Mapping[str, Any]
    catchup: Catchup
    catchup_window_seconds: float
    catchup_max: int
    overlap: Overlap
    jitter_seconds: float
    until: datetime | None
    paused_at: datetime | None
    next_due: datetime | None
    last_nominal: datetime | None
    last_job_id: int | None
    missed_total: int
    created_at: datetime
    updated_at: datetime
    tenant_made: bool = False  # its tenant's grant is checked at each firing


@dataclass(frozen=True, slots=True)
class Firing:
    """One nominal time of a schedule: unique on (schedule, nominal time), so however many
    schedulers run, each nominal time is recorded, and fires, once."""

    schedule_id: int
    nominal_at: datetime
    outcome: FiringOutcome
    job_id: int | None
    recorded_at: datetime
    lateness_seconds: float  # recorded_at - nominal_at
    note: str | None = None  # e.g. how DST moved it


@dataclass(frozen=True, slots=True)
class Fire:
    """What a scheduler records for one nominal time: the firing, and the job it creates
    (None for a missed, skipped or overlapping one)."""

    nominal_at: datetime
    outcome: FiringOutcome
    job: NewJob | None = None
    note: str | None = None


def firing_key(schedule_id: int, nominal_at: datetime) -> str:
    """The idempotency key of the job a schedule's firing creates: names the schedule and
    the nominal time, so a firing's job is made once however it is fired (a scheduler, a
    backfill, a trigger)."""
    at = nominal_at.astimezone(UTC)
    return f"schedule:{schedule_id}:{at.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


FIRING = "corral"
"""The key under which a firing's job finds, in its payload (an object), what it is for:
`{"schedule": name, "nominal_time", "interval_start", "interval_end"}` (ISO 8601, UTC)."""


def firing_payload(
    payload: Any, *, schedule: str, nominal: datetime, interval_end: datetime
) -> dict[str, Any]:
    """The payload of a firing's job: the template's (an object, or none) with what the
    firing is for under FIRING. The interval of a nominal time runs to the next one."""
    base = dict(payload) if isinstance(payload, Mapping) else {}
    base[FIRING] = {
        "schedule": schedule,
        "nominal_time": iso(nominal),
        "interval_start": iso(nominal),
        "interval_end": iso(interval_end),
    }
    return base


def firing_env(payload: Any) -> dict[str, str]:
    """CORRAL_SCHEDULE, CORRAL_NOMINAL_TIME and CORRAL_INTERVAL_START/END for the job of a
    firing (read from its payload); none for any other job."""
    said = payload.get(FIRING) if isinstance(payload, Mapping) else None
    if not isinstance(said, Mapping):
        return {}
    names = {
        "schedule": "CORRAL_SCHEDULE",
        "nominal_time": "CORRAL_NOMINAL_TIME",
        "interval_start": "CORRAL_INTERVAL_START",
        "interval_end": "CORRAL_INTERVAL_END",
    }
    return {env: said[key] for key, env in names.items() if isinstance(said.get(key), str)}


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
    (states: any of them; labels: each of them; created in [since, until)). The one filter
    of every job list: the API's, the dashboard's, the CLI's and the client's."""

    states: Collection[str] = ()
    queue: str | None = None
    tenant: str | None = None
    pool: str | None = None
    executor: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    schedule: str | None = None
    since: datetime | None = None
    until: datetime | None = None

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


# --- Python workers ----------------------------------------------------------------------------

PYTHON = "python"
"""The executor kind of a Python task: run by a `corral worker`, never by the dispatcher."""


class WorkerState(StrEnum):
    """Where a `corral worker` process is in its life."""

    RUNNING = "running"  # claims and runs tasks
    DRAINING = "draining"  # told to stop: claims nothing, finishes or hands back what it runs
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class TaskRead:
    """One (task, payload version) a worker reads, with that version's JSON Schema;
    `newest`: the version the worker writes (its task's current version)."""

    task: str
    version: int
    schema: Mapping[str, Any]
    newest: bool = False


@dataclass(frozen=True, slots=True)
class Worker:
    """A registered `corral worker` process."""

    id: str
    app: str
    app_version: str
    host: str
    pid: int
    queues: tuple[str, ...]  # empty: every queue
    concurrency: int
    state: WorkerState
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    reads: tuple[TaskRead, ...] = ()


@dataclass(frozen=True, slots=True)
class ParkedJob:
    """A job no live worker reads, as `corral parked list` shows it: its task and payload
    version, and the lowest app version known to read it (None: no worker ever has)."""

    job: Job
    task: str
    version: int
    needs_app_version: str | None
    parked_at: datetime | None
    reason: str


def task_of(spec: Mapping[str, Any]) -> tuple[str, int]:
    """The (task, payload version) of a Python task's spec."""
    return str(spec["task"]), int(spec["version"])


def envelope(task: str, version: int, data: Any) -> dict[str, Any]:
    """A Python task's payload as stored: its task, its payload version and its data."""
    return {"task": task, "version": version, "data": data}


def version_key(version: str) -> tuple[int, Any]:
    """An app version as a sort key: a version as Python packages number them (PEP 440:
    `1.10.0` after `1.9.2`, `2.0.0rc1` before `2.0.0`) by its meaning; any other string (a
    git sha) after those, place by place, numbers before words."""
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version))
    except InvalidVersion:
        parts = re.split(r"[.\-+_]", version)
        return (1, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))
