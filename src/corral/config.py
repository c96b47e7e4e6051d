"""Settings: one validated object read from `corral.toml` and `CORRAL_*` environment variables.

Environment variables win over the file; nested settings use a double underscore
(`CORRAL_TIMEOUTS__ATTEMPT_DEADLINE=240`). Durations accept seconds or `500ms`, `90s`,
`4m`, `1h`, `1h30m` (corral.durations). Unknown keys and bad values raise ConfigError
naming the setting.

The groups that have a home of their own are read from it: the chain of time limits from
corral.timeouts, alerts from corral.alert_settings; a job's own policy, which is not a
setting, lives in corral.policy.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from corral import (
    alert_settings,
    durations,
    entrypoints,
    errors,
    failpoints,
    model,
    netrules,
    tenancy,
    timeouts,
)
from corral.proxies import ApiSettings
from corral.tenancy import TenantSettings
from corral.timeouts import Timeouts

DEFAULT_CONFIG_FILE = Path("corral.toml")


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
    base: durations.Duration = Field(
        timedelta(seconds=1), description="The first retry waits up to this."
    )
    cap: durations.Duration = Field(
        timedelta(minutes=5), description="No retry waits longer than this."
    )
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
    retention: durations.Duration = Field(
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

    jobs: durations.Duration = Field(
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


class SecretsSettings(BaseModel):
    """The secrets HTTP requests are signed with (`corral secrets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rotation_overlap: durations.Duration = Field(
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
    argo_pod_gc_delay: durations.Duration = Field(
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
    ttl_after_finished: durations.Duration = Field(
        timedelta(days=1),
        description="A finished Job is kept this long: it must outlive a corral outage"
        " (longer than timeouts.recovery_grace), or its outcome is gone before recovery reads it.",
    )
    termination_grace: durations.Duration = Field(
        timedelta(seconds=30), description="terminationGracePeriodSeconds of each pod."
    )
    pod_start_timeout: durations.Duration | None = Field(
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
    request_timeout: durations.Duration = Field(
        timedelta(seconds=10),
        description="Client-side limit of one API request: a cut connection fails, never hangs.",
    )
    watch_timeout: durations.Duration = Field(
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
    alerts: alert_settings.AlertsSettings = alert_settings.AlertsSettings()
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
        if self._check_chain and (broken := timeouts.chain_violations(self)):
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
        return min(POD_START_TIMEOUT, max(room, timedelta(seconds=durations.MIN_DURATION)))

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
