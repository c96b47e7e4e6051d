"""Settings: one validated object read from `corral.toml` and `CORRAL_*` environment variables.

Environment variables win over the file; nested settings use a double underscore
(`CORRAL_TIMEOUTS__ATTEMPT_DEADLINE=240`). Durations accept seconds or `500ms`, `90s`,
`4m`, `1h`, `1h30m`. Unknown keys and bad values raise ConfigError naming the setting.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from corral import entrypoints, errors, failpoints, model, netrules, tenancy
from corral.proxies import ApiSettings
from corral.tenancy import TenantSettings

DEFAULT_CONFIG_FILE = Path("corral.toml")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
MIN_DURATION, MAX_DURATION = 0.001, 365 * 86400.0
_NUMBER = re.compile(r"\d+(\.\d+)?")


def parse_duration(value: Any) -> timedelta:
    """Seconds (a number or a numeric string) or a string such as `90s`, `4m`, `1h30m`."""
    seconds = _seconds(value)
    if seconds is None:
        raise ValueError(f"{value!r} is not a duration: use seconds or e.g. 500ms, 90s, 4m, 1h")
    if not MIN_DURATION <= seconds <= MAX_DURATION:
        raise ValueError(f"{value!r}: a duration must be between 1ms and 365 days")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """A duration as a person writes it (and parse_duration reads it): 500ms, 2.5s, 5m, 1h30m."""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60 or seconds != int(seconds):
        return f"{seconds:g}s"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s"))
    return "".join(f"{n}{unit}" for n, unit in parts if n)


def _seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not (text := value.strip().lower()):
        return None
    if _NUMBER.fullmatch(text):
        return float(text)
    if _DURATION.sub("", text) == "":
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(text))
    return None


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(lambda d: d.total_seconds(), return_type=float),
]


_INNER: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("attempt_deadline", "step_deadline", "margin", None),
    ("step_deadline", "http_request_timeout", "margin", None),
    ("lease_timeout", "heartbeat_interval", "margin", None),
    ("attempt_deadline", "drain_timeout", "margin", None),
    ("dispatch_interval", "tick_deadline", "tick_margin", None),
    ("launch_grace", "tick_deadline", "tick_margin", None),
    ("launch_grace", "database_transaction_timeout", "tick_margin", "tick_deadline"),
    ("lease_timeout", "database_transaction_timeout", None, None),
    ("database_transaction_timeout", "database_statement_timeout", "tick_margin", None),
    ("database_statement_timeout", "database_lock_timeout", "tick_margin", None),
    ("database_transaction_timeout", "database_idle_timeout", "tick_margin", None),
    ("database_transaction_timeout", "database_tcp_timeout", "tick_margin", None),
    ("database_transaction_timeout", "database_connect_timeout", "tick_margin", None),
)
"""(outer, inner, margin, extra): an inner limit left unset is tightened with its outer one,
to at most outer - margin - extra (a margin of None: no margin). In this order, so that a
limit that follows is itself followed."""

_WHOLE_SECONDS = {"database_connect_timeout": 2}
"""Limits libpq counts in whole seconds, and the least each may be: one that follows its
outer limit down is rounded down to whole seconds, and stops at that least."""


def tighten_inner(
    limits: Mapping[str, timedelta], given: set[str], *, for_job: bool = False
) -> dict[str, timedelta]:
    """`limits` (every time limit by name) with each inner limit not in `given` shortened,
    where it must be, to its outer limit less the margin (never below 1ms). `for_job`: the
    limits are a job's own, whose margin may shrink with them (see `job_margin`)."""
    out = dict(limits)
    for outer, inner, margin, extra in _INNER:
        spare = out[margin] if margin else timedelta(0)
        if for_job and margin:
            spare = job_margin(spare, out[outer])
        room = out[outer] - spare - (out[extra] if extra else timedelta(0))
        least = timedelta(seconds=MIN_DURATION)
        if inner in _WHOLE_SECONDS:
            room = timedelta(seconds=room // timedelta(seconds=1))
            least = timedelta(seconds=_WHOLE_SECONDS[inner])
        if inner not in given and out[inner] > room >= least:
            out[inner] = room
    return out


def job_margin(margin: timedelta, outer: timedelta) -> timedelta:
    """The margin inside a job's own limit: the deployment's margin, or half the limit when
    that is shorter than twice the margin. So a job with a 5s deadline gets 2.5s steps and
    1.25s requests: short jobs can have short limits, and they still nest."""
    return min(margin, outer / 2)


class Timeouts(BaseModel):
    """Time limits. Each inner limit is shorter than the one around it (see DESIGN.md).

    An inner limit left unset follows its outer one down: set only attempt_deadline to 90s
    and step_deadline becomes 85s (with the 5s margin) instead of refusing its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _unset_inner_limits_follow(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        try:
            given = {k: parse_duration(v) for k, v in data.items() if k in cls.model_fields}
        except ValueError:
            return data  # field validation names the bad value
        defaults = {k: f.default for k, f in cls.model_fields.items()}
        return {**data, **tighten_inner({**defaults, **given}, set(given))}

    attempt_deadline: Duration = Field(
        timedelta(seconds=240), description="An attempt is stopped after this long."
    )
    recovery_grace: Duration = Field(
        timedelta(seconds=360),
        description="After this long without a platform object, an attempt counts as lost.",
    )
    launch_grace: Duration = Field(
        timedelta(seconds=30),
        description="A launching attempt older than this is checked by recovery.",
    )
    lease_timeout: Duration = Field(
        timedelta(seconds=60),
        description="A running attempt without news (observation, heartbeat) this long is checked.",
    )
    reconcile_interval: Duration = Field(
        timedelta(seconds=10), description="How often the reconciler makes a pass."
    )
    operation_interval: Duration = Field(
        timedelta(seconds=1),
        description="How often each serve and api process looks for bulk operations to run"
        " (at once again while one has items left).",
    )
    margin: Duration = Field(
        timedelta(seconds=5),
        description="How much shorter an inner time limit must be than the one around it.",
    )
    cancel_grace: Duration = Field(
        timedelta(seconds=10),
        description="Time between the polite stop (SIGTERM) and the forced one (SIGKILL).",
    )
    dispatch_interval: Duration = Field(
        timedelta(seconds=1),
        description="A tick starts this often (start to start); at once while there is more.",
    )
    observe_interval: Duration = Field(
        timedelta(seconds=2), description="How often the dispatcher polls running attempts."
    )
    tick_deadline: Duration = Field(
        timedelta(milliseconds=500),
        description="A tick starts no new launch after this long; the rest go first next tick.",
    )
    tick_margin: Duration = Field(
        timedelta(milliseconds=100),
        description="The margin for the links between short limits: the tick's and the database's.",
    )
    heartbeat_interval: Duration = Field(
        timedelta(seconds=20),
        description="How often a job that sends heartbeats sends one (CORRAL_HEARTBEAT_INTERVAL),"
        " and how often each corral process beats in the loops table (three missed: stale).",
    )
    step_deadline: Duration = Field(
        timedelta(seconds=120), description="The longest one step of an attempt may take."
    )
    drain_timeout: Duration = Field(
        timedelta(seconds=30),
        description="After SIGTERM, how long a `corral worker` lets its running tasks finish"
        " before it asks them to checkpoint and hands them back (the pod's"
        " terminationGracePeriodSeconds must exceed it by the margin).",
    )
    http_request_timeout: Duration = Field(
        timedelta(seconds=30), description="The longest one HTTP request of a step may take."
    )
    database_wait: Duration = Field(
        timedelta(minutes=5),
        description="At start, how long serve, dispatcher and reconciler keep trying to reach"
        " a database that cannot be reached (with growing pauses) before they give up.",
    )
    database_connect_timeout: Duration = Field(
        timedelta(seconds=5),
        description="PostgreSQL: the longest making one connection may take (libpq's"
        " connect_timeout, in whole seconds, at least 2).",
    )
    database_tcp_timeout: Duration = Field(
        timedelta(seconds=10),
        description="PostgreSQL: a connection whose other end stays silent this long is"
        " dropped, on corral's side and on the server's (TCP keepalives, tcp_user_timeout),"
        " so the server ends a cut client's transaction and frees its row locks.",
    )
    database_lock_timeout: Duration = Field(
        timedelta(seconds=2),
        description="PostgreSQL: the longest a statement waits for a lock (lock_timeout);"
        " then it fails, and the work is tried again.",
    )
    database_statement_timeout: Duration = Field(
        timedelta(seconds=10),
        description="PostgreSQL: the longest one statement may run (statement_timeout).",
    )
    database_idle_timeout: Duration = Field(
        timedelta(seconds=10),
        description="PostgreSQL: the server ends a session that stays idle this long inside"
        " a transaction (idle_in_transaction_session_timeout), releasing its locks.",
    )
    database_transaction_timeout: Duration = Field(
        timedelta(seconds=20),
        description="PostgreSQL: corral gives up one call to the store (a transaction,"
        " connecting included) after this long without an answer; the backstop for when"
        " the network is gone and the server's own limits cannot say so.",
    )

    @field_validator(*_WHOLE_SECONDS)
    @classmethod
    def _whole_seconds(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        seconds, least = value.total_seconds(), _WHOLE_SECONDS[str(info.field_name)]
        if seconds < least or seconds != int(seconds):
            raise ValueError(f"{seconds:g}s: libpq counts it in whole seconds, at least {least}")
        return value


class BudgetSettings(BaseModel):
    """A retry budget per queue: a token bucket that retries draw from, so a failure of
    everything at once does not become a storm of retries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: float = Field(
        0.2, ge=0.0, le=10.0, description="Tokens each first attempt in the queue adds."
    )
    floor_per_minute: float = Field(
        10.0, gt=0.0, le=1_000_000.0, description="Tokens added per minute whatever the traffic."
    )
    burst: float = Field(100.0, ge=1.0, le=1_000_000.0, description="The most tokens kept.")


class RetrySettings(BaseModel):
    """How failed jobs are retried (backoff with full jitter), and when they stop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quarantine_after: int = Field(
        2,
        ge=1,
        le=100,
        description="Quarantine a job after this many consecutive attempts fail the same way.",
    )
    budget: BudgetSettings = BudgetSettings()
    base: Duration = Field(timedelta(seconds=1), description="The first retry waits up to this.")
    cap: Duration = Field(timedelta(minutes=5), description="No retry waits longer than this.")
    seed: int | None = Field(
        None,
        description="Seed for the jitter, for tests and replays only: every process with the"
        " same seed draws the same delays, which undoes the jitter between them.",
    )


def _uid_range(given: str) -> tuple[int, int]:
    """`START-END` as two uids; ValueError naming the rule."""
    start, sep, end = given.partition("-")
    if not sep or not start.isdigit() or not end.isdigit():
        raise ValueError(f"{given!r} is not START-END, e.g. 100000-165535")
    lo, hi = int(start), int(end)
    if not 1000 <= lo <= hi <= 4_294_967_294:
        raise ValueError(
            f"{given!r}: the uids must be 1000 <= START <= END <= 4294967294, clear of the"
            " system's accounts; pick a range no person's account uses, e.g. 100000-165535"
        )
    return lo, hi


class ProcessExecutorSettings(BaseModel):
    """The embedded `process` executor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path | None = Field(None, description="Run folders live here; default <state_dir>/runs.")
    retention: Duration = Field(
        timedelta(days=7),
        description="A finished run's folder (its logs, its exit) is removed this long after"
        " it finished; longer than timeouts.recovery_grace, so recovery always reads it first.",
    )
    log_bytes: int = Field(
        model.STREAM_BYTES,
        ge=0,
        le=1024 * 1024,
        description="How much of the end of a command's stdout, and of its stderr, the run log"
        " keeps when it ends.",
    )
    uid_range: str | None = Field(
        None,
        description="START-END, e.g. 100000-165535: the commands of tenants granted `process`"
        " each run under a uid and gid of their own from this range (corral runs as root)."
        " The operator's own process jobs run as corral's user.",
    )
    sandbox: Literal["bwrap"] | None = Field(
        None,
        description="`bwrap`: the commands of tenants granted `process` run in a bubblewrap"
        " sandbox (their own namespaces, the system read-only, none of corral's paths)."
        " corral refuses to start where bwrap is missing or cannot make namespaces.",
    )

    @field_validator("uid_range")
    @classmethod
    def _uids(cls, given: str | None) -> str | None:
        if given is not None:
            _uid_range(given)
        return given

    @property
    def uids(self) -> tuple[int, int] | None:
        """uid_range as its first and last uid."""
        return None if self.uid_range is None else _uid_range(self.uid_range)

    @property
    def strangers(self) -> bool:
        """Whether a tenant's process jobs can run as strangers to corral."""
        return self.uid_range is not None or self.sandbox is not None


class RetentionSettings(BaseModel):
    """How long what corral records is kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs: Duration = Field(
        timedelta(days=30),
        description="A job that succeeded, failed or was cancelled is removed, with its"
        " attempts, events and run logs, this long after it finished (by the reconciler)."
        " Quarantined jobs wait for a person and are kept.",
    )

    @field_validator("jobs")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than zero")
        return value


ALERT_CAUSES = (
    "quarantined",
    "failed",
    "lost",
    "unknown",
    "budget_empty",
    "schedule_late",
    "schedule_missed",
    "sla_missed",
    "consecutive_failures",
    "refused",
)
"""What a rule may fire `on`: a job quarantined or failed for good, an attempt lost or of
unknown class, a retry waiting for an empty budget, a firing late or missed, a job past
its SLA, `after` failures in a row of a schedule or queue, and a tenant's schedule's
firing refused (its tenant no longer granted its executor)."""

_EMAIL = re.compile(r"^[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+$|^[^@\s<>]+@localhost$")


def _web_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+", url):  # not echoed: it may hold a secret
        raise ValueError("must be an http:// or https:// URL")
    return url


class EmailChannel(BaseModel):
    """Alerts as e-mail, over SMTP (aiosmtplib)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["email"] = Field(description="email")
    smtp_url: str = Field(
        description="smtp://HOST:PORT or smtps://HOST:PORT (TLS from the start);"
        " user:password@ to log in."
    )
    sender: str = Field(alias="from", description="The From address.")
    to: tuple[str, ...] = Field(min_length=1, description="Who gets the messages.")
    starttls: bool | None = Field(
        None,
        description="smtp://: upgrade with STARTTLS before sending; unset, when the server"
        " offers it; false, never (then a password crosses in the clear).",
    )
    timeout: Duration = Field(timedelta(seconds=30), description="Most one delivery may take.")

    @field_validator("smtp_url")
    @classmethod
    def _smtp(cls, url: str) -> str:
        if not re.match(r"^smtps?://([^@/\s]+@)?[^@/:\s]+(:\d+)?/?$", url):
            raise ValueError(f"{_shown_url(url)!r} is not smtp://[user:password@]HOST[:PORT]")
        return url

    @field_validator("sender")
    @classmethod
    def _sender(cls, address: str) -> str:
        if not _EMAIL.match(address):
            raise ValueError(f"{address!r} is not an e-mail address")
        return address

    @field_validator("to")
    @classmethod
    def _to(cls, addresses: tuple[str, ...]) -> tuple[str, ...]:
        if bad := [a for a in addresses if not _EMAIL.match(a)]:
            raise ValueError(f"{bad[0]!r} is not an e-mail address")
        return addresses


class SlackChannel(BaseModel):
    """Alerts to a Slack incoming webhook, as Block Kit messages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["slack"] = Field(description="slack")
    webhook_url: str = Field(description="The incoming webhook's URL (a secret: never shown).")
    timeout: Duration = Field(timedelta(seconds=30), description="Most one delivery may take.")

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _web_url(url)


class WebhookChannel(BaseModel):
    """Alerts as a JSON POST to any URL, signed like HTTP jobs (Standard Webhooks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["webhook"] = Field(description="webhook")
    url: str = Field(description="Where the alert is POSTed.")
    secret: str | None = Field(
        None, description="whsec_... signing secret; unsigned without one. Never shown."
    )
    timeout: Duration = Field(timedelta(seconds=30), description="Most one delivery may take.")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _web_url(url)


AlertChannel = Annotated[EmailChannel | SlackChannel | WebhookChannel, Field(discriminator="kind")]


class AlertMatch(BaseModel):
    """Which jobs a rule is about; every key given must match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: str | None = Field(None, description="Only jobs of this queue.")
    schedule: str | None = Field(None, description="Only the jobs of this schedule's firings.")
    tenant: str | None = Field(None, description="Only jobs of this tenant.")
    executor: str | None = Field(None, description="Only jobs of this executor.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Only jobs with each of these labels, so valued."
    )


class AlertRule(BaseModel):
    """When to tell whom: `on` these causes, for jobs that `match`, through `channels`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on: tuple[Literal[ALERT_CAUSES], ...] = Field(  # type: ignore[valid-type]
        min_length=1, description="The causes it fires on (see the Alerts guide)."
    )
    match: AlertMatch = Field(AlertMatch(), description="Which jobs it is about.")
    channels: tuple[str, ...] = Field(min_length=1, description="Where its messages go.")
    throttle: Duration = Field(
        timedelta(minutes=10),
        description="Per subject (the schedule, or the queue), one message a window; the"
        " rest go in one digest at its end.",
    )
    after: int = Field(3, ge=1, description="consecutive_failures: how many in a row.")
    late_by: Duration = Field(
        timedelta(minutes=2),
        description="schedule_late: how long after its nominal time a firing's job may start.",
    )


class AlertsSettings(BaseModel):
    """Who is told what went wrong (`[alerts.channels.NAME]`, `[alerts.rules.NAME]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    channels: dict[str, AlertChannel] = Field(
        default_factory=dict,
        description="Where messages go, by name: `kind` email (smtp_url, from, to, starttls),"
        " slack (webhook_url) or webhook (url, secret).",
    )
    rules: dict[str, AlertRule] = Field(
        default_factory=dict,
        description="When to tell whom, by name: `on` (causes), `match` (queue, schedule,"
        " tenant, executor, labels), `channels`, `throttle`.",
    )
    base_url: str | None = Field(
        None, description="corral's web address: messages link to the job under it."
    )
    heartbeat_url: str | None = Field(
        None,
        description="Pinged (GET) after every reconciler pass: a dead man's switch for an"
        " outside monitor.",
    )

    @field_validator("base_url", "heartbeat_url")
    @classmethod
    def _urls(cls, url: str | None) -> str | None:
        return None if url is None else _web_url(url)

    @model_validator(mode="after")
    def _known_channels(self) -> AlertsSettings:
        for name, rule in self.rules.items():
            if unknown := [c for c in rule.channels if c not in self.channels]:
                known = ", ".join(sorted(self.channels)) or "none"
                raise ValueError(
                    f"rules.{name}.channels: unknown channel {unknown[0]!r}; defined: {known}"
                )
        return self


def _shown_url(url: str) -> str:
    """A URL with its password hidden, for an error message."""
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:[redacted]@", url)


class SecretsSettings(BaseModel):
    """The secrets HTTP requests are signed with (`corral secrets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rotation_overlap: Duration = Field(
        timedelta(hours=24),
        description="After a rotation, how long the previous secret signs alongside the new"
        " one, so receivers can move to the new one at their own pace.",
    )


class HttpExecutorSettings(BaseModel):
    """The `http` executor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_networks: tuple[str, ...] = Field(
        (),
        description="Addresses requests may reach although they are not public (loopback,"
        " private, link-local...), each ADDRESS[/PREFIX][:PORT[-PORT]] (IPv6 in brackets"
        ' with ports): e.g. ["127.0.0.1:8080"] for a local receiver. A network without'
        " ports opens 80 and 443 only. Empty: public addresses only (on any port).",
    )
    body_bytes: int = Field(
        model.STREAM_BYTES,
        ge=0,
        le=16 * 1024 * 1024,
        description="How much of a response body the run log keeps (its first bytes).",
    )
    max_request_body_bytes: int = Field(
        256 * 1024,
        ge=0,
        le=16 * 1024 * 1024,
        description="The largest request body (`body`, or `json` as sent) an HTTP job may"
        " carry, refused at submit past it; its payload keeps max_payload_bytes.",
    )

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        for net in networks:
            netrules.parse(net)
        return networks


POD_START_TIMEOUT = timedelta(minutes=2)
"""How long a pod may take to start when executors.kubernetes.pod_start_timeout is unset
(and the attempt deadline leaves room for it): long enough to pull a large image."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


class Toleration(BaseModel):
    """A Kubernetes toleration (core/v1 Toleration)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = Field(None, description="The taint key; unset with Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="Equal: the taint's value must be `value`; Exists: any value."
    )
    value: str | None = Field(None, description="The taint value to match (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint effect to match; unset: every effect."
    )

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        if self.key is not None and (problem := model.label_problem(self.key, self.value or "")):
            raise ValueError(f"toleration: {problem}")
        return self

    def manifest(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Placement(BaseModel):
    """Where a class of jobs runs: e.g. `critical` on the on-demand pool, `batch` on spot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels a pod of this class must be on."
    )
    tolerations: tuple[Toleration, ...] = Field(
        (), description="Taints a pod of this class tolerates (core/v1 Toleration)."
    )
    priority_class: str | None = Field(None, description="A PriorityClass name.")
    resources: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Requests and limits of this class's jobs (`{requests: {cpu: 2}}`), in"
        " place of executors.kubernetes.default_resources resource by resource; a job's own"
        " win over them. Checked as a job's are, when a job names the class.",
    )
    pod_security_context: dict[str, Any] = Field(
        default_factory=dict,
        description="core/v1 PodSecurityContext fields over corral's restricted defaults"
        " (e.g. `{runAsUser: 1000}`), within executors.kubernetes.pod_security.",
    )
    security_context: dict[str, Any] = Field(
        default_factory=dict,
        description="core/v1 SecurityContext fields of the job's container over corral's"
        " restricted defaults, within executors.kubernetes.pod_security.",
    )

    @field_validator("node_selector")
    @classmethod
    def _selector_labels(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if problem := model.label_problem(key, value):
                raise ValueError(f"node_selector: {problem}")
        return selector

    @field_validator("priority_class")
    @classmethod
    def _priority_class(cls, name: str | None) -> str | None:
        if name is not None and not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{name!r} is not a DNS-1123 subdomain")
        return name


MAX_NAME_PREFIX = 24
"""The longest executors.kubernetes.name_prefix: with a job id and an attempt number after
it, and the pod's suffix Kubernetes adds, a name stays within 63 characters."""


class KubernetesExecutorSettings(BaseModel):
    """The `kubernetes` executor: each attempt is a batch/v1 Job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("default", description="Where Jobs are created.")
    namespaces: tuple[str, ...] | None = Field(
        None,
        description="The namespaces a job's spec may name (`namespace`). Unset: `namespace`"
        " alone. corral's Role must be bound in each (`corral deploy rbac`).",
    )
    name_prefix: str = Field(
        "corral",
        description="What the names of the Jobs, Workflows, ConfigMaps and Secrets corral"
        " makes start with (`corral-42-1`). Two corral installations that share a namespace"
        " each need their own; each reads only its own objects (the label"
        " corral.dev/installation), and a name taken by the other is a launch conflict.",
    )
    own_service_account: str = Field(
        "corral",
        description="The service account corral itself runs as (its token creates Jobs): no"
        " job may run as it, so it may not be service_account nor in allowed_service_accounts.",
    )
    pod_security: Literal["restricted", "baseline"] = Field(
        "restricted",
        description="The Pod Security Standard every pod corral makes meets: its defaults are"
        " always restricted's; a job or placement class may loosen them only within this level.",
    )
    default_resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        description="Requests and limits of every container that names none for a resource,"
        " so that no pod is BestEffort (first evicted, unbounded).",
    )
    max_resources: dict[str, str] = Field(
        default_factory=dict,
        description="The most one container may ask for of each resource named, as a request"
        ' or a limit alike (`{cpu = "8", memory = "32Gi", "nvidia.com/gpu" = "2"}`): one'
        " number a resource, since a request is never above its limit. A job whose spec asks"
        " more is refused at submit; default_resources or a placement class above it is a"
        " settings error at start. Empty: no ceiling.",
    )
    argo_pod_gc: Literal[
        "OnPodCompletion", "OnPodSuccess", "OnWorkflowCompletion", "OnWorkflowSuccess", "Never"
    ] = Field(
        "OnPodCompletion",
        description="When Argo deletes a Workflow's pods (its podGC strategy); corral reads an"
        " attempt's outcome from the Workflow, which stays for ttl_after_finished."
        " Never: no podGC.",
    )
    argo_pod_gc_delay: Duration = Field(
        timedelta(minutes=2),
        description="How long Argo's podGC keeps a Workflow's pod after it ends"
        " (deleteDelayDuration, Argo 3.5 and later): corral reads the end of its log into the"
        " attempt's run log in that time; a pod gone before leaves only Argo's message.",
    )
    service_account: str | None = Field(
        None,
        description="Default service account of Jobs.",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
    )
    token_accounts: tuple[str, ...] = Field(
        (),
        description="The service accounts whose Job pods mount their API token; every other"
        " pod gets automountServiceAccountToken: false (a job needs no token to run).",
    )
    run_as_user: int = Field(
        65532,
        ge=1,
        description="The uid a pod runs as when neither its spec nor its placement says:"
        " non-root by number, so an image that declares root still starts under"
        " runAsNonRoot.",
    )
    allowed_service_accounts: tuple[str, ...] | None = Field(
        None,
        description="The service accounts a job's spec may name (`service_account`). Unset:"
        " the configured service_account alone. Any other is refused at submit: an account"
        " such as corral's own, which can create Jobs, must never run a job.",
    )
    ttl_after_finished: Duration = Field(
        timedelta(days=1),
        description="A finished Job is kept this long: it must outlive a corral outage"
        " (longer than timeouts.recovery_grace), or its outcome is gone before recovery reads it.",
    )
    termination_grace: Duration = Field(
        timedelta(seconds=30), description="terminationGracePeriodSeconds of each pod."
    )
    pod_start_timeout: Duration | None = Field(
        None,
        description="How long an attempt's pod (a Job's or a Workflow's) may take to start"
        " before the attempt fails with the reason the pod waits for (an image that cannot"
        " be pulled, a missing Secret or ConfigMap: permanent; no node to run on: transient)."
        " Unset: 2 minutes, or timeouts.attempt_deadline less timeouts.margin when that is"
        " shorter.",
    )
    placements: dict[str, Placement] = Field(
        default_factory=dict, description="Placement classes by name; a job names one."
    )
    default_placement: str | None = Field(None, description="For jobs that name none.")
    kubeconfig: Path | None = Field(
        None,
        description="A kubeconfig file; unset: the pod's service account in a cluster,"
        " else ~/.kube/config.",
    )
    context: str | None = Field(None, description="The kubeconfig context to use.")
    request_timeout: Duration = Field(
        timedelta(seconds=10),
        description="Client-side limit of one API request: a cut connection fails, never hangs.",
    )
    watch_timeout: Duration = Field(
        timedelta(minutes=4),
        description="How long one watch request lasts (server side) before it is renewed.",
    )
    database_url_secret: str | None = Field(
        None,
        description="`secret-name/key` of a Secret holding the URL pods use for `corral"
        " heartbeat` (CORRAL_DATABASE_URL); the URL itself never goes into a Job.",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-._a-zA-Z0-9]+$",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a DNS-1123 label (a-z, 0-9, '-', at most 63)")
        return value

    @field_validator("allowed_service_accounts")
    @classmethod
    def _accounts(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in names or ():
            if not _DNS_SUBDOMAIN.match(name):
                raise ValueError(f"{name!r} is not a DNS-1123 subdomain")
        return names

    @field_validator("name_prefix")
    @classmethod
    def _name_prefix(cls, prefix: str) -> str:
        if len(prefix) > MAX_NAME_PREFIX or not _DNS_LABEL.match(prefix):
            raise ValueError(
                f"{prefix!r}: a name prefix is a DNS-1123 label (a-z, 0-9, '-') of at most"
                f" {MAX_NAME_PREFIX} characters, e.g. corral-staging"
            )
        return prefix

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in names or ():
            if not _DNS_LABEL.match(name):
                raise ValueError(f"{name!r} is not a DNS-1123 label (a-z, 0-9, '-', at most 63)")
        return names

    @property
    def namespaces_allowed(self) -> tuple[str, ...]:
        """The namespaces a job may name: `namespace` first, then the rest of `namespaces`."""
        return (self.namespace, *(n for n in self.namespaces or () if n != self.namespace))

    @model_validator(mode="after")
    def _own_account_never_runs_jobs(self) -> KubernetesExecutorSettings:
        if self.own_service_account in (self.service_account, *self.accounts_allowed):
            raise ValueError(
                f"service_account and allowed_service_accounts may not name corral's own"
                f" account {self.own_service_account!r} (own_service_account): its token"
                " creates Jobs, so a job that ran as it could do anything corral can"
            )
        return self

    @model_validator(mode="after")
    def _namespace_allowed(self) -> KubernetesExecutorSettings:
        if self.namespaces is not None and self.namespace not in self.namespaces:
            raise ValueError(
                f"namespaces must include namespace {self.namespace!r} (where jobs that name"
                " none run)"
            )
        return self

    @property
    def accounts_allowed(self) -> tuple[str, ...]:
        """The service accounts a job may name: allowed_service_accounts, by default the
        configured service_account alone."""
        if self.allowed_service_accounts is not None:
            return self.allowed_service_accounts
        return (self.service_account,) if self.service_account else ()

    @model_validator(mode="after")
    def _default_account_allowed(self) -> KubernetesExecutorSettings:
        if self.service_account and self.service_account not in self.accounts_allowed:
            raise ValueError(
                f"service_account {self.service_account!r} must be one of"
                " allowed_service_accounts (the jobs that name none run as it)"
            )
        return self

    @model_validator(mode="after")
    def _default_is_a_class(self) -> KubernetesExecutorSettings:
        if self.default_placement is not None and self.default_placement not in self.placements:
            raise ValueError(
                f"default_placement {self.default_placement!r} is not one of the placements"
                f" ({', '.join(sorted(self.placements)) or 'none configured'})"
            )
        return self


class ExecutorSettings(BaseModel):
    """Which executors this corral runs, and their settings. Executors outside corral (see
    corral.executors.registry) keep their settings in a table named after their kind,
    `[executors.<kind>]`, which they read with `section(kind)`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: tuple[str, ...] = Field(
        ("process", "http"),
        description="Executor kinds to run, from the registered ones (`corral.executors`"
        " entry points; corral's own: process, http, kubernetes, argo).",
    )
    process: ProcessExecutorSettings = ProcessExecutorSettings()
    kubernetes: KubernetesExecutorSettings = KubernetesExecutorSettings()
    http: HttpExecutorSettings = HttpExecutorSettings()

    @field_validator("enabled")
    @classmethod
    def _registered(cls, enabled: tuple[str, ...]) -> tuple[str, ...]:
        known = entrypoints.names(entrypoints.EXECUTORS)
        if unknown := [kind for kind in enabled if kind not in known]:
            raise ValueError(
                f"unknown executor {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
            )
        if len(set(enabled)) != len(enabled):
            raise ValueError("an executor is named twice")
        return enabled

    @model_validator(mode="after")
    def _sections_are_executors(self) -> ExecutorSettings:
        known = entrypoints.names(entrypoints.EXECUTORS)
        for name in self.model_extra or {}:
            if name not in known:
                raise ValueError(
                    f"{name}: unknown setting (not a registered executor;"
                    f" known: {', '.join(known)})"
                )
        return self

    def section(self, kind: str) -> Mapping[str, Any]:
        """The `[executors.<kind>]` table of an executor outside corral (empty if unset)."""
        found = (self.model_extra or {}).get(kind, {})
        return found if isinstance(found, Mapping) else {}


_POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_DB_SCHEMES = re.compile(r"^(sqlite|postgresql(\+psycopg)?)://")


@functools.lru_cache(maxsize=16)
def _url_for_jobs(url: str, cwd: str) -> str:
    prefix = "sqlite:///"
    path = url.removeprefix(prefix)
    if url.startswith(prefix) and not path.startswith(("/", ":memory:")):
        return prefix + os.path.join(cwd, path)
    return url


class Settings(BaseSettings):
    """Everything corral can be told. Read with Settings.load()."""

    model_config = SettingsConfigDict(
        env_prefix="CORRAL_", env_nested_delimiter="__", extra="forbid", frozen=True
    )
    _toml_file: ClassVar[Path | None] = None
    _check_chain: ClassVar[bool] = True
    _attempts_served: bool = PrivateAttr(False)
    """This process answers the attempt API on `attempt_socket` (see `serving_attempts`)."""

    database_url: str = Field("sqlite:///./corral.db", description="SQLite file or PostgreSQL URL.")
    state_dir: Path = Field(Path(".corral"), description="Local state: run folders, logs.")
    claim_batch_limit: int = Field(100, ge=1, le=10_000, description="Most jobs claimed per tick.")
    pools: dict[str, int] = Field(
        default_factory=dict,
        description="Named pools and their slots: at most that many of a pool's jobs run at"
        " once (e.g. backfill = 2). A job names its pool; jobs without one are not capped.",
    )
    tenants: dict[str, TenantSettings] = Field(
        default_factory=dict,
        description='Per tenant (`[tenants.NAME]`; `[tenants."*"]` for every tenant not'
        " named): max_running, the most of its jobs that run at once, checked at the claim as"
        " pools are; executors, what its tokens and dashboard users may submit and schedule"
        ' (default ["http", "python"]).',
    )
    recovery_batch_limit: int = Field(
        500, ge=1, le=100_000, description="Most attempts one reconciler pass looks at."
    )
    operation_batch_limit: int = Field(
        200,
        ge=1,
        le=10_000,
        description="Most jobs of a bulk operation changed in one transaction (one step).",
    )
    launch_concurrency: int = Field(16, ge=1, le=1_000, description="Launches in flight at once.")
    max_payload_bytes: int = Field(
        1 << 20, ge=1, description="Largest accepted payload (JSON bytes)."
    )
    default_max_attempts: int = Field(
        3, ge=1, le=1_000, description="Attempts a job gets by default."
    )
    api_url: str | None = Field(
        None,
        description="Where jobs reach corral's API: passed to attempts as CORRAL_API_URL with"
        " an attempt token (CORRAL_ATTEMPT_TOKEN) in place of the database's URL.",
    )
    attempt_key: str | None = Field(
        None,
        repr=False,
        min_length=32,
        description="The key attempt tokens are signed with. Unset: made once and kept in the"
        " store, shared by every corral process on it.",
    )
    jobs_get_database_url: bool = Field(
        False,
        description="Pass database_url to the operator's process jobs as CORRAL_DATABASE_URL"
        " (and executors.kubernetes.database_url_secret to pods). Off: jobs reach corral"
        " through the attempt API only (api_url, or for process jobs the Unix socket their"
        " dispatcher answers), holding a token good for their own attempt. Never passed"
        " with api_url, nor to a tenant's process jobs.",
    )
    log_level: str = Field(
        "INFO",
        pattern=r"^(DEBUG|INFO|WARNING|ERROR)$",
        description="How much corral's loops log: DEBUG, INFO, WARNING or ERROR.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="How corral's loops log to standard error: text (drawn on a terminal, a"
        " plain line a record to a file or pipe) or json (one JSON object a line). URLs in"
        " every record are redacted.",
    )
    health_file: Path | None = Field(
        None,
        description="When set, the dispatcher and reconciler loops note every finished tick"
        " and pass in this file, for `corral health` (e.g. Kubernetes exec probes).",
    )
    api: ApiSettings = ApiSettings()
    timeouts: Timeouts = Timeouts()
    retry: RetrySettings = RetrySettings()
    secrets: SecretsSettings = SecretsSettings()
    retention: RetentionSettings = RetentionSettings()
    alerts: AlertsSettings = AlertsSettings()
    executors: ExecutorSettings = ExecutorSettings()

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, url: str) -> str:
        if not _DB_SCHEMES.match(url):
            raise ValueError(
                f"{url!r} is not a supported database URL: use sqlite:///PATH or"
                " postgresql+psycopg://USER@HOST:PORT/DB"
            )
        if url.startswith("sqlite:"):
            path = url.split("://", 1)[1].removeprefix("/").partition("?")[0]
            if path in ("", ":memory:"):
                raise ValueError(
                    f"{url!r} is an in-memory SQLite database, which corral's connections and"
                    " processes cannot share: give a file, e.g. sqlite:///./corral.db"
                )
        return url

    @field_validator("pools")
    @classmethod
    def _pool_slots(cls, pools: dict[str, int]) -> dict[str, int]:
        for name, slots in pools.items():
            if not _POOL_NAME.match(name):
                raise ValueError(f"pool {name!r}: a name is 1-200 characters of [A-Za-z0-9_.-]")
            if not 1 <= slots <= 100_000:
                raise ValueError(f"pool {name!r}: slots must be between 1 and 100000, not {slots}")
        return pools

    @model_validator(mode="after")
    def _grants(self) -> Settings:
        broken = tenancy.violations(
            self.tenants,
            enabled=self.executors.enabled,
            strangers=self.executors.process.strangers,
            namespaces=self.executors.kubernetes.namespaces_allowed,
        )
        if broken:
            raise ValueError("; ".join(broken))
        return self

    @model_validator(mode="after")
    def _limits_nest(self) -> Settings:
        if self._check_chain and (broken := chain_violations(self)):
            raise ValueError("; ".join(broken))
        return self

    @property
    def pod_start_timeout(self) -> timedelta:
        """executors.kubernetes.pod_start_timeout, or, unset, POD_START_TIMEOUT shortened
        to timeouts.attempt_deadline less timeouts.margin (as an unset inner limit follows
        its outer one down)."""
        given = self.executors.kubernetes.pod_start_timeout
        if given is not None:
            return given
        room = self.timeouts.attempt_deadline - self.timeouts.margin
        return min(POD_START_TIMEOUT, max(room, timedelta(seconds=MIN_DURATION)))

    @property
    def database_url_for_jobs(self) -> str | None:
        """database_url as a job sees it: a relative SQLite path made absolute, since a job
        runs in a folder of its own."""
        if not self.jobs_get_database_url or self.api_url:
            return None
        return _url_for_jobs(self.database_url, os.getcwd())

    @property
    def settings_file(self) -> Path | None:
        """The TOML file these settings were read from, if any (Settings.load)."""
        found = type(self)._toml_file
        return None if found is None else found.absolute()

    @property
    def attempt_socket(self) -> Path:
        """Where a dispatcher answers its process jobs' attempt API when api_url is unset: in
        a folder of its own, which a sandbox shows whole (a socket made anew after a restart
        is then seen by the commands that run on)."""
        return self.state_dir.absolute() / "attempt-api" / "attempts.sock"

    def serving_attempts(self) -> Settings:
        """These settings, in a process that answers the attempt API on `attempt_socket`:
        its process jobs then get CORRAL_API_URL naming it (see `local_api_url`)."""
        made = self.model_copy()
        made._attempts_served = True
        return made

    @property
    def local_api_url(self) -> str | None:
        """CORRAL_API_URL for this process's process jobs when api_url is unset: the Unix
        socket it answers on, if it does."""
        return f"unix:{self.attempt_socket}" if self._attempts_served else None

    @property
    def sqlite_file(self) -> Path | None:
        """The SQLite database's file, as database_url names it; None for PostgreSQL."""
        url = self.database_url
        if not url.startswith("sqlite:"):
            return None
        return Path(url.split("://", 1)[1].removeprefix("/").partition("?")[0])

    @property
    def process_root(self) -> Path:
        return self.executors.process.root or self.state_dir / "runs"

    @property
    def tenant_caps(self) -> dict[str, int]:
        """The tenants with a max_running, and it."""
        return {
            name: t.max_running for name, t in self.tenants.items() if t.max_running is not None
        }

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml_file))
        return tuple(sources)

    @classmethod
    def load(
        cls, config_file: Path | None = None, *, check_chain: bool = True, **overrides: Any
    ) -> Settings:
        """Read settings from `config_file` (default ./corral.toml if present) and the env.

        `check_chain=False` reads settings whose time limits do not nest, so that `corral
        check` can show what is wrong; everything else refuses them.
        """
        path = config_file if config_file is not None else DEFAULT_CONFIG_FILE
        if config_file is not None and not path.is_file():
            raise errors.ConfigError(f"config file {str(path)!r} does not exist")
        if misspelt := misspelt_variables(os.environ):
            raise errors.ConfigError("; ".join(misspelt))
        source = type(
            cls.__name__,
            (cls,),
            {"_toml_file": path if path.is_file() else None, "_check_chain": check_chain},
        )
        try:
            settings: Settings = source(**overrides)
            return settings
        except ValidationError as exc:
            raise errors.ConfigError(
                describe(exc, origin=str(path) if path.is_file() else None)
            ) from None
        except (ValueError, OverflowError) as exc:  # TOML syntax, an env value that is not JSON
            raise errors.ConfigError(f"cannot read settings: {exc}") from None


