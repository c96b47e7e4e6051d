"""Retries: how long a failed job waits, whether it may retry at all, and how a failure is judged.

- Backoff: exponential with full jitter. The n-th retry waits a random time between zero and
  min(cap, base * 2**(n-1)), so jobs that failed together do not come back together. The
  random source is passed in, so tests (and anyone replaying an incident) get exact delays.
- Budget: a token bucket per queue. Each retry takes a token; each first attempt adds
  `ratio` of one, and time adds `floor_per_minute`. A retry that finds the bucket empty
  is delayed until the floor has paid for it, never dropped, so when everything fails at
  once the retries stay a small share of the traffic instead of multiplying it.
- classify: every failed attempt gets a class (transient, permanent, unknown, assertion)
  and a fingerprint, from the platform's verdict and the job's failure rules.
- decide: what a failed attempt leads to for its job (quarantine, fail, or retry after a
  backoff, perhaps later for want of a budget token), a pure function over plain values;
  the store reads those values and applies the Decision it returns. The streak of the
  same failure it reads counts only the attempts whose end is charged (model.End).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from corral import config, model, policy

FailureClass = model.FailureClass


@dataclass(slots=True)
class Backoff:
    """Delays for retries: full jitter under an exponential ceiling."""

    base: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def from_settings(cls, settings: config.Settings, rng: random.Random | None = None) -> Backoff:
        return cls(
            base=settings.retry.base.total_seconds(),
            cap=settings.retry.cap.total_seconds(),
            rng=rng or random.Random(settings.retry.seed),
        )

    def ceiling(
        self, attempt_no: int, base: float | None = None, cap: float | None = None
    ) -> float:
        """The longest wait after attempt `attempt_no` (1 for the first) failed."""
        exponent = min(max(attempt_no - 1, 0), 64)  # 2**64 * base is past any cap
        return min(self.cap if cap is None else cap, (base or self.base) * 2.0**exponent)

    def delay(self, attempt_no: int, base: float | None = None, cap: float | None = None) -> float:
        """Seconds to wait before the attempt after `attempt_no`; `base` and `cap` are a
        job's own, when it has them."""
        return self.rng.uniform(0.0, self.ceiling(attempt_no, base, cap))

    def cap_for(self, policy: policy.JobPolicy) -> float:
        """The longest backoff for a job with this policy."""
        return policy.retry.cap.total_seconds() if policy.retry.cap else self.cap

    def for_policy(self, attempt_no: int, policy: policy.JobPolicy) -> float:
        retry = policy.retry
        return self.delay(
            attempt_no,
            retry.base.total_seconds() if retry.base else None,
            retry.cap.total_seconds() if retry.cap else None,
        )


# --- the retry budget ---------------------------------------------------------------------------


@dataclass(slots=True)
class Bucket:
    """One queue's retry budget as stored: tokens at `updated_at`, with first attempts
    counted up to (and including) fence `counted_fence`."""

    tokens: float
    updated_at: datetime
    counted_fence: int


@dataclass(frozen=True, slots=True)
class Budget:
    """The token bucket's arithmetic (the store keeps the bucket)."""

    ratio: float
    floor_per_second: float
    burst: float

    @classmethod
    def from_settings(cls, settings: config.Settings) -> Budget:
        b = settings.retry.budget
        return cls(b.ratio, b.floor_per_minute / 60.0, b.burst)

    def firsts_to_fill(self, tokens: float) -> int:
        """First attempts that fill a bucket holding `tokens` (a debt counts): counting more
        changes nothing."""
        return math.ceil((self.burst - tokens) / self.ratio) + 1 if self.ratio > 0 else 0

    def refill(self, bucket: Bucket, now: datetime, firsts: int) -> float:
        """Tokens now: what was there, plus time's share, plus `firsts` new first attempts.
        Debt (a negative balance, from delayed retries) is paid back first."""
        elapsed = max((now - bucket.updated_at).total_seconds(), 0.0)
        earned = elapsed * self.floor_per_second + firsts * self.ratio
        return min(self.burst, bucket.tokens + earned)

    def reserve(self, tokens: float, now: datetime) -> tuple[float, datetime | None]:
        """Take one token; returns the new balance and, when there was none to take, when
        the floor will have paid for this one (the retry waits until then)."""
        tokens -= 1.0
        if tokens >= 0:
            return tokens, None
        return tokens, now + timedelta(seconds=-tokens / self.floor_per_second)


# --- failure classes ------------------------------------------------------------------------------

_DIGITS = re.compile(r"\d+")
MESSAGE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Failure:
    """How a failed attempt is judged."""

    cls: FailureClass
    fingerprint: str
    counts: bool  # False when a rule says to ignore it: it does not use up an attempt
    why: str  # which rule or default decided the class


