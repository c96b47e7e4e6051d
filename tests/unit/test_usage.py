"""A tenant's quotas beside its use, as pure values: a submit bucket's use as time refills it,
the part of a quota used, how a person reads them, and a tenant's view under its settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from corral import config, tenancy, usage
from corral.client.tenants import view_of

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("tokens", "seconds", "used"),
    [
        (60.0, 0, 0.0),  # full
        (0.0, 0, 60.0),  # empty
        (0.0, 30, 30.0),  # half refilled: a token a second at 60 a minute
        (0.0, 3600, 0.0),  # refilled long ago, never past full
        (-6.0, 0, 66.0),  # a debt counts
        (10.0, -5, 50.0),  # a bucket stored after now (another clock): no refill, no less
    ],
)
def test_a_bucket_s_use_is_the_rate_less_what_it_would_hold_now(
    tokens: float, seconds: float, used: float
) -> None:
    bucket = usage.Bucket(tokens=tokens, at=T0)
    assert usage.bucket_use(60, bucket, T0 + timedelta(seconds=seconds)) == pytest.approx(used)


def test_a_bucket_never_stored_is_full() -> None:
    assert usage.bucket_use(6000, None, T0) == 0.0


def test_a_quota_s_share_and_how_it_reads() -> None:
    logs = usage.Quota("run_log_bytes", 1 << 30, 3 << 29)
    assert logs.share == 1.5
    assert usage.said(logs) == ("1.5 GiB", "1 GiB")
    assert usage.Quota("max_running", None, 3).share is None
    assert usage.said(usage.Quota("max_running", None, 3)) == ("3", "none")
    assert usage.said(usage.Quota("max_payload_bytes", 65536, None)) == ("-", "64 KiB")
    assert usage.said(usage.Quota("submit_rate", 6000, 12.25)) == ("12.2", "6,000")
    assert usage.Quota("max_schedules", 0, 0).share == 0.0
    assert usage.Quota("max_schedules", 0, 1).share == 1.0
    assert [usage.size_text(n) for n in (0, 1023, 1024, 1536, 5 << 40)] == [
        "0 B",
        "1,023 B",
        "1 KiB",
        "1.5 KiB",
        "5 TiB",
    ]
    assert usage.excess(10, 4) == 6
    assert usage.excess(3, 4) == 0


def test_a_tenant_s_view_takes_its_table_over_the_default_s() -> None:
    settings = config.Settings(
        max_payload_bytes=1 << 20,
        tenants={
            tenancy.ANY: tenancy.TenantSettings(run_log_bytes=1 << 20, max_payload_bytes=1 << 22),
            "a": tenancy.TenantSettings(weight=2, max_running=4, max_payload_bytes=1 << 10),
        },
    )
    use = usage.Use(waiting=3, running=1, schedules=2, monitors=5, log_bytes=10)
    a = view_of(settings, "a", use, T0)
    assert (a.tenant, a.weight) == ("a", 2.0)
    assert {q.name: (q.use, q.limit) for q in a.quotas} == {
        "max_running": (1, 4),
        "max_queued": (3, 100_000),
        "max_schedules": (2, 1000),
        "max_monitors": (5, 100),
        "submit_rate": (0.0, 6000),
        "max_payload_bytes": (None, 1 << 10),  # the lower of its own and the global one
        "run_log_bytes": (10, 1 << 20),  # "*"'s, as a does not set its own
    }
    other = view_of(settings, "b", usage.Use(), T0)
    assert other.quota("max_payload_bytes").limit == 1 << 20  # "*"'s 4 MiB; the global is lower
    assert other.quota("max_running").limit is None
    with pytest.raises(KeyError):
        other.quota("max_cpu")
