"""The decisions of tenants' quotas, pure: a tenant's limits over `"*"`'s, the submit_rate
bucket's refill and take, the firings a tenant's quotas admit, and the words of each
refusal and warning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from corral import errors, quotas, tenancy

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _quota(**given: int) -> quotas.Limits:
    return quotas.Limits(
        tenant=str(given.pop("tenant", "acme")),
        max_queued=given.get("max_queued", 100_000),
        max_schedules=given.get("max_schedules", 1_000),
        submit_rate=given.get("submit_rate", 6_000),
    )


def test_a_tenant_s_limits_take_from_the_default_table_what_they_do_not_set() -> None:
    tenants = {
        tenancy.ANY: tenancy.TenantSettings(max_queued=50, submit_rate=60),
        "acme": tenancy.TenantSettings(max_queued=10, max_payload_bytes=1000),
    }
    assert quotas.limits(tenants, "acme") == quotas.Limits("acme", 10, 1_000, 60, 1000)
    assert quotas.limits(tenants, "other") == quotas.Limits("other", 50, 1_000, 60, None)
    assert quotas.limits({}, "x") == quotas.Limits("x", 100_000, 1_000, 6_000, None)


def test_a_table_is_named_as_the_operator_writes_it() -> None:
    assert _quota(tenant="acme").table == "[tenants.acme]"
    assert quotas.Limits("team.data", 1, 1, 1).table == '[tenants."team.data"]'


def test_a_bucket_refills_at_its_rate_up_to_a_minute_s_worth() -> None:
    quota = _quota(submit_rate=60)  # a token a second
    assert quotas.refilled(quota, None, NOW) == quotas.Bucket(60.0, NOW)
    spent = quotas.Bucket(0.0, NOW)
    later = NOW + timedelta(seconds=15)
    assert quotas.refilled(quota, spent, later) == quotas.Bucket(15.0, later)
    much_later = NOW + timedelta(hours=1)
    assert quotas.refilled(quota, spent, much_later).tokens == 60.0
    # Another replica's clock ahead: nothing is added, and its later time is kept.
    assert quotas.refilled(quota, spent, NOW - timedelta(seconds=5)) == spent


def test_a_take_within_the_bucket_passes_and_past_it_says_when_to_try_again() -> None:
    quota = _quota(submit_rate=6)
    full = quotas.refilled(quota, None, NOW)
    assert quotas.taken(quota, full, 6) == quotas.Bucket(0.0, NOW)
    with pytest.raises(errors.RateLimited) as late:
        quotas.taken(quota, quotas.Bucket(0.5, NOW), 2)
    assert late.value.retry_after == 15  # 1.5 tokens at one each 10 s
    assert (late.value.quota, late.value.tenant) == ("submit_rate", "acme")
    assert "[tenants.acme] submit_rate" in str(late.value)
    with pytest.raises(errors.QuotaExceeded) as never:
        quotas.taken(quota, full, 7)
    assert not isinstance(never.value, errors.RateLimited)
    assert "fewer than the 7 of this request; split it" in str(never.value)


def test_max_queued_counts_the_jobs_a_write_made_and_stands_at_its_edge() -> None:
    quota = _quota(max_queued=3)
    quotas.check_queued(quota, waiting=3, created=1)
    quotas.check_queued(quota, waiting=9, created=0)  # an idempotency key's repeat
    with pytest.raises(errors.QuotaExceeded) as over:
        quotas.check_queued(quota, waiting=4, created=1)
    assert str(over.value).startswith("max_queued: tenant 'acme' would have 4 jobs waiting")
    quotas.check_schedules(_quota(max_schedules=2), count=1)
    with pytest.raises(errors.QuotaExceeded, match="max_schedules: tenant 'acme' has 2"):
        quotas.check_schedules(_quota(max_schedules=2), count=2)


def test_firings_are_admitted_in_order_until_a_quota_is_full() -> None:
    quota = _quota(max_queued=5, submit_rate=60)
    full = quotas.refilled(quota, None, NOW)
    room = quotas.admitted(quota, waiting=3, bucket=full, want=4)
    assert (room.count, room.quota, room.bucket.tokens) == (2, "max_queued", 58.0)
    assert room.why is not None
    assert "would have 6 jobs waiting" in room.why
    rate = quotas.admitted(quota, waiting=0, bucket=quotas.Bucket(1.5, NOW), want=3)
    assert (rate.count, rate.quota, rate.bucket.tokens) == (1, "submit_rate", 0.5)
    assert rate.why is not None
    assert "the next in 1 s" in rate.why
    everyone = quotas.admitted(quota, waiting=0, bucket=full, want=3)
    assert (everyone.count, everyone.quota, everyone.why) == (3, None, None)


def test_a_payload_over_the_tenant_s_own_limit_is_refused_and_the_operator_warned() -> None:
    quota = quotas.Limits("acme", 2, 1, 60, max_payload_bytes=100)
    assert quotas.payload_refusal(quota, 100) is None
    assert quotas.payload_refusal(_quota(), 10**9) is None  # none of its own
    said = quotas.payload_refusal(quota, 101)
    assert said is not None
    assert "([tenants.acme] max_payload_bytes)" in said
    assert quotas.warnings(quota, waiting=2, schedules=1) == []
    warned = quotas.warnings(quota, waiting=3, schedules=2)
    assert [w.partition(":")[0] for w in warned] == ["max_queued", "max_schedules"]