# --- environment variables -----------------------------------------------------------------

NOT_SETTINGS = frozenset({*model.ATTEMPT_ENV, failpoints.ENV, "CORRAL_CHAOS_SEED"})
"""CORRAL_* variables that are not settings: what corral gives attempts, its failpoints,
and its own tests' (as is every CORRAL_TEST_* variable)."""


def misspelt_variables(env: Mapping[str, str]) -> list[str]:
    """One message per CORRAL_* variable that is not a setting but is close to the name of
    one (a typo would otherwise be ignored, and its setting silently left at its default).
    Variables not close to any setting are left alone: they may be someone else's."""
    fields = Settings.model_fields
    top = {f"CORRAL_{name.upper()}" for name in fields}
    groups = {
        f"CORRAL_{name.upper()}"
        for name, f in fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }
    found = []
    for var in sorted(env):
        if not var.startswith("CORRAL_") or var in NOT_SETTINGS or var.startswith("CORRAL_TEST_"):
            continue
        head, nested, rest = var.partition("__")
        if var in top or (nested and head in groups):
            continue  # a setting (a nested one's own name is checked by the model)
        near = difflib.get_close_matches(head, groups if nested else top | NOT_SETTINGS, 1, 0.8)
        if near and (near[0] in top or nested):
            meant = f"{near[0]}__{rest}" if nested else near[0]
            found.append(f"{var} is not a setting: did you mean {meant}?")
    return found