def fingerprint(
    executor: str, exit_code: int | None, reason: str | None, message: str | None
) -> str:
    """What identifies "the same failure" across attempts: the executor, the exit code (or
    signal), the reason and the last line of stderr, with numbers masked so a timestamp or a
    pid in the message does not make every failure look new."""
    parts = [
        executor,
        "-" if exit_code is None else str(exit_code),
        _DIGITS.sub("#", reason or ""),
        _DIGITS.sub("#", (message or "")[:MESSAGE_CHARS]),
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def classify(
    policy: policy.JobPolicy,
    *,
    executor: str,
    state: model.AttemptState,
    exit_code: int | None,
    reason: str | None,
    hint: FailureClass | None,
    message: str | None,
    http_status: int | None = None,
) -> Failure:
    """Judge a failed (or lost) attempt.

    The job's HTTP status rules and failure-class rules come first, in order, first match
    wins (a status is the receiver's word, and the job knows its receiver; a class rule
    matches the platform's verdict), then the platform's verdict (a deadline, SIGKILL, OOM,
    a lost node are transient; the http executor's classes of statuses; a failed assertion
    is `assertion`, which quarantines like a permanent failure), then the job's exit-code
    rules in order; anything else is `unknown`. A status rule does not judge a failed
    assertion: its status succeeded. A lost attempt is transient: nothing says the job
    itself is at fault.
    """
    print_ = fingerprint(executor, exit_code, reason, message)
    if state == model.AttemptState.LOST:
        return Failure(FailureClass.TRANSIENT, print_, True, "lost by its platform")
    if hint == FailureClass.ASSERTION:
        http_status = None
    for n, rule in enumerate(policy.failure_rules):
        if (what := _matched(rule, http_status, hint)) is not None:
            return _ruled(n, rule, print_, what)
    if hint is not None:
        return Failure(hint, print_, True, f"{executor} executor: {reason or hint}")
    if exit_code is not None and exit_code >= 0:
        for n, rule in enumerate(policy.failure_rules):
            if rule.on_exit_codes is not None and rule.on_exit_codes.match(exit_code):
                return _ruled(n, rule, print_, _said(f"exit code {exit_code}", rule.on_exit_codes))
    return Failure(FailureClass.UNKNOWN, print_, True, "no rule matched")


def _matched(
    rule: policy.FailureRule, http_status: int | None, hint: FailureClass | None
) -> str | None:
    """What a status or class rule matched of a failure, as its why says it; None: nothing."""
    statuses, classes = rule.on_http_statuses, rule.on_failure_classes
    if http_status is not None and statuses is not None and statuses.match(http_status):
        return _said(f"HTTP status {http_status}", statuses)
    if hint is not None and classes is not None and hint in classes:
        return f"failure class {hint} In [{', '.join(classes)}]"
    return None


def _said(what: str, matched: policy.Codes) -> str:
    return f"{what} {matched.operator} [{', '.join(map(str, matched.values))}]"


def _ruled(n: int, rule: policy.FailureRule, print_: str, what: str) -> Failure:
    why = f"rule {n + 1}: {what} -> {rule.action}"
    cls = FailureClass.PERMANENT if rule.action == "fail" else FailureClass.TRANSIENT
    return Failure(cls, print_, rule.action != "ignore", why)


# --- everything the store needs to move a failed job on ------------------------------------------


@dataclass(frozen=True, slots=True)
class Retry:
    """The retry rules in force: backoff, the per-queue budget, and when to quarantine.
    `budget` None spends no tokens (tests of other things); `backoff` None retries at once."""

    backoff: Backoff | None = None
    budget: Budget | None = None
    quarantine_after: int = 2

    @classmethod
    def from_settings(cls, settings: config.Settings, rng: random.Random | None = None) -> Retry:
        return cls(
            Backoff.from_settings(settings, rng),
            Budget.from_settings(settings),
            settings.retry.quarantine_after,
        )

    def delay(
        self, attempt_no: int, policy: policy.JobPolicy, *, asked: float | None = None
    ) -> float:
        """The backoff after attempt `attempt_no`; at least what the platform `asked` for
        (an HTTP Retry-After), up to the backoff's cap: a server cannot park a job."""
        if self.backoff is None:
            return 0.0
        backoff = self.backoff.for_policy(attempt_no, policy)
        if asked is None or asked <= backoff:
            return backoff
        return max(backoff, min(asked, self.backoff.cap_for(policy)))


# --- what a failure leads to ----------------------------------------------------------------------


class Verdict(enum.StrEnum):
    """What becomes of a job whose current attempt failed (or was lost)."""

    PERMANENT = "permanent"  # quarantined: the failure is the job's own
    REPEATED = "repeated"  # quarantined: the same unknown failure, quarantine_after times
    EXHAUSTED = "exhausted"  # failed: no attempts left
    RETRY = "retry"  # queued again, after a backoff (and a budget token)


_JOB_STATE = {
    Verdict.PERMANENT: model.JobState.QUARANTINED,
    Verdict.REPEATED: model.JobState.QUARANTINED,
    Verdict.EXHAUSTED: model.JobState.FAILED,
    Verdict.RETRY: model.JobState.QUEUED,
}


@dataclass(frozen=True, slots=True)
class Decision:
    """A failed attempt's consequence for its job, with everything its run-log line needs.

    `delay` is the backoff (seconds after the failure); `token_at`, set when the queue's
    retry budget had no token, is when one is paid for: the retry waits until then."""

    verdict: Verdict
    attempt_no: int
    state: model.AttemptState
    failure: Failure
    quarantine_after: int
    delay: float = 0.0
    token_at: datetime | None = None
    queue: str | None = None

    @property
    def to(self) -> model.JobState:
        return _JOB_STATE[self.verdict]

    @property
    def extra_attempt(self) -> bool:
        """A retry after an ignored failure: the job gets its attempt back."""
        return self.verdict == Verdict.RETRY and not self.failure.counts

    def run_at(self, now: datetime) -> datetime | None:
        """When a retry is due; None for a job that is not retried."""
        if self.verdict != Verdict.RETRY:
            return None
        return self.token_at or now + timedelta(seconds=self.delay)

    def waits_for_token(self, token_at: datetime | None, queue: str, now: datetime) -> Decision:
        """This decision, given when its queue's budget pays for its token (None: at once).
        Only a retry takes a token, and it waits only when the token comes after its backoff."""
        due = self.run_at(now)
        if due is None or token_at is None or token_at <= due:
            return self
        return replace(self, token_at=token_at, queue=queue)

    @property
    def reason(self) -> str:
        """The job's run-log line."""
        f, n = self.failure, self.attempt_no
        if self.verdict == Verdict.PERMANENT:
            return f"quarantined: attempt {n} failed permanently ({f.why})"
        if self.verdict == Verdict.REPEATED:
            k = self.quarantine_after
            same = "failed" if k == 1 else f"failed the same way {k} times in a row"
            return (
                f"quarantined: attempt {n} {same} (fingerprint {f.fingerprint}); waits for a person"
            )
        if self.verdict == Verdict.EXHAUSTED:
            return f"attempt {n} {self.state} ({f.cls}): no attempts left"
        ignored = "" if f.counts else ", which does not count toward max_attempts"
        if self.token_at is not None:
            wait = f"; queue {self.queue!r} retry budget is empty, so it waits for a token"
        else:
            wait = "; due again after a backoff" if self.delay > 0 else ""
        return f"retry: attempt {n} {self.state} ({f.cls}){ignored}, attempts remain{wait}"

    @property
    def details(self) -> dict[str, str]:
        """The job's run-log details: the failure's class, fingerprint and rule."""
        out = {"failure_class": str(self.failure.cls), "fingerprint": self.failure.fingerprint}
        out["rule"] = self.failure.why
        if self.token_at is not None:
            out |= {"budget": "empty", "queue": str(self.queue)}
        return out


def streak(
    fingerprint: str,
    attempt_no: int,
    earlier: Mapping[int, tuple[model.End, str | None]],
    longest: int,
) -> int:
    """How many attempts in a row, ending with attempt `attempt_no` (which failed with
    `fingerprint`), failed with that fingerprint, counting at most `longest`. `earlier`
    holds, by attempt number, the job's earlier attempts that may count (failed of class
    unknown, or not charged), each with its end and fingerprint. An attempt that is not
    charged is not in the row: it neither breaks a streak nor adds to it; one not in
    `earlier`, or of another fingerprint, ends it."""
    count, n = 1, attempt_no - 1
    while count < longest and n > 0:
        end, print_ = earlier.get(n, (None, None))
        if end is None or end.charged:
            if print_ != fingerprint:
                break
            count += 1
        n -= 1
    return count


def decide(
    failure: Failure,
    *,
    state: model.AttemptState,
    attempt_no: int,
    charged: int,
    max_attempts: int,
    streak: int,
    quarantine_after: int,
    delay: float,
) -> Decision:
    """What a failed attempt leads to. `charged`: the job's attempts that count toward
    `max_attempts`, this one included; `streak`: attempts in a row, ending with this one,
    that failed with its fingerprint; `delay`: the backoff a retry would wait.

    A permanent failure (or a failed assertion) quarantines; so does an unknown one
    `quarantine_after` times in a row. Otherwise a failure that counts and leaves no
    attempts fails the job, and anything else is retried (an ignored failure gives its
    attempt back)."""
    decision = functools.partial(
        Decision,
        attempt_no=attempt_no,
        state=state,
        failure=failure,
        quarantine_after=quarantine_after,
    )
    if failure.cls in (FailureClass.PERMANENT, FailureClass.ASSERTION):
        return decision(Verdict.PERMANENT)
    if failure.cls == FailureClass.UNKNOWN and streak >= quarantine_after:
        return decision(Verdict.REPEATED)
    if failure.counts and charged >= max_attempts:
        return decision(Verdict.EXHAUSTED)
    return decision(Verdict.RETRY, delay=max(delay, 0.0))
