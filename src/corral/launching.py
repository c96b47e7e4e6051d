"""What corral hands an executor and reads back: a launch (its name, labels, environment
and deadline), and the observations, run logs and pointers that come back from a platform.

Pure data, as corral.model is: building a claimed attempt's launch, the CORRAL_*
environment an attempt runs with and the attempt tokens in it are decided here, without
I/O, from the job, its attempt and how the attempt reaches corral (`Reach`).
"""

from __future__ import annotations

import codecs
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from corral import model, scheduling


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
    def identity(self) -> model.Identity:
        return model.Identity(self.job_id, self.attempt_no, self.fence)


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
    failure_class: model.FailureClass | None = None  # the platform's own verdict, when it has one
    message: str | None = None  # the last line of stderr, or the platform's termination message
    retry_after: float | None = None  # the platform asks for no retry sooner (HTTP Retry-After)
    http_status: int | None = None  # an HTTP attempt's final status
    output: RunLog | None = None  # what the launch left to read, once it finished

    @property
    def identity(self) -> model.Identity | None:
        return model.identity_from_labels(self.labels)


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
    trimmed_at: datetime | None = None  # its streams trimmed for its tenant's run_log_bytes
    # What a callback sends of the output beyond the streams (corral.callbacks: an HTTP
    # response's headers and body, a task's return value), bounded; not kept in the run log.
    result: Mapping[str, Any] | None = None

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
            "trimmed_at": None if self.trimmed_at is None else self.trimmed_at.isoformat(),
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
        "CORRAL_JOB_ID": launch_labels[model.JOB_ID],
        "CORRAL_ATTEMPT": launch_labels[model.ATTEMPT],
        "CORRAL_FENCE": launch_labels[model.FENCE],
        "CORRAL_TENANT": tenant,  # the label may be a hash of a long name; this is the name
        "CORRAL_LAUNCH_NAME": name,
    }
    if code_version:
        env["CORRAL_CODE_VERSION"] = code_version  # the sinks stamp it on what this writes
    if reach.api_url:
        env["CORRAL_API_URL"] = reach.api_url
        if reach.attempt_key:
            fence = int(launch_labels[model.FENCE])
            job_id = int(launch_labels[model.JOB_ID])
            env["CORRAL_ATTEMPT_TOKEN"] = attempt_token(reach.attempt_key, job_id, fence)
    if reach.database_url:
        env["CORRAL_DATABASE_URL"] = reach.database_url
    if reach.heartbeat_seconds is not None:
        env["CORRAL_HEARTBEAT_INTERVAL"] = f"{reach.heartbeat_seconds:g}"
    return env


def build_launch(
    claimed: model.Claimed,
    *,
    reach: Reach,
    deadline_seconds: float | None,
    relaunch: bool = False,
    stranger: bool = False,
) -> Launch:
    """The Launch for a claimed attempt: name, identity labels, user labels and env."""
    job, attempt = claimed.job, claimed.attempt
    labels = launch_labels(claimed)
    env = attempt_env(
        labels,
        name=attempt.launch_name,
        tenant=job.tenant,
        reach=reach,
        code_version=job.code_version,
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
        env={**env, **scheduling.firing_env(job.payload)},
        deadline_seconds=deadline_seconds,
        relaunch=relaunch,
        stranger=stranger,
        annotations=hashed_label_values(job),
    )


def launch_labels(claimed: model.Claimed) -> dict[str, str]:
    """A launch's labels: the job's own, then corral's identity labels over them."""
    job, attempt = claimed.job, claimed.attempt
    identity = model.identity_labels(
        job_id=job.id,
        attempt_no=attempt.attempt_no,
        fence=attempt.id,
        tenant=job.tenant,
        capability=job.queue,
        idempotency_key=job.idempotency_key,
    )
    return {**job.labels, **identity}


def hashed_label_values(job: model.Job) -> dict[str, str]:
    """The identity values too long or too odd for a label value, which the labels hold
    hashed: a launch carries them whole as annotations, keyed as their labels are."""
    given = (
        (model.TENANT, job.tenant),
        (model.CAPABILITY, job.queue),
        (model.IDEMPOTENCY_KEY, job.idempotency_key),
    )
    return {
        key: value for key, value in given if value is not None and model.label_safe(value) != value
    }
