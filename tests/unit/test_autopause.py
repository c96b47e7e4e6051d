"""corral.autopause: when a schedule's failed firings pause it, as a pure decision."""

from __future__ import annotations

import pytest

from corral import autopause, errors, model, scheduling, tenancy
from corral.tenancy import TenantSettings

J = model.JobState


@pytest.mark.parametrize(
    ("pause_after", "newest_first", "paused"),
    [
        (3, [J.FAILED, J.QUARANTINED, J.FAILED], True),
        (3, [J.FAILED, J.FAILED], False),  # two failed (a missed one made no job)
        (3, [J.FAILED, J.FAILED, J.SUCCEEDED, J.FAILED], False),  # a success ends the count
        (3, [J.FAILED, J.RUNNING, J.FAILED, J.FAILED], True),  # one running counts when it ends
        (3, [J.FAILED, J.CANCELLED, J.FAILED, J.FAILED], True),  # cancelled: no failure, no end
        (0, [J.FAILED] * 10, False),  # 0: never
        (1, [J.QUARANTINED], True),
        (2, [], False),
    ],
)
def test_the_decision(pause_after: int, newest_first: list[model.JobState], paused: bool) -> None:
    assert autopause.should_pause(pause_after, newest_first) is paused


def test_a_schedule_s_own_value_wins_over_its_tenant_s_default_and_zero_is_a_value() -> None:
    tenants = {"a": TenantSettings(pause_after=2), tenancy.ANY: TenantSettings(pause_after=5)}

    def of(tenant: str, own: int | None) -> scheduling.Schedule:
        return _schedule(tenant, own)

    assert autopause.effective(of("a", None), tenants) == 2
    assert autopause.effective(of("b", None), tenants) == 5
    assert autopause.effective(of("a", 0), tenants) == 0
    assert autopause.effective(of("a", 7), tenants) == 7
    assert autopause.effective(of("a", None), {}) == 0


@pytest.mark.parametrize("bad", [-1, "3", 2.5, True, None])
def test_a_bad_value_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(errors.InvalidInput, match=r"^pause_after: .* 0 or more"):
        autopause.checked(bad)


def _schedule(tenant: str, own: int | None) -> scheduling.Schedule:
    from datetime import UTC, datetime

    at = datetime(2026, 1, 1, tzinfo=UTC)
    return scheduling.Schedule(
        id=1, name="n", tenant=tenant, cron=None, tz="UTC", every_seconds=60, anchor=at,
        template={}, catchup=scheduling.Catchup.NONE, catchup_window_seconds=60.0,
        catchup_max=1, overlap=scheduling.Overlap.ALLOW, jitter_seconds=0.0, until=None,
        paused_at=None, next_due=at, last_nominal=None, last_job_id=None, missed_total=0,
        created_at=at, updated_at=at, pause_after=own,
    )  # fmt: skip
