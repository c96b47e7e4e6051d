"""Failure classes, fingerprints, job policies and the retry budget's arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import config, errors, model, retry
from corral.policy import JobPolicy, job_policy

FC, A = model.FailureClass, model.AttemptState
SETTINGS = config.Settings()


def policy(**raw: object) -> JobPolicy:
    return job_policy(SETTINGS, raw)


def judge(p: JobPolicy, code: int | None, **kw: object) -> retry.Failure:
    args: dict[str, object] = {
        "executor": "process",
        "state": A.FAILED,
        "exit_code": code,
        "reason": f"exited with code {code}",
        "hint": None,
        "message": None,
    }
    return retry.classify(p, **{**args, **kw})  # type: ignore[arg-type]


RULES = policy(
    failure_rules=[
        {"on_exit_codes": {"operator": "In", "values": [3, 4]}, "action": "fail"},
        {"on_exit_codes": {"operator": "In", "values": [75]}, "action": "retry"},
        {"on_exit_codes": {"operator": "In", "values": [3, 99]}, "action": "ignore"},
        {"on_exit_codes": {"operator": "NotIn", "values": [0, 1, 3, 4, 75, 99]}, "action": "retry"},
    ]
)


@pytest.mark.parametrize(
    ("code", "cls", "counts"),
    [
        (3, FC.PERMANENT, True),  # first matching rule wins over the later `ignore`
        (4, FC.PERMANENT, True),
        (75, FC.TRANSIENT, True),
        (99, FC.TRANSIENT, False),  # ignore: retried, and the attempt is not counted
        (2, FC.TRANSIENT, True),  # NotIn
        (1, FC.UNKNOWN, True),  # no rule matches
    ],
)
def test_exit_code_rules_first_match_wins(code: int, cls: FC, counts: bool) -> None:
    failure = judge(RULES, code)
    assert (failure.cls, failure.counts) == (cls, counts)


def test_the_platforms_verdict_and_a_loss_come_before_the_rules() -> None:
    assert judge(RULES, -9, hint=FC.TRANSIENT).cls == FC.TRANSIENT
    assert judge(RULES, 3, hint=FC.TRANSIENT).cls == FC.TRANSIENT
    lost = judge(RULES, None, state=A.LOST, reason="lost")
    assert (lost.cls, lost.why) == (FC.TRANSIENT, "lost by its platform")
    # Signals are not exit codes: a NotIn rule does not catch a kill.
    assert judge(RULES, -11).cls == FC.UNKNOWN


def test_fingerprints_mask_numbers_but_not_meaning() -> None:
    a = retry.fingerprint("process", 3, "exited with code 3", "12:01:07 pid 4411: no such table")
    b = retry.fingerprint("process", 3, "exited with code 3", "12:05:59 pid 5123: no such table")
    c = retry.fingerprint("process", 3, "exited with code 3", "12:05:59 pid 5123: disk full")
    d = retry.fingerprint("process", 4, "exited with code 3", "12:01:07 pid 4411: no such table")
    assert a == b
    assert len({a, c, d}) == 3


def test_a_job_may_tighten_its_limits_and_inner_ones_follow() -> None:
    p = policy(limits={"attempt_deadline": "30s", "lease_timeout": "10s"})
    limits = p.limits
    assert limits.attempt_deadline == timedelta(seconds=30)
    assert limits.step_deadline == timedelta(seconds=25)  # tightened with it, by the margin
    assert limits.http_request_timeout == timedelta(seconds=20)
    assert limits.heartbeat_interval == timedelta(seconds=5)
    assert JobPolicy.read(p.stored()) == p  # what is stored reads back the same


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"limits": {"attempt_deadline": "5m"}},
            "policy.limits.attempt_deadline: 300s is longer than timeouts.attempt_deadline"
            " (240s); a job may tighten its limits, never loosen them",
        ),
        (
            {"limits": {"attempt_deadline": "20s", "step_deadline": "18s"}},
            "policy.limits: with this job's limits, timeouts.step_deadline (18s) must be at"
            " least 5s (timeouts.margin) less than timeouts.attempt_deadline (20s)",
        ),
        ({"limits": {"attempt_deadline": "1ms"}}, "timeouts.step_deadline (120s) must be"),
        ({"on_unknown": "panic"}, "policy.on_unknown: Input should be 'wait'"),
        ({"retries": 3}, "policy.retries: unknown field"),
        (
            {
                "failure_rules": [
                    {"on_exit_codes": {"operator": "In", "values": [0]}, "action": "fail"}
                ]
            },
            "policy.failure_rules.0.on_exit_codes: 0 is success",
        ),
        (
            {
                "failure_rules": [
                    {"on_exit_codes": {"operator": "In", "values": [300]}, "action": "fail"}
                ]
            },
            "exit codes are 0-255",
        ),
        (
            {
                "failure_rules": [
                    {"on_exit_codes": {"operator": "In", "values": [1]}, "action": "x"}
                ]
            },
            "policy.failure_rules.0.action",
        ),
        ({"retry": {"base": "1m", "cap": "10s"}}, "policy.retry.base: must not be longer"),
        ({"quarantine_after": 0}, "policy.quarantine_after"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(raw: dict[str, object], message: str) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        policy(**raw)
    assert message in str(caught.value)


def test_a_jobs_own_backoff_replaces_the_default() -> None:
    b = retry.Backoff(base=1, cap=300)
    p = policy(retry={"base": "10s", "cap": "15s"})
    assert b.ceiling(1, 10, 15) == 10
    assert b.ceiling(3, 10, 15) == 15
    assert all(0 <= b.for_policy(n, p) <= 15 for n in range(1, 50))


# --- the budget ---------------------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)

steps = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=120, allow_nan=False),  # seconds since the last step
        st.integers(0, 50),  # first attempts counted at this step
        st.integers(0, 40),  # retries asking for a token at this step
    ),
    max_size=40,
)


@given(
    steps=steps,
    ratio=st.floats(0, 2),
    per_minute=st.floats(0.5, 600),
    burst=st.floats(1, 500),
)
def test_retries_due_by_any_time_stay_within_the_budget(
    steps: list[tuple[float, int, int]], ratio: float, per_minute: float, burst: float
) -> None:
    """However retries and first attempts arrive, the retries due by time T are at most
    burst + ratio * (first attempts so far) + floor * T: the token bucket's promise (a
    queue's bucket starts full)."""
    budget = retry.Budget(ratio, per_minute / 60, burst)
    bucket, now, firsts, ready_times = retry.Bucket(burst, T0, 0), T0, 0, []
    for gap, new_firsts, asks in steps:
        now += timedelta(seconds=gap)
        firsts += new_firsts
        tokens = budget.refill(bucket, now, new_firsts)
        for _ in range(asks):
            tokens, at = budget.reserve(tokens, now)
            ready_times.append(at or now)
        bucket = retry.Bucket(tokens, now, 0)
    for t in sorted(set(ready_times)):
        elapsed = (t - T0).total_seconds()
        due = sum(1 for r in ready_times if r <= t)
        # (+1us: a ready time is kept to the microsecond, rounded down)
        assert due <= burst + ratio * firsts + budget.floor_per_second * (elapsed + 1e-6) + 1e-9


def test_an_empty_budget_delays_each_retry_one_token_further() -> None:
    budget = retry.Budget(ratio=0.0, floor_per_second=1.0, burst=2)
    tokens = budget.refill(retry.Bucket(0.0, T0, 0), T0 + timedelta(seconds=10), 0)
    assert tokens == 2  # the burst caps what time saves up
    got = []
    for _ in range(4):
        tokens, at = budget.reserve(tokens, T0)
        got.append(None if at is None else (at - T0).total_seconds())
    assert got == [None, None, 1.0, 2.0]


def test_a_bucket_in_debt_counts_enough_first_attempts_to_fill_it() -> None:
    budget = retry.Budget(ratio=0.2, floor_per_second=1.0, burst=100)
    assert budget.firsts_to_fill(100) == 1
    assert budget.firsts_to_fill(-900) == 5001  # pays the debt, then fills
    assert retry.Budget(ratio=0.0, floor_per_second=1.0, burst=100).firsts_to_fill(0) == 0
