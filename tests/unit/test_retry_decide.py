"""What a failed attempt leads to (retry.decide): the decision table, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from corral import model, retry

A, J, FC = model.AttemptState, model.JobState, model.FailureClass
NOW = datetime(2026, 1, 1, tzinfo=UTC)

failures = st.builds(
    retry.Failure,
    cls=st.sampled_from(list(FC)),
    fingerprint=st.text("0123456789abcdef", min_size=16, max_size=16),
    counts=st.booleans(),
    why=st.sampled_from(["no rule matched", "rule 1: exit code 3 in [3] -> fail"]),
)
cases = st.fixed_dictionaries(
    {
        "failure": failures,
        "state": st.sampled_from([A.FAILED, A.LOST]),
        "attempt_no": st.integers(1, 50),
        "charged": st.integers(1, 50),
        "max_attempts": st.integers(1, 50),
        "streak": st.integers(1, 10),
        "quarantine_after": st.integers(1, 10),
        "delay": st.floats(0, 3600),
    }
)


def expected_verdict(c: dict) -> retry.Verdict:  # type: ignore[type-arg]
    """The table, written out plainly."""
    f = c["failure"]
    if f.cls in (FC.PERMANENT, FC.ASSERTION):  # a failed assertion is permanent too
        return retry.Verdict.PERMANENT
    if f.cls == FC.UNKNOWN and c["streak"] >= c["quarantine_after"]:
        return retry.Verdict.REPEATED
    if f.counts and c["charged"] >= c["max_attempts"]:
        return retry.Verdict.EXHAUSTED
    return retry.Verdict.RETRY


@given(cases)
def test_the_decision_follows_the_table(c: dict) -> None:  # type: ignore[type-arg]
    d = retry.decide(**c)
    verdict = expected_verdict(c)
    assert d.verdict == verdict
    assert (
        d.to
        == {
            retry.Verdict.PERMANENT: J.QUARANTINED,
            retry.Verdict.REPEATED: J.QUARANTINED,
            retry.Verdict.EXHAUSTED: J.FAILED,
            retry.Verdict.RETRY: J.QUEUED,
        }[verdict]
    )
    # Only a retry is due again, after exactly its backoff; only an ignored failure's retry
    # gives its attempt back.
    if verdict == retry.Verdict.RETRY:
        assert d.run_at(NOW) == NOW + timedelta(seconds=c["delay"])
        assert d.extra_attempt == (not c["failure"].counts)
        assert d.reason.startswith(f"retry: attempt {c['attempt_no']} {c['state']}")
    else:
        assert d.run_at(NOW) is None
        assert not d.extra_attempt
    assert d.details["fingerprint"] == c["failure"].fingerprint
    assert d.details["failure_class"] == str(c["failure"].cls)


@given(cases, st.one_of(st.none(), st.floats(0, 7200)))
def test_a_token_only_ever_makes_a_retry_later(c: dict, token_in: float | None) -> None:  # type: ignore[type-arg]
    d = retry.decide(**c)
    token_at = None if token_in is None else NOW + timedelta(seconds=token_in)
    waited = d.waits_for_token(token_at, "q", NOW)
    if d.verdict != retry.Verdict.RETRY:
        assert waited == d  # nothing but a retry takes a token
        return
    due, now_due = d.run_at(NOW), waited.run_at(NOW)
    assert due is not None
    assert now_due is not None
    assert now_due >= due
    if token_at is not None and token_at > due:
        assert now_due == token_at
        assert waited.details["budget"] == "empty"
        assert "retry budget is empty" in waited.reason
        assert "after a backoff" not in waited.reason
    else:
        assert waited == d


def test_the_run_log_lines_name_the_rule_and_the_count() -> None:
    unknown = retry.Failure(FC.UNKNOWN, "f" * 16, True, "no rule matched")
    permanent = retry.Failure(FC.PERMANENT, "f" * 16, True, "rule 1: exit code 3 in [3] -> fail")
    common = {"state": A.FAILED, "attempt_no": 3, "max_attempts": 5, "delay": 2.0}
    d = retry.decide(permanent, charged=3, streak=1, quarantine_after=2, **common)
    assert (
        d.reason == "quarantined: attempt 3 failed permanently (rule 1: exit code 3 in [3] -> fail)"
    )
    d = retry.decide(unknown, charged=3, streak=3, quarantine_after=3, **common)
    assert d.reason == (
        "quarantined: attempt 3 failed the same way 3 times in a row (fingerprint"
        f" {'f' * 16}); waits for a person"
    )
    d = retry.decide(unknown, charged=5, streak=1, quarantine_after=3, **common)
    assert d.reason == "attempt 3 failed (unknown): no attempts left"
    d = retry.decide(unknown, charged=3, streak=1, quarantine_after=3, **common)
    assert (
        d.reason == "retry: attempt 3 failed (unknown), attempts remain; due again after a backoff"
    )
    late = d.waits_for_token(NOW + timedelta(hours=1), "reports", NOW)
    assert late.reason == (
        "retry: attempt 3 failed (unknown), attempts remain; queue 'reports' retry budget is"
        " empty, so it waits for a token"
    )
    assert late.details["queue"] == "reports"


def test_a_streak_skips_the_attempts_that_are_not_charged_and_ends_at_another() -> None:
    same, other = "a" * 16, "b" * 16
    never = model.End.of(model.NEVER_LAUNCHED)
    failed = model.End.of("exit 3")
    assert (never.charged, failed.charged) == (False, True)
    earlier = {4: (never, None), 3: (failed, same), 2: (model.End.of(model.HANDED_BACK), None)}
    assert retry.streak(same, 5, {**earlier, 1: (failed, same)}, longest=9) == 3
    assert retry.streak(same, 5, {**earlier, 1: (failed, other)}, longest=9) == 2
    assert retry.streak(same, 5, earlier, longest=9) == 2  # attempt 1 did not fail this way
    assert retry.streak(same, 5, {**earlier, 1: (failed, same)}, longest=2) == 2