# --- the chain of limits ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """One relation of the chain: `inner` (plus `extra`) must stay below `outer`.

    A strict link needs at least the setting named by `margin` to spare; a loose one
    (margin None) only `<=`. A `postgres_only` link is about corral's own connections to
    PostgreSQL: it is checked only when database_url is a PostgreSQL one (SQLite uses none
    of those limits), and always with corral's own settings (a job's tighter limits do not
    make corral's transactions any shorter). A `cluster_only` link is about pods: checked
    only when the kubernetes or argo executor is enabled.
    """

    inner: str
    outer: str
    why: str
    margin: str | None = "timeouts.margin"
    extra: str | None = None
    postgres_only: bool = False
    deployment_only: bool = False  # about corral's own processes: a job's limits do not apply
    cluster_only: bool = False  # about pods: checked only when kubernetes or argo is enabled


CHAIN = (
    Link(
        "timeouts.http_request_timeout",
        "timeouts.step_deadline",
        why="a step must outlive the requests it makes, or it fails where a request would",
    ),
    Link(
        "timeouts.step_deadline",
        "timeouts.attempt_deadline",
        why="an attempt must outlive its longest step",
    ),
    Link(
        "timeouts.attempt_deadline",
        "timeouts.recovery_grace",
        extra="timeouts.cancel_grace",
        why="an attempt still being stopped at its deadline must not be taken for lost"
        " and launched a second time",
    ),
    Link(
        "timeouts.attempt_deadline",
        "timeouts.recovery_grace",
        extra="executors.kubernetes.termination_grace",
        cluster_only=True,
        why="a pod stopped at its deadline runs on for its termination grace: it must have"
        " ended before recovery may take its attempt for lost and run the job beside it",
    ),
    Link(
        "executors.kubernetes.pod_start_timeout",
        "timeouts.attempt_deadline",
        deployment_only=True,
        why="a pod that never starts must fail with the reason it waits for, not as an"
        " attempt past its deadline (a job's shorter deadline shortens it for that job)",
    ),
    Link(
        "timeouts.drain_timeout",
        "timeouts.attempt_deadline",
        deployment_only=True,
        why="a worker stopping must hand its tasks back before their attempts' deadline, or"
        " recovery stops them as timed out and charges an attempt for a rollout",
    ),
    Link(
        "timeouts.heartbeat_interval",
        "timeouts.lease_timeout",
        why="a lease must outlast the gap between two heartbeats, or a healthy job looks silent",
    ),
    Link(
        "timeouts.lease_timeout",
        "timeouts.recovery_grace",
        margin=None,
        why="recovery must look at a quiet attempt before it may call it lost",
    ),
    Link(
        "timeouts.tick_deadline",
        "timeouts.dispatch_interval",
        margin="timeouts.tick_margin",
        why="a tick must end before the next one is due",
    ),
    Link(
        "timeouts.tick_deadline",
        "timeouts.launch_grace",
        margin="timeouts.tick_margin",
        why="recovery must not take an attempt for stuck while its own tick is launching it",
    ),
    Link(
        "timeouts.recovery_grace",
        "executors.process.retention",
        why="a finished run must stay until recovery has read how it ended",
    ),
    Link(
        "timeouts.recovery_grace",
        "executors.kubernetes.ttl_after_finished",
        why="a finished Kubernetes Job must outlive a corral outage, or its outcome is deleted"
        " before recovery can read it",
    ),
    Link(
        "claim_batch_limit",
        "recovery_batch_limit",
        extra="claim_batch_limit",
        margin=None,
        why="one reconciler pass must be able to repair every attempt of a tick that failed"
        " half-way, and of the next tick's claim, made while that tick launched",
    ),
    Link(
        "timeouts.database_lock_timeout",
        "timeouts.database_statement_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="a statement kept waiting for a lock must fail as a lock wait, which says what"
        " held it up, before it fails as a slow statement",
    ),
    Link(
        "timeouts.database_statement_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="the server must stop a slow statement, and say why, before corral gives up"
        " waiting for its answer",
    ),
    Link(
        "timeouts.database_connect_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="connecting is part of a call to the store: a server that cannot be reached must"
        " fail as such before the call is given up",
    ),
    Link(
        "timeouts.database_tcp_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="a connection cut in the middle of a call must be found dead, freeing the thread"
        " that waits on it, before the call is given up; or given-up calls pile up in the"
        " store's threads",
    ),
    Link(
        "timeouts.database_idle_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="the server must end the transaction of a client gone silent, and free its row"
        " locks, before that client gives the call up and tries again behind those locks",
    ),
    Link(
        "timeouts.database_transaction_timeout",
        "timeouts.launch_grace",
        extra="timeouts.tick_deadline",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="a claim whose answer comes late must be given up, or its attempts launched,"
        " before recovery looks at them",
    ),
    Link(
        "timeouts.database_transaction_timeout",
        "timeouts.lease_timeout",
        margin=None,
        postgres_only=True,
        why="a write that renews a lease must end, or be given up, within the lease",
    ),
)

JOB_LIMITS = (
    "http_request_timeout",
    "step_deadline",
    "attempt_deadline",
    "heartbeat_interval",
    "lease_timeout",
)
"""The time limits a job may tighten for itself (never loosen)."""


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """A link of the chain with this configuration's values, in whole units (microseconds
    for durations, so that a limit that meets the rule exactly is not refused by rounding)."""

    link: Link
    inner: int
    extra: int
    outer: int
    needed: int  # the margin for a strict link, else 0
    applies: bool = True  # False: a PostgreSQL link, on SQLite

    @property
    def spare(self) -> int:
        return self.outer - self.inner - self.extra

    @property
    def ok(self) -> bool:
        return self.spare >= self.needed

    def show(self, units: int) -> str:
        """`units` as a person reads them: seconds for time limits, counts otherwise."""
        if "timeouts." in (self.link.inner[:9], self.link.outer[:9]):
            return f"{units / 1_000_000:g}s"
        return f"{units:g}"


def chain(
    settings: Settings, limits: Mapping[str, timedelta] | None = None, *, for_job: bool = False
) -> list[LinkCheck]:
    """Every link of the chain, with this configuration's values; `limits` replaces some
    time limits (a job's own, by name without `timeouts.`) in all but PostgreSQL links.
    `for_job`: a link whose outer limit is one a job sets needs only the job's margin
    (`job_margin`)."""
    replaced = {f"timeouts.{name}": value for name, value in (limits or {}).items()}
    postgres = not settings.database_url.startswith("sqlite:")
    cluster = bool({"kubernetes", "argo"} & set(settings.executors.enabled))

    def check(link: Link) -> LinkCheck:
        def value(dotted: str) -> Any:
            if dotted in replaced and not (link.postgres_only or link.deployment_only):
                return replaced[dotted]
            return _get(settings, dotted)

        def needed() -> int:
            if link.margin is None:
                return 0
            margin = value(link.margin)
            job_outer = link.outer.removeprefix("timeouts.") in JOB_LIMITS
            if for_job and job_outer and not link.postgres_only:
                margin = job_margin(margin, value(link.outer))
            return _units(margin)

        return LinkCheck(
            link,
            inner=_units(value(link.inner)),
            extra=_units(value(link.extra)) if link.extra else 0,
            outer=_units(value(link.outer)),
            needed=needed(),
            applies=(postgres or not link.postgres_only) and (cluster or not link.cluster_only),
        )

    return [check(link) for link in CHAIN]


def chain_violations(
    settings: Settings, limits: Mapping[str, timedelta] | None = None, *, for_job: bool = False
) -> list[str]:
    """One message per broken link, naming both settings, their values and the margin."""
    out = []
    for c in chain(settings, limits, for_job=for_job):
        if c.ok or not c.applies:
            continue
        link = c.link
        inner = f"{link.inner} ({c.show(c.inner)})"
        if link.extra:
            inner += f" + {link.extra} ({c.show(c.extra)})"
        rule = (
            f"at least {c.show(c.needed)} ({link.margin}) less than" if link.margin else "at most"
        )
        out.append(f"{inner} must be {rule} {link.outer} ({c.show(c.outer)}): {link.why}")
    return out


_FOLLOWING = {"executors.kubernetes.pod_start_timeout": "pod_start_timeout"}
"""Settings that, unset, follow another limit: the Settings property of their value."""


def _get(settings: Settings, dotted: str) -> Any:
    if dotted in _FOLLOWING:
        return getattr(settings, _FOLLOWING[dotted])
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _units(value: Any) -> int:
    return value // timedelta(microseconds=1) if isinstance(value, timedelta) else int(value)


# --- a job's own policy ---------------------------------------------------------------------------


class ExitCodes(BaseModel):
    """Which exit codes a failure rule matches (Kubernetes' podFailurePolicy shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operator: Literal["In", "NotIn"]
    values: tuple[int, ...] = Field(min_length=1, max_length=255)

    @field_validator("values")
    @classmethod
    def _codes(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 0 <= v <= 255 for v in values):
            raise ValueError("exit codes are 0-255")
        if len(set(values)) != len(values):
            raise ValueError("exit codes must not repeat")
        return tuple(sorted(values))

    @model_validator(mode="after")
    def _no_zero_in(self) -> ExitCodes:
        if self.operator == "In" and 0 in self.values:
            raise ValueError("0 is success, not a failure: it cannot be used with operator In")
        return self

    def match(self, code: int) -> bool:
        return (code in self.values) == (self.operator == "In")


class HttpStatuses(BaseModel):
    """Which HTTP statuses a failure rule matches (in the shape of ExitCodes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operator: Literal["In", "NotIn"]
    values: tuple[int, ...] = Field(min_length=1, max_length=500)

    @field_validator("values")
    @classmethod
    def _statuses(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 100 <= v <= 599 for v in values):
            raise ValueError("HTTP statuses are 100-599")
        if len(set(values)) != len(values):
            raise ValueError("statuses must not repeat")
        return tuple(sorted(values))

    def match(self, status: int) -> bool:
        return (status in self.values) == (self.operator == "In")


class FailureRule(BaseModel):
    """What to do with a failed attempt whose command exited with a matching code, or
    whose HTTP request got a matching status: `retry` (a transient failure), `fail`
    (permanent: quarantine the job at once) or `ignore` (retry, and the attempt does not
    count toward max_attempts). A rule has one of on_exit_codes and on_http_statuses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_exit_codes: ExitCodes | None = None
    on_http_statuses: HttpStatuses | None = None
    action: Literal["retry", "fail", "ignore"]

    @model_validator(mode="after")
    def _one_match(self) -> FailureRule:
        if (self.on_exit_codes is None) == (self.on_http_statuses is None):
            raise ValueError("a rule matches on_exit_codes or on_http_statuses: give one")
        return self


class RetryOverrides(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base: Duration | None = None
    cap: Duration | None = None


class Limits(BaseModel):
    """Time limits a job tightens for itself; unset ones come from the settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    http_request_timeout: Duration | None = None
    step_deadline: Duration | None = None
    attempt_deadline: Duration | None = None
    heartbeat_interval: Duration | None = None
    lease_timeout: Duration | None = None

    def given(self) -> dict[str, timedelta]:
        return {name: value for name in JOB_LIMITS if (value := getattr(self, name)) is not None}


class JobPolicy(BaseModel):
    """How one job is retried, limited and judged when it fails. Stored with the job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retry: RetryOverrides = RetryOverrides()
    limits: Limits = Limits()
    heartbeat: bool = Field(
        False,
        description="The job sends heartbeats: silence for lease_timeout is the unknown state.",
    )
    on_unknown: Literal["wait", "fence_and_relaunch"] = "wait"
    failure_rules: tuple[FailureRule, ...] = Field((), max_length=20)
    quarantine_after: int | None = Field(None, ge=1, le=100)
    sla: Duration | None = Field(
        None,
        description="By when the job must have succeeded, counted from its run_at (a"
        " firing's: from its nominal time); past it, an sla_missed alert.",
    )

    @classmethod
    def read(cls, stored: Mapping[str, Any] | None) -> JobPolicy:
        """The policy as stored with a job (an empty mapping is every default)."""
        return _DEFAULT_POLICY if not stored else cls.model_validate(stored)

    def stored(self) -> dict[str, Any]:
        """The JSON kept with the job: only what differs from the defaults."""
        return self.model_dump(mode="json", exclude_defaults=True)

    def deadline(self, settings: Settings) -> timedelta:
        return self.limits.attempt_deadline or settings.timeouts.attempt_deadline

    def lease(self, settings: Settings) -> timedelta:
        return self.limits.lease_timeout or settings.timeouts.lease_timeout

    def heartbeat_every(self, settings: Settings) -> timedelta:
        return self.limits.heartbeat_interval or settings.timeouts.heartbeat_interval


_DEFAULT_POLICY = JobPolicy()


def job_policy(settings: Settings, raw: Any) -> JobPolicy:
    """A submitted policy, validated: it may tighten the limits, never loosen them, and the
    chain must still nest. InvalidInput names the field and the rule."""
    if isinstance(raw, JobPolicy):
        policy = raw
    else:
        try:
            policy = JobPolicy.model_validate(raw or {})
        except ValidationError as exc:
            raise errors.InvalidInput(
                describe(exc, what="policy", prefix="policy.").removeprefix("invalid policy: ")
            ) from None
    for name, value in policy.limits.given().items():
        ceiling = getattr(settings.timeouts, name)
        if value > ceiling:
            raise errors.InvalidInput(
                f"policy.limits.{name}: {value.total_seconds():g}s is longer than"
                f" timeouts.{name} ({ceiling.total_seconds():g}s); a job may tighten its limits,"
                " never loosen them"
            )
    given = policy.limits.given()
    current = dict(settings.timeouts)
    limits = {
        name: value
        for name, value in tighten_inner({**current, **given}, set(given), for_job=True).items()
        if name in JOB_LIMITS and (name in given or value != current[name])
    }
    if broken := chain_violations(settings, limits, for_job=True):
        raise errors.InvalidInput(f"policy.limits: with this job's limits, {broken[0]}")
    policy = policy.model_copy(update={"limits": Limits(**limits)})
    if policy.retry.base and policy.retry.cap and policy.retry.base > policy.retry.cap:
        raise errors.InvalidInput("policy.retry.base: must not be longer than policy.retry.cap")
    return policy


def describe(
    exc: ValidationError, *, origin: str | None = None, what: str = "settings", prefix: str = ""
) -> str:
    """One line per broken setting: `setting: what is wrong`."""
    lines = []
    for err in exc.errors():
        name = ".".join([prefix.rstrip(".")] * bool(prefix) + [str(p) for p in err["loc"]])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting" if what == "settings" else "unknown field"
        lines.append(f"{name}: {msg}" if name else msg)
    where = f" (from {origin} and CORRAL_* environment)" if origin else ""
    return f"invalid {what}{where}: " + "; ".join(lines)
