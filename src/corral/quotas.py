"""Quotas per tenant, at the door: how many of its jobs may wait (`max_queued`), how many
schedules it may have (`max_schedules`), how fast it may submit (`submit_rate`, a token
bucket) and how large a payload may be (`max_payload_bytes`), each from `[tenants.NAME]`
over `[tenants."*"]` (corral.tenancy).

The decisions are here, pure, on the time the caller gives: the store counts a tenant's
jobs and schedules and keeps its bucket (store/quotas.py), in the transaction of the write
they limit, and asks here whether the write may stand and what to say when it may not. A
tenant's tokens and dashboard users are held to the quotas; the operator (the CLI on the
store, the Python client) is not, and is told when it takes a tenant past one (`warnings`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from corral import errors, model, tenancy, usage

WAITING = (model.JobState.QUEUED, model.JobState.SCHEDULED, model.JobState.PARKED)
"""The states of a tenant's jobs that count toward its max_queued."""

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's quotas, its own table over `"*"`'s."""

    tenant: str
    max_queued: int
    max_schedules: int
    submit_rate: int  # jobs a minute; the bucket holds a minute's worth
    max_payload_bytes: int | None = None

    @property
    def table(self) -> str:
        """The tenant's table in corral.toml, as the operator writes it."""
        name = self.tenant if _BARE_KEY.match(self.tenant) else f'"{self.tenant}"'
        return f"[tenants.{name}]"


def limits(tenants: Mapping[str, tenancy.TenantSettings], tenant: str) -> Limits:
    """`tenant`'s quotas under the settings' `tenants`."""
    mine = tenancy.resolved(tenants, tenant)
    return Limits(
        tenant=tenant,
        max_queued=mine.max_queued,
        max_schedules=mine.max_schedules,
        submit_rate=mine.submit_rate,
        max_payload_bytes=mine.max_payload_bytes,
    )


# --- the bucket -------------------------------------------------------------------------------


Bucket = usage.Bucket


def refilled(quota: Limits, stored: Bucket | None, now: datetime) -> Bucket:
    """The tenant's bucket at `now` (usage.refilled at its submit_rate)."""
    return usage.refilled(quota.submit_rate, stored, now)


def taken(quota: Limits, bucket: Bucket, jobs: int) -> Bucket:
    """`bucket` less `jobs` tokens; RateLimited (with the seconds until there are enough)
    when it holds fewer, QuotaExceeded when even a full bucket would (a batch larger than
    a minute's rate can never pass: it must be split)."""
    if jobs <= bucket.tokens:
        return Bucket(bucket.tokens - jobs, bucket.at)
    if jobs > quota.submit_rate:
        raise errors.QuotaExceeded(
            f"submit_rate: tenant {quota.tenant!r} may submit {quota.submit_rate} jobs a"
            f" minute, fewer than the {jobs} of this request; split it into smaller ones, or"
            f" ask the operator to raise {quota.table} submit_rate",
            quota="submit_rate",
            tenant=quota.tenant,
        )
    wait = retry_after(quota, bucket, jobs)
    raise errors.RateLimited(
        f"submit_rate: tenant {quota.tenant!r} may submit {quota.submit_rate} jobs a minute"
        f" and has {math.floor(bucket.tokens)} left now, fewer than the {jobs} asked; try"
        f" again in {wait} s (Retry-After), or ask the operator to raise {quota.table}"
        " submit_rate",
        quota="submit_rate",
        tenant=quota.tenant,
        retry_after=wait,
    )


def retry_after(quota: Limits, bucket: Bucket, jobs: int) -> int:
    """Whole seconds until `bucket` holds `jobs` tokens (at least 1)."""
    missing = jobs - bucket.tokens
    return max(1, math.ceil(missing * 60 / quota.submit_rate))


# --- counts -----------------------------------------------------------------------------------


