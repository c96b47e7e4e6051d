"""What each tenant may do: its settings (`[tenants.NAME]`) and its executor grant.

A tenant (a token or a dashboard user of it) submits and schedules jobs for executors its
grant names, and no others. `[tenants."*"]` is the default of every tenant not named, and a
named tenant's table takes from it what it does not set itself. The default grant is HTTP
requests and Python tasks: `process`, `kubernetes`, `argo` and executors from packages
outside corral run code the submitter chooses, so they are granted only by name.

The operator (the CLI on the store) is no tenant: what it submits or schedules is checked
by no grant. The checks here are pure; the API, the dashboard and the scheduler ask them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from pydantic import BaseModel, ConfigDict, Field

from corral import errors, shares

ANY = "*"
"""The key of the table every tenant not named takes its settings from."""

PYTHON = "python"
"""Python tasks, run by workers: no executor to enable, always there to grant."""

DEFAULT_GRANT = ("http", PYTHON)
"""What a tenant may submit when no table says otherwise."""

CHOSEN_CODE = frozenset({"process", "kubernetes", "argo"})
"""corral's own executors that run code the submitter chooses (with those of packages
outside corral: anything not in DEFAULT_GRANT)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class TenantSettings(BaseModel):
    """One tenant's settings (`[tenants.NAME]`, or `[tenants."*"]` for every tenant not
    named); what a named tenant leaves unset it takes from `"*"`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_running: int | None = Field(
        None, ge=1, description="At most this many of the tenant's jobs run at once."
    )
    executors: tuple[str, ...] | None = Field(
        None,
        description="The executors the tenant's tokens and dashboard users may submit and"
        ' schedule (unset: `"*"`\'s, by default ["http", "python"]). process, kubernetes,'
        " argo and executors of other packages run code the submitter chooses: grant them"
        " by name only.",
    )
    namespace: str | None = Field(
        None,
        description="Where the tenant's kubernetes and argo jobs run, and only there"
        " (required where either is granted; one of executors.kubernetes.namespaces).",
    )
    allowed_secrets: tuple[str, ...] | None = Field(
        None,
        description="The Secrets the tenant's cluster jobs may name (env, env_from, volumes,"
        " pull secrets); unset: none. Never corral's own.",
    )
    allowed_config_maps: tuple[str, ...] | None = Field(
        None, description="The ConfigMaps the tenant's cluster jobs may name; unset: none."
    )
    service_accounts: tuple[str, ...] | None = Field(
        None, description="The service accounts the tenant's cluster jobs may run as."
    )
    weight: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="The tenant's share of the claims when tenants wait together: due jobs"
        " are taken round-robin across tenants, each in proportion to its weight.",
    )
    max_queued: int = Field(
        100_000,
        ge=0,
        description="At most this many of the tenant's jobs wait (queued, scheduled or"
        " parked); a submit past it is refused (403).",
    )
    max_schedules: int = Field(
        1_000, ge=0, description="At most this many schedules of the tenant."
    )
    max_monitors: int = Field(
        100, ge=0, description="At most this many monitors of the tenant (corral monitors)."
    )
    submit_rate: int = Field(
        6_000,
        ge=1,
        description="Jobs the tenant's tokens and dashboard users may submit a minute (a"
        " token bucket in the store, shared by every API replica); past it, 429.",
    )
    max_payload_bytes: int | None = Field(
        None,
        ge=1,
        description="The largest payload of the tenant's jobs (the lower of this and the"
        " global max_payload_bytes holds).",
    )
    pause_after: int = Field(
        0,
        ge=0,
        description="A schedule of the tenant made without its own pause_after is paused"
        " once this many of its firings' jobs in a row ended failed or quarantined (0:"
        " never).",
    )
    run_log_bytes: int = Field(
        1 << 30,
        ge=0,
        description="Run-log bytes kept for the tenant: past it, the reconciler trims the"
        " oldest finished jobs' logs first (never a quarantined job's).",
    )


def executor_of(template: Mapping[str, object]) -> str:
    """The executor a job template's jobs run on: a Python task's are `python`'s, others
    name theirs (none named: `process`, as a submit takes it)."""
    if template.get("task") is not None:
        return PYTHON
    return str(template.get("executor") or "process")


def resolved(tenants: Mapping[str, TenantSettings], tenant: str) -> TenantSettings:
    """`tenant`'s settings: its own table over `"*"`'s."""
    base = tenants.get(ANY, TenantSettings())
    own = tenants.get(tenant)
    if own is None:
        return base
    return base.model_copy(update={k: getattr(own, k) for k in own.model_fields_set})


def weights(tenants: Mapping[str, TenantSettings]) -> shares.Weights:
    """Each named tenant's weight in the claims' fair shares, and every other's."""
    named = {name: resolved(tenants, name).weight for name in tenants if name != ANY}
    return shares.Weights(named, resolved(tenants, ANY).weight)


