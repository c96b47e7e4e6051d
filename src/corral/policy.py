"""A job's own policy: how it is retried, how its time limits tighten the deployment's, and
which failures its rules call transient or permanent. Stored with the job, as JSON.

`job_policy` checks a submitted policy against the settings (a job may tighten its limits,
never loosen them, and the chain must still nest); `JobPolicy.read` reads a stored one.
What a failure then leads to is decided in corral.retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from corral import config, durations, errors, timeouts


class Codes(BaseModel):
    """Which numbers of one kind a failure rule matches, in Kubernetes' podFailurePolicy
    shape: those `In` `values`, or those `NotIn` them. Each kind (exit codes, HTTP statuses)
    is this one rule with its own range, its name in messages, and the number that means
    success, if one does (a rule cannot call success a failure)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    span: ClassVar[range]
    noun: ClassVar[str]
    success: ClassVar[int | None] = None

    operator: Literal["In", "NotIn"]
    values: tuple[int, ...] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _in_span(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        span = cls.span
        if len(values) > len(span) - (cls.success is not None):
            raise ValueError(f"at most {len(span) - (cls.success is not None)} {cls.noun}")
        if any(v not in span for v in values):
            raise ValueError(f"{cls.noun} are {span.start}-{span.stop - 1}")
        if len(set(values)) != len(values):
            raise ValueError(f"{cls.noun} must not repeat")
        return tuple(sorted(values))

    @model_validator(mode="after")
    def _success_is_not_a_failure(self) -> Codes:
        if self.operator == "In" and self.success in self.values:
            raise ValueError(
                f"{self.success} is success, not a failure: it cannot be used with operator In"
            )
        return self

    def match(self, number: int) -> bool:
        return (number in self.values) == (self.operator == "In")


class ExitCodes(Codes):
    """The exit codes of a command a failure rule matches."""

    span = range(256)
    noun = "exit codes"
    success = 0


class HttpStatuses(Codes):
    """The statuses of an HTTP response a failure rule matches."""

    span = range(100, 600)
    noun = "HTTP statuses"


RULED_CLASSES = ("transient", "permanent", "assertion")
"""The failure classes a rule may match: those a platform gives (`unknown` is what is left
when neither a platform nor a rule said anything)."""


class FailureRule(BaseModel):
    """What to do with a failed attempt whose command exited with a matching code, whose
    HTTP request got a matching status, or that its platform gave a matching class (an
    HTTP job's failed assertion is `assertion`): `retry` (a transient failure), `fail`
    (permanent: quarantine the job at once) or `ignore` (retry, and the attempt does not
    count toward max_attempts). A rule has one of on_exit_codes, on_http_statuses and
    on_failure_classes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_exit_codes: ExitCodes | None = None
    on_http_statuses: HttpStatuses | None = None
    on_failure_classes: tuple[Literal["transient", "permanent", "assertion"], ...] | None = Field(
        None, min_length=1
    )
    action: Literal["retry", "fail", "ignore"]

    @field_validator("on_failure_classes")
    @classmethod
    def _once_each(cls, classes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if classes is not None and len(set(classes)) != len(classes):
            raise ValueError("failure classes must not repeat")
        return classes

    @model_validator(mode="after")
    def _one_match(self) -> FailureRule:
        matches = (self.on_exit_codes, self.on_http_statuses, self.on_failure_classes)
        if sum(m is not None for m in matches) != 1:
            raise ValueError(
                "a rule matches on_exit_codes, on_http_statuses or on_failure_classes: give one"
            )
        return self


class RetryOverrides(BaseModel):
    """A job's own backoff, in place of the settings' retry.base and retry.cap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: durations.Duration | None = None
    cap: durations.Duration | None = None


class Limits(BaseModel):
    """Time limits a job tightens for itself; unset ones come from the settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    http_request_timeout: durations.Duration | None = None
    step_deadline: durations.Duration | None = None
    attempt_deadline: durations.Duration | None = None
    heartbeat_interval: durations.Duration | None = None
    lease_timeout: durations.Duration | None = None

    def given(self) -> dict[str, timedelta]:
        return {
            name: value
            for name in timeouts.JOB_LIMITS
            if (value := getattr(self, name)) is not None
        }


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
    sla: durations.Duration | None = Field(
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

    def deadline(self, settings: config.Settings) -> timedelta:
        return self.limits.attempt_deadline or settings.timeouts.attempt_deadline

    def lease(self, settings: config.Settings) -> timedelta:
        return self.limits.lease_timeout or settings.timeouts.lease_timeout

    def heartbeat_every(self, settings: config.Settings) -> timedelta:
        return self.limits.heartbeat_interval or settings.timeouts.heartbeat_interval


_DEFAULT_POLICY = JobPolicy()


def job_policy(settings: config.Settings, raw: Any) -> JobPolicy:
    """A submitted policy, validated: it may tighten the limits, never loosen them, and the
    chain must still nest. InvalidInput names the field and the rule."""
    if isinstance(raw, JobPolicy):
        policy = raw
    else:
        try:
            policy = JobPolicy.model_validate(raw or {})
        except ValidationError as exc:
            raise errors.InvalidInput(
                config.describe(exc, what="policy", prefix="policy.").removeprefix(
                    "invalid policy: "
                )
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
        for name, value in timeouts.tighten_inner(
            {**current, **given}, set(given), for_job=True
        ).items()
        if name in timeouts.JOB_LIMITS and (name in given or value != current[name])
    }
    if broken := timeouts.chain_violations(settings, limits, for_job=True):
        raise errors.InvalidInput(f"policy.limits: with this job's limits, {broken[0]}")
    policy = policy.model_copy(update={"limits": Limits(**limits)})
    if policy.retry.base and policy.retry.cap and policy.retry.base > policy.retry.cap:
        raise errors.InvalidInput("policy.retry.base: must not be longer than policy.retry.cap")
    return policy