def check_queued(quota: Limits, *, waiting: int, created: int) -> None:
    """QuotaExceeded when a write that made `created` jobs leaves the tenant with
    `waiting` jobs waiting, more than its max_queued (a write that made none, an
    idempotency key's repeat, always stands)."""
    if created and waiting > quota.max_queued:
        raise errors.QuotaExceeded(
            queued_refusal(quota, waiting), quota="max_queued", tenant=quota.tenant
        )


def queued_refusal(quota: Limits, waiting: int) -> str:
    """Why a write that would leave `waiting` jobs of the tenant waiting is refused."""
    return (
        f"max_queued: tenant {quota.tenant!r} would have {waiting} jobs waiting (queued,"
        f" scheduled or parked), over its quota of {quota.max_queued}; wait for some to run,"
        f" or ask the operator to raise {quota.table} max_queued"
    )


def check_schedules(quota: Limits, *, count: int) -> None:
    """QuotaExceeded when a tenant with `count` schedules may make no more."""
    if count >= quota.max_schedules:
        raise errors.QuotaExceeded(
            f"max_schedules: tenant {quota.tenant!r} has {count} schedules, its quota of"
            f" {quota.max_schedules}; delete one it no longer needs, or ask the operator to"
            f" raise {quota.table} max_schedules",
            quota="max_schedules",
            tenant=quota.tenant,
        )


@dataclass(frozen=True, slots=True)
class Admitted:
    """How many of a tenant's firings may make their jobs (the first `count`, in order),
    the bucket after them, and why the rest may not (the quota and its words)."""

    count: int
    bucket: Bucket
    quota: str | None = None
    why: str | None = None


def admitted(quota: Limits, *, waiting: int, bucket: Bucket, want: int) -> Admitted:
    """Of `want` firings of a tenant's schedules, in order, those that fit its quotas: each
    makes a job that waits and takes a token. The first that does not fit, and every one
    after it, is refused, saying which quota it would break."""
    room = max(quota.max_queued - waiting, 0)
    count = min(want, room, math.floor(bucket.tokens))
    left = Bucket(bucket.tokens - count, bucket.at)
    if count == want:
        return Admitted(count, left)
    if count == room:
        return Admitted(count, left, "max_queued", queued_refusal(quota, waiting + count + 1))
    wait = retry_after(quota, left, 1)
    why = (
        f"submit_rate: tenant {quota.tenant!r} may submit {quota.submit_rate} jobs a minute"
        f" and had none left (the next in {wait} s); ask the operator to raise {quota.table}"
        " submit_rate, or make the tenant's schedules fire less often"
    )
    return Admitted(count, left, "submit_rate", why)


# --- payloads and the operator's warnings ----------------------------------------------------


def payload_refusal(quota: Limits, size: int) -> str | None:
    """Why a tenant's payload of `size` bytes is refused by its own max_payload_bytes
    (the global one is checked apart); None when it is not."""
    if quota.max_payload_bytes is None or size <= quota.max_payload_bytes:
        return None
    return (
        f"payload: {size} bytes is over tenant {quota.tenant!r}'s limit of"
        f" {quota.max_payload_bytes} ({quota.table} max_payload_bytes); store large data"
        " elsewhere and pass a reference"
    )


def warnings(
    quota: Limits, *, waiting: int | None = None, schedules: int | None = None
) -> list[str]:
    """What the operator is told after a write of its took the tenant past a quota (the
    counts after it; None: not counted): it stands, but the tenant's own writes are refused
    until it is back under."""
    out = []
    if waiting is not None and waiting > quota.max_queued:
        out.append(
            f"max_queued: tenant {quota.tenant!r} now has {waiting} jobs waiting, over its"
            f" quota of {quota.max_queued} ({quota.table} max_queued); the operator is not held"
            " to it, but the tenant's own submits are refused until fewer wait"
        )
    if schedules is not None and schedules > quota.max_schedules:
        out.append(
            f"max_schedules: tenant {quota.tenant!r} now has {schedules} schedules, over its"
            f" quota of {quota.max_schedules} ({quota.table} max_schedules); the operator is"
            " not held to it, but the tenant may make no more until it has fewer"
        )
    return out