def granted(tenants: Mapping[str, TenantSettings], tenant: str) -> tuple[str, ...]:
    """The executors `tenant` may submit and schedule."""
    given = resolved(tenants, tenant).executors
    return DEFAULT_GRANT if given is None else given


def refusal(tenants: Mapping[str, TenantSettings], tenant: str, executor: str) -> str | None:
    """Why `tenant` may not submit or schedule a job for `executor`; None when it may."""
    grant = granted(tenants, tenant)
    if executor in grant:
        return None
    table = f"[tenants.{tenant}]" if _NAME.match(tenant) else f'[tenants."{tenant}"]'
    return (
        f"executor: tenant {tenant!r} is not granted {executor!r} (it may use:"
        f" {', '.join(grant) or 'none'}); the operator grants it in corral.toml with"
        f" {table} executors = [..., {executor!r}]"
    )


def offered(tenants: Mapping[str, TenantSettings], tenant: str | None, executor: str) -> bool:
    """Whether a form that makes `executor` jobs is offered to a session of `tenant` (None:
    of every tenant, then when any tenant may use it)."""
    if tenant is not None:
        return executor in granted(tenants, tenant)
    return any(executor in granted(tenants, name) for name in (ANY, *tenants))


def check(tenants: Mapping[str, TenantSettings], tenant: str, executor: str) -> None:
    """Refuse (NotGranted, naming the tenant, the executor and the setting) a job `tenant`
    may not submit or schedule."""
    if (why := refusal(tenants, tenant, executor)) is not None:
        raise errors.NotGranted(why)


CLUSTER = ("kubernetes", "argo")
"""The executors whose jobs run in a tenant's namespace."""


def violations(
    tenants: Mapping[str, TenantSettings],
    *,
    enabled: Collection[str],
    strangers: bool,
    namespaces: Collection[str] = (),
) -> list[str]:
    """What is wrong with the `tenants` settings, one line each: a name that is no
    tenant's, a grant of an executor this corral does not run, `process` granted while
    its jobs would run as corral's own user (`strangers` False), a cap for every tenant,
    kubernetes or argo granted without a namespace among `namespaces` (corral's)."""
    out = []
    for name, table in tenants.items():
        where = f'tenants."{name}"' if name == ANY else f"tenants.{name}"
        out += _namespace_problems(tenants, name, where, namespaces)
        if name != ANY and not _NAME.match(name):
            out.append(f"{where}: a tenant's name is 1-200 characters of [A-Za-z0-9_.-]")
        if name == ANY and table.max_running is not None:
            out.append(
                f"{where}.max_running: a cap is set per tenant, by name ([tenants.NAME]"
                " max_running)"
            )
        out += [f"{where}.executors: {why}" for why in _grant_problems(table, enabled, strangers)]
    return out


def _namespace_problems(
    tenants: Mapping[str, TenantSettings], name: str, where: str, namespaces: Collection[str]
) -> list[str]:
    """What is wrong with the namespace of tenant `name` (at `where`) for its cluster jobs."""
    mine = resolved(tenants, name)
    cluster = [k for k in CLUSTER if k in granted(tenants, name)]
    if cluster and mine.namespace is None:
        return [
            f"{where}.namespace: required where {cluster[0]} is granted: the tenant's cluster"
            " jobs run in its own namespace, and only there"
        ]
    if cluster and mine.namespace not in namespaces:
        return [
            f"{where}.namespace: {mine.namespace!r} is not one of"
            f" executors.kubernetes.namespaces ({', '.join(namespaces) or 'none'}): add it"
            " there, and corral's Role in it"
        ]
    return []


def _grant_problems(table: TenantSettings, enabled: Collection[str], strangers: bool) -> list[str]:
    """What is wrong with a table's grant: an executor this corral does not run (not in
    `enabled`, nor Python tasks), `process` without strangers to run it as, an executor
    named twice."""
    out = []
    runs = {*enabled, PYTHON}
    for kind in table.executors or ():
        if kind not in runs:
            out.append(
                f"{kind!r} is not in executors.enabled ({', '.join(enabled) or 'none'}):"
                " enable it or take it out of the grant"
            )
        elif kind == "process" and not strangers:
            out.append(
                "granting 'process' runs a tenant's commands on corral's host as corral's own"
                " user, which could read corral's settings and database: a tenant's process"
                " jobs must run as strangers; set executors.process.uid_range (each attempt"
                ' under its own uid, corral as root) or executors.process.sandbox = "bwrap"'
            )
    if table.executors is not None and len(set(table.executors)) != len(table.executors):
        out.append("an executor is named twice")
    return out
