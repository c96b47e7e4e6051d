"""The `kubernetes` executor's settings, `[executors.kubernetes]`, which the `argo`
executor reads too: the namespaces and service accounts jobs may use, the defaults and
ceilings of their pods, placement classes, and the API client's limits.

Light on purpose: every start-up reads it (through the executor's registration), and it
imports no Kubernetes library.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral import durations, model

if TYPE_CHECKING:
    from corral import timeouts


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

    def start_timeout(self, limits: timeouts.Timeouts) -> timedelta:
        """pod_start_timeout, or, unset, POD_START_TIMEOUT shortened to the attempt deadline
        less the margin (as an unset inner limit follows its outer one down)."""
        if self.pod_start_timeout is not None:
            return self.pod_start_timeout
        room = limits.attempt_deadline - limits.margin
        return min(POD_START_TIMEOUT, max(room, timedelta(seconds=durations.MIN_DURATION)))

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
