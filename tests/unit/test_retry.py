"""Backoff with full jitter: every delay within its ceiling, exact under a seed."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import config, model, policy, retry


@given(
    base=st.floats(min_value=0.001, max_value=3600),
    cap=st.floats(min_value=0.001, max_value=86400),
    attempt_no=st.integers(min_value=1, max_value=10_000),
    seed=st.integers(),
)
def test_every_delay_lies_between_zero_and_its_ceiling(
    base: float, cap: float, attempt_no: int, seed: int
) -> None:
    delay = retry.Backoff(base, cap, random.Random(seed)).delay(attempt_no)
    assert 0 <= delay <= min(cap, base * 2.0 ** min(attempt_no - 1, 64))


def test_the_ceiling_doubles_up_to_the_cap() -> None:
    b = retry.Backoff(1, 10)
    assert [b.ceiling(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_a_seed_makes_delays_exact() -> None:
    settings = config.Settings(retry=config.RetrySettings(seed=42))
    one, two = retry.Backoff.from_settings(settings), retry.Backoff.from_settings(settings)
    assert [one.delay(n) for n in range(1, 6)] == [two.delay(n) for n in range(1, 6)]


def test_a_platform_s_retry_after_lengthens_the_backoff_up_to_its_cap() -> None:
    settings = config.Settings(retry={"seed": 3, "base": 1, "cap": 60})  # type: ignore[arg-type]
    own = policy.JobPolicy()
    plain = retry.Retry.from_settings(settings).delay(1, own)
    assert 0 <= plain <= 1
    assert retry.Retry.from_settings(settings).delay(1, own, asked=30) == 30
    assert retry.Retry.from_settings(settings).delay(1, own, asked=3600) == 60
    assert retry.Retry.from_settings(settings).delay(1, own, asked=0) == plain
    capped = policy.JobPolicy(retry={"cap": 10})  # type: ignore[arg-type]
    assert retry.Retry.from_settings(settings).delay(1, capped, asked=3600) == 10


def test_a_job_s_http_status_rules_come_before_the_executor_s_classes() -> None:
    rules = policy.JobPolicy.model_validate(
        {
            "failure_rules": [
                {"on_http_statuses": {"operator": "In", "values": [404]}, "action": "retry"},
                {"on_http_statuses": {"operator": "In", "values": [503]}, "action": "fail"},
                {"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"},
            ]
        }
    )

    def judged(status: int, hint: model.FailureClass) -> retry.Failure:
        return retry.classify(
            rules,
            executor="http",
            state=model.AttemptState.FAILED,
            exit_code=None,
            reason=f"HTTP {status}",
            hint=hint,
            message=None,
            http_status=status,
        )

    missing = judged(404, model.FailureClass.PERMANENT)
    assert missing.cls is model.FailureClass.TRANSIENT
    assert missing.why == "rule 1: HTTP status 404 In [404] -> retry"
    assert judged(503, model.FailureClass.TRANSIENT).cls is model.FailureClass.PERMANENT
    assert judged(500, model.FailureClass.TRANSIENT).why == "http executor: HTTP 500"


@pytest.mark.parametrize(
    "rule",
    [
        {"action": "retry"},
        {
            "on_exit_codes": {"operator": "In", "values": [3]},
            "on_http_statuses": {"operator": "In", "values": [404]},
            "action": "retry",
        },
        {"on_http_statuses": {"operator": "In", "values": [700]}, "action": "retry"},
    ],
)
def test_a_rule_matches_one_thing(rule: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="on_http_statuses or on_failure_classes|100-599"):
        policy.JobPolicy.model_validate({"failure_rules": [rule]})
