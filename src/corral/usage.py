"""What a tenant uses of each of its quotas, as plain values: what the store counts (its jobs
waiting and running, its schedules, its submit bucket, the run-log bytes it keeps), a
quota's limit beside its use, and the one sum a use needs (a submit bucket's refill).

Pure: no clock, no settings, no I/O. The client sets these beside a tenant's settings for
`corral tenants`, GET /api/v1/tenant, the dashboard's overview and /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Bucket:
    """A tenant's submit_rate bucket: `tokens` left at `at`."""

    tokens: float
    at: datetime


def refilled(rate: int, stored: Bucket | None, now: datetime) -> Bucket:
    """A submit_rate bucket of `rate` jobs a minute at `now`: none stored is a full one;
    tokens come back at rate / 60 a second, up to `rate`. A `now` before the stored time
    (another replica's clock ahead of this one) adds nothing and keeps the later time, so
    no token is made twice."""
    if stored is None:
        return Bucket(float(rate), now)
    seconds = max((now - stored.at).total_seconds(), 0.0)
    tokens = min(float(rate), stored.tokens + seconds * rate / 60)
    return Bucket(tokens, max(now, stored.at))


@dataclass(frozen=True, slots=True)
class Use:
    """What one tenant uses, as the store counted it at one moment."""

    waiting: int = 0  # jobs queued, scheduled or parked (max_queued)
    running: int = 0  # jobs running (max_running)
    schedules: int = 0  # schedules (max_schedules)
    monitors: int = 0  # monitors (max_monitors)
    bucket: Bucket | None = None  # its submit_rate bucket; None: never drawn from, full
    log_bytes: int = 0  # run-log bytes kept (run_log_bytes)


@dataclass(frozen=True, slots=True)
class Quota:
    """One quota of a tenant: its limit (None: none) and what the tenant uses of it (None:
    nothing to use: max_payload_bytes caps each payload, it adds up to nothing)."""

    name: str
    limit: float | None
    use: float | None

    @property
    def share(self) -> float | None:
        """The part of the limit in use (1.0: all of it); None without a limit or a use."""
        if self.limit is None or self.use is None:
            return None
        return self.use / self.limit if self.limit else float(self.use > 0)


@dataclass(frozen=True, slots=True)
class View:
    """A tenant's quotas with their use, and its weight in the claims' fair share."""

    tenant: str
    weight: float
    quotas: tuple[Quota, ...]

    def quota(self, name: str) -> Quota:
        """The quota named `name` (KeyError when there is none)."""
        for quota in self.quotas:
            if quota.name == name:
                return quota
        raise KeyError(name)


def bucket_use(rate: int, bucket: Bucket | None, now: datetime) -> float:
    """How much of a submit_rate bucket of `rate` jobs a minute is used at `now`: `rate`
    less the tokens it would hold then (`refilled`). A bucket never stored is full: none
    of it is used."""
    return max(float(rate) - refilled(rate, bucket, now).tokens, 0.0)


def excess(kept: int, limit: int) -> int:
    """Bytes past `limit` of `kept` (0 when under it): what a trim must take away."""
    return max(kept - limit, 0)


BYTES = frozenset({"max_payload_bytes", "run_log_bytes"})
"""The quotas counted in bytes: shown in binary units (KiB, MiB, GiB)."""


def said(quota: Quota) -> tuple[str, str]:
    """A quota's use and limit as a person reads them: bytes in binary units, a submit
    bucket's use to a tenth, a count with thousands separators; no use "-", no limit
    "none"."""
    return _amount(quota.name, quota.use, "-"), _amount(quota.name, quota.limit, "none")


def _amount(name: str, value: float | None, missing: str) -> str:
    if value is None:
        return missing
    if name in BYTES:
        return size_text(int(value))
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def size_text(n: int) -> str:
    """`n` bytes in the largest binary unit it fills (B, KiB, MiB, GiB, TiB), to a tenth."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    amount, unit = float(n), 0
    while amount >= 1024 and unit < len(units) - 1:
        amount, unit = amount / 1024, unit + 1
    return f"{n:,} B" if unit == 0 else f"{amount:.1f}".removesuffix(".0") + f" {units[unit]}"
