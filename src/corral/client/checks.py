"""The checks of a job at the edge: what a job may hold, and what makes it refused.

A refused job raises InvalidInput naming the field and the rule, before anything is
written; the same checks run for a submit, a schedule's template and a backfill's
overrides.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from corral import config, errors, flows, model, plain, python_tasks, quotas
from corral.executors import python as python_executor
from corral.executors import registry
from corral.policy import JobPolicy, job_policy

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
"""What a name (a queue, tenant, pool, schedule or user) may be."""
_CODE_VERSION = re.compile(r"^[!-~]{1,200}$")
PRIORITY_RANGE = (-1000, 1000)
SpecChecker = registry.SpecChecker

_TEXT_OF_A_JOB = (
    "executor", "spec", "payload", "queue", "pool", "tenant", "idempotency_key", "labels",
    "policy", "code_version", "callback", "failure_callback",
)  # fmt: skip
"""The fields of a job that hold text (each checked by corral.plain)."""


def check_job(
    job: model.NewJob, *, executors: Mapping[str, SpecChecker], settings: config.Settings
) -> model.NewJob:
    """The job as it will be stored, or InvalidInput naming the first field that is wrong."""
    _check_text(job)
    if job.executor not in executors and job.executor != python_tasks.PYTHON:
        raise errors.InvalidInput(_not_running(job.executor, executors))
    _check_pool(job, settings)
    _check_flow(job)
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
    _check_payload(job, settings)
    _check_callbacks(job, executors, settings)
    if job.executor == python_tasks.PYTHON:
        job = _worker_leased(job)
    policy = job_policy(settings, job.policy)
    _check_reach(job.executor, policy, settings)
    checker = (
        python_executor.SPEC if job.executor == python_tasks.PYTHON else executors[job.executor]
    )
    spec = checker.validate_spec(job.spec)
    return dataclasses.replace(job, spec=spec, policy=policy.stored())


def _check_pool(job: model.NewJob, settings: config.Settings) -> None:
    """InvalidInput for a pool the settings do not configure."""
    if job.pool is not None and job.pool not in settings.pools:
        known = ", ".join(sorted(settings.pools)) or "none are configured"
        raise errors.InvalidInput(
            f"pool: {job.pool!r} is not a configured pool ({known}); add it to [pools]"
            " in corral.toml with its number of slots"
        )


def _check_flow(job: model.NewJob) -> None:
    """InvalidInput for a flow that is not a name, or named by a Python task's job (a
    worker's claim keeps no flow). Whether the tenant has it is the store's to say."""
    if job.flow is None:
        return
    if not isinstance(job.flow, str) or not flows.NAME.match(job.flow):
        raise errors.InvalidInput(
            f"flow: {job.flow!r} must be 1-100 characters of [A-Za-z0-9_.-], starting alphanumeric"
        )
    if job.executor == python_tasks.PYTHON:
        raise errors.InvalidInput(
            "flow: a Python task's job goes through no flow (workers claim it); give no flow"
        )


def _worker_leased(job: model.NewJob) -> model.NewJob:
    """A Python task's job: its payload the envelope of its spec's task and version, and on
    its worker's lease (the worker's heartbeats renew it, at the worker's own interval, so a
    job cannot set its own lease or heartbeat interval)."""
    task, version = python_tasks.task_of(python_executor.SPEC.validate_spec(job.spec))
    data = job.payload.get("data") if isinstance(job.payload, Mapping) else None
    if job.payload != python_tasks.envelope(task, version, data):
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


def _check_callbacks(
    job: model.NewJob, executors: Mapping[str, SpecChecker], settings: config.Settings
) -> None:
    """A job's callbacks (corral.callbacks) are checked as an HTTP job's URL is: absolute
    http or https, and no literal address the guard refuses (a name is checked when the
    callback is sent); they need the http executor, which sends them. A callback's URL takes
    no placeholders: `{{` in one is refused here rather than failing each delivery. Its
    modules (httpx) are imported here, by a job that names a callback only."""
    for field in ("callback", "failure_callback"):
        url = getattr(job, field)
        if url is None:
            continue
        if "{{" in url:
            raise errors.InvalidInput(
                f"{field}: {url!r} holds a placeholder ({{{{...}}}}), which a callback's URL"
                " does not take: give the URL as it is to be called"
            )
        from corral.executors import http_guard, http_spec

        if http_spec.KIND not in executors:
            raise errors.InvalidInput(
                f"{field}: a callback is sent by the http executor, which this corral does not"
                " run; add it to executors.enabled in corral.toml"
            )
        try:
            http_spec.check_spec(
                {"method": "POST", "url": url},
                guard=http_guard.Guard(settings.executors.http.allow_networks),
            )
        except errors.InvalidInput as exc:
            rule = str(exc).split("url: ", 1)[-1]
            raise errors.InvalidInput(f"{field}: {url!r} {rule}") from None


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


def _check_reach(executor: str, policy: JobPolicy, settings: config.Settings) -> None:
    """A job that promises heartbeats must be able to send them from where it runs."""
    if not policy.heartbeat or executor not in registry.known():
        return
    reach = registry.get(executor).reach
    if reach is not None and (problem := reach(settings)):
        raise errors.InvalidInput(f"policy.heartbeat: {problem}")


def _check_payload(job: model.NewJob, settings: config.Settings) -> None:
    """A payload that is JSON within max_payload_bytes, and a tenant's job's (`tenant_made`:
    the API, the dashboard, a schedule the tenant made) within its tenant's as well: the
    lower of the two holds."""
    try:
        size = len(json.dumps(job.payload, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"payload: must be JSON ({exc})") from None
    if size > settings.max_payload_bytes:
        raise errors.PayloadTooLarge(
            f"payload: {size} bytes is over the limit of {settings.max_payload_bytes}"
            " (max_payload_bytes); store large data elsewhere and pass a reference"
        )
    if job.tenant_made:
        quota = quotas.limits(settings.tenants, job.tenant)
        if (why := quotas.payload_refusal(quota, size)) is not None:
            raise errors.PayloadTooLarge(why)


def _check_text(job: model.NewJob) -> None:
    """InvalidInput for text a database cannot hold anywhere in `job` (corral.plain), or a
    queue, tenant or pool that is not a name."""
    text = {f: getattr(job, f) for f in _TEXT_OF_A_JOB}
    if (why := plain.refusal(text)) is not None:
        raise errors.InvalidInput(why)
    for field, value in (("queue", job.queue), ("tenant", job.tenant), ("pool", job.pool)):
        if value is not None and not NAME.match(value):
            raise errors.InvalidInput(
                f"{field}: {value!r} must be 1-200 characters of [A-Za-z0-9_.-],"
                " starting alphanumeric"
            )


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
