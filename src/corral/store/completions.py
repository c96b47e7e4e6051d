"""Completions: each attempt ends once, then its job follows. A success ends the job; a
failure is judged (retry.classify), decided (retry.decide) and applied here."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from corral import errors, failpoints, launching, model, plain, policy, retry
from corral.store import dialects, flows, statements
from corral.store.attempts import attempt_record_running
from corral.store.budgets import budget_take
from corral.store.callbacks import JobEnd, callbacks_make
from corral.store.events import Applied, jobs_follow, transition
from corral.store.rows import ACTIVE, job_from_row, per_row
from corral.store.runlogs import run_logs_write
from corral.store.tables import (
    attempts,
    jobs,
)

A, J = model.AttemptState, model.JobState
FC = model.FailureClass


def attempt_settle(
    conn: Connection,
    *,
    launched: Sequence[int],
    finishes: Sequence[Finish],
    now: datetime,
    retry: retry.Retry | None = None,
) -> tuple[list[int], list[Outcome]]:
    """One transaction for a tick's last step: apply the completions that have arrived,
    then record the launched attempts that are still launching as running. Every row it
    writes is locked first, in fence order: another writer (the completion writer, a
    reconciler) may be writing some of them at the same moment."""
    dialects.lock_in_order(conn, attempts, sorted({*launched, *(f.fence for f in finishes)}))
    outcomes = attempt_finish(conn, finishes=finishes, now=now, retry=retry, locked=True)
    ended = {o.fence for o in outcomes}
    still = [fence for fence in launched if fence not in ended]
    return attempt_record_running(conn, fences=still, now=now, locked=True), outcomes


@dataclass(frozen=True, slots=True)
class Finish:
    """An attempt's end as an executor (or recovery) saw it: succeeded, failed or lost.

    `failure_class` is the platform's own verdict on a failure, when it has one (a deadline
    or a kill is transient); `message` is the last line of stderr or the like."""

    fence: int
    state: model.AttemptState
    exit_code: int | None
    reason: str | None
    failure_class: model.FailureClass | None = None
    message: str | None = None
    retry_after: float | None = None  # seconds the platform asked to wait before a retry
    http_status: int | None = None  # an HTTP attempt's status: the job's status rules read it
    output: launching.RunLog | None = None  # what the attempt left to read: kept in its run log

    def __post_init__(self) -> None:
        """The reason and message as a database can hold them (corral.plain.mended_text):
        they quote what a job's program or a server said (an exception, a body), and one
        that could not be written would keep this end, and every end written with it, from
        being written. Every end of an attempt with its outcome is written from a Finish
        (the hot settles' too), so this is the one place."""
        for name in ("reason", "message"):
            said = getattr(self, name)
            if said is not None and (held := plain.mended_text(said)) is not said:
                object.__setattr__(self, name, held)

    @classmethod
    def seen(cls, fence: int, obs: launching.Observation) -> Finish:
        """The end of attempt `fence` as a finished observation of its launch says it: a
        success is one that exited 0 (or has no exit code). A platform that gives no output
        but a message (a container's termination message) has that as its run log."""
        ok = obs.phase is launching.Phase.SUCCEEDED and obs.exit_code in (0, None)
        output = obs.output
        if output is None and obs.message:
            size = len(obs.message.encode())
            output = launching.RunLog(streams=(launching.Stream("message", obs.message, size),))
        return cls(
            fence,
            A.SUCCEEDED if ok else A.FAILED,
            obs.exit_code,
            obs.reason,
            obs.failure_class,
            obs.message,
            obs.retry_after,
            obs.http_status,
            output,
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one applied completion did to its job."""

    job_id: int
    fence: int
    attempt_no: int
    attempt_state: model.AttemptState
    job_state: model.JobState


ENDINGS = frozenset({A.SUCCEEDED, A.FAILED, A.LOST})


@dataclass(frozen=True, slots=True)
class _Judged:
    job: model.Job
    policy: policy.JobPolicy
    failure: retry.Failure
    retry_after: float | None = None
    http_status: int | None = None


def attempt_finish(
    conn: Connection,
    *,
    finishes: Sequence[Finish],
    now: datetime,
    retry: retry.Retry | None = None,
    locked: bool = False,
) -> list[Outcome]:
    """Apply completions: each attempt ends once (repeats are no-ops), then its job follows.

    A success ends the job `succeeded`. A failure or a loss is classed (retry.classify):
    a permanent one, or the same unknown one `quarantine_after` times in a row, quarantines
    the job; otherwise it goes back to `queued` while attempts remain (due after a backoff,
    and after a token from its queue's retry budget), else ends `failed`.
    """
    if bad := {f.state for f in finishes} - ENDINGS:
        raise errors.IllegalTransition(f"an attempt cannot finish as {', '.join(sorted(bad))}")
    rules = retry or _PLAIN
    if not locked:  # (`locked`: the caller locked these rows, in fence order, already)
        dialects.lock_in_order(conn, attempts, [f.fence for f in finishes])
    judged = _judge(conn, [f for f in finishes if f.state != A.SUCCEEDED])
    ended = _attempts_end(conn, finishes, judged, now)
    if ended:
        output = {f.fence: f.output for f in finishes if f.output and f.output.kept}
        kept = [(a.id, a.job_id, output[a.id]) for a, _ in ended if a.id in output]
        run_logs_write(conn, kept, now)
        failpoints.hit("mid_completion")
    won = [a for a, state in ended if state == A.SUCCEEDED]
    outcomes = _jobs_succeed(conn, won, now)
    lost = [(a, state) for a, state in ended if state != A.SUCCEEDED]
    outcomes += _jobs_after_failure(conn, lost, judged, now, rules)
    asked = [judged[a.id] for a, _ in lost if judged[a.id].job.flow is not None]
    flows.flows_hold(conn, holds=[(j.job, j.http_status, j.retry_after) for j in asked], now=now)
    callbacks_make(conn, ends=_job_ends(outcomes, finishes), now=now)
    return outcomes


def _job_ends(outcomes: Sequence[Outcome], finishes: Sequence[Finish]) -> list[JobEnd]:
    """What the outcomes did to their jobs (callbacks_make's), with how their attempts
    ended."""
    by_fence = {f.fence: f for f in finishes}
    ends = []
    for o in outcomes:
        f = by_fence[o.fence]
        ends.append(
            JobEnd(
                o.job_id,
                o.job_state,
                o.fence,
                o.attempt_no,
                o.attempt_state,
                f.exit_code,
                f.http_status,
                f.reason,
                f.output,
            )
        )
    return ends


def _attempts_end(
    conn: Connection, finishes: Sequence[Finish], judged: Mapping[int, _Judged], now: datetime
) -> list[tuple[Applied, model.AttemptState]]:
    """End each attempt still active as its finish says, one transition per group of the
    same values (and per state it may end from); what was ended, and in which state."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for f in finishes:
        j = judged.get(f.fence)
        cls, print_ = (j.failure.cls, j.failure.fingerprint) if j else (None, None)
        groups[(f.state, f.exit_code, f.reason, cls, print_)].append(f.fence)
    ended: list[tuple[Applied, model.AttemptState]] = []
    for (to, code, reason, cls, print_), fences in groups.items():
        values = {
            "exit_code": code,
            "reason": reason,
            "finished_at": now,
            "last_seen_at": now,
            "failure_class": cls,
            "fingerprint": print_,
        }
        why = statements.ended(code, reason, str(to))
        todo = set(fences)
        for expected in ACTIVE:
            if to == A.LOST and expected == A.LAUNCHING:
                continue  # a launching attempt that is not there is launched again, not lost
            applied = transition(
                conn,
                entity="attempt",
                ids=sorted(todo),
                expected=expected,
                to=to,
                now=now,
                reason=why if cls is None else f"{why} ({cls})",
                values=values,
            )
            ended += [(a, to) for a in applied]
            todo -= {a.id for a in applied}
    return ended


_PLAIN = retry.Retry()


def _judge(conn: Connection, failed: Sequence[Finish]) -> dict[int, _Judged]:
    """Class and fingerprint of each failed attempt still active, with its job."""
    if not failed:
        return {}
    rows = conn.execute(
        select(attempts.c.id.label("fence"), attempts.c.executor.label("platform"), *jobs.c)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(
            dialects.one_of(conn, attempts.c.id, [f.fence for f in failed]),
            attempts.c.state.in_(ACTIVE),
        )
    ).all()
    found = {
        r.fence: (r.platform, job_from_row({c.name: r._mapping[c.name] for c in jobs.c}))
        for r in rows
    }
    out = {}
    for f in failed:
        if f.fence not in found:
            continue
        executor, job = found[f.fence]
        own = policy.JobPolicy.read(job.policy)
        failure = retry.classify(
            own,
            executor=executor,
            state=f.state,
            exit_code=f.exit_code,
            reason=f.reason,
            hint=f.failure_class,
            message=f.message,
            http_status=f.http_status,
        )
        out[f.fence] = _Judged(job, own, failure, f.retry_after, f.http_status)
    return out


def _jobs_succeed(conn: Connection, won: Sequence[Applied], now: datetime) -> list[Outcome]:
    """Jobs whose current attempt succeeded end `succeeded` (fenced to that attempt)."""
    by_no: dict[int, list[Applied]] = defaultdict(list)
    for a in won:
        by_no[a.attempt_no].append(a)
    outcomes = []
    for n, group in by_no.items():  # one reason each keeps the run log exact
        applied = transition(
            conn,
            entity="job",
            ids=[a.job_id for a in group],
            expected=J.RUNNING,
            to=J.SUCCEEDED,
            now=now,
            reason=statements.succeeded(n),
            attempt_nos=[a.attempt_no for a in group],
            attempt_ids=[a.id for a in group],
        )
        fence = {a.job_id: a.id for a in group}
        outcomes += [Outcome(j.id, fence[j.id], n, A.SUCCEEDED, J.SUCCEEDED) for j in applied]
    return outcomes


def _jobs_after_failure(
    conn: Connection,
    lost: Sequence[tuple[Applied, model.AttemptState]],
    judged: Mapping[int, _Judged],
    now: datetime,
    rules: retry.Retry,
) -> list[Outcome]:
    """Move each job on after its current attempt failed, as retry.decide says: quarantined,
    queued (after a backoff, and a token from its queue's retry budget) or failed."""
    if not lost:
        return []
    decisions = _decide(conn, lost, judged, rules)
    _spend_budget(conn, [(a, judged[a.id]) for a, _ in lost], decisions, now, rules)
    groups: dict[tuple[Any, ...], list[Applied]] = defaultdict(list)
    for a, _ in lost:
        d = decisions[a.id]
        groups[(d.to, d.reason, tuple(d.details.items()))].append(a)
    state_of = {a.id: state for a, state in lost}
    outcomes = []
    for (to, reason, details), group in groups.items():
        applied = _jobs_move(conn, group, decisions, to, reason, dict(details), now)
        fence = {a.job_id: a for a in group}
        outcomes += [
            Outcome(j.id, fence[j.id].id, fence[j.id].attempt_no, state_of[fence[j.id].id], to)
            for j in applied
        ]
    return outcomes


def _decide(
    conn: Connection,
    lost: Sequence[tuple[Applied, model.AttemptState]],
    judged: Mapping[int, _Judged],
    rules: retry.Retry,
) -> dict[int, retry.Decision]:
    """What each failed attempt's job does next (retry.decide), by fence."""
    streaks = _streaks(conn, [(a, judged[a.id]) for a, _ in lost], rules)
    decisions = {}
    for a, state in lost:
        j = judged[a.id]
        decisions[a.id] = retry.decide(
            j.failure,
            state=state,
            attempt_no=a.attempt_no,
            charged=j.job.charged_attempts,
            max_attempts=j.job.max_attempts,
            streak=streaks[a.id],
            quarantine_after=j.policy.quarantine_after or rules.quarantine_after,
            delay=rules.delay(a.attempt_no, j.policy, asked=j.retry_after),
        )
    return decisions


def _jobs_move(
    conn: Connection,
    group: Sequence[Applied],
    decisions: Mapping[int, retry.Decision],
    to: model.JobState,
    reason: str,
    details: dict[str, Any],
    now: datetime,
) -> list[Applied]:
    """Move the jobs of `group` (their attempts, all decided the same) from running to `to`:
    when queued, each due at its own time; an extra attempt where a decision grants one."""
    values: dict[str, Any] = {}
    if to == J.QUEUED:
        run_at = {a.job_id: decisions[a.id].run_at(now) for a in group}
        values["run_at"] = per_row(jobs.c.id, run_at, now)
    if any(decisions[a.id].extra_attempt for a in group):
        values["max_attempts"] = jobs.c.max_attempts + 1
    return jobs_follow(conn, group, to=to, now=now, reason=reason, details=details, values=values)


def _streaks(
    conn: Connection, ended: Sequence[tuple[Applied, _Judged]], rules: retry.Retry
) -> dict[int, int]:
    """For each ended attempt of unknown class: how many attempts in a row, ending with it,
    failed with its fingerprint. Attempts that never launched are not in the row: they
    neither break a streak nor add to it."""
    out = {a.id: 1 for a, _ in ended}
    todo = [(a, j) for a, j in ended if j.failure.cls == FC.UNKNOWN and a.attempt_no > 1]
    if not todo:
        return out
    longest = max(j.policy.quarantine_after or rules.quarantine_after for _, j in todo)
    rows = conn.execute(
        select(attempts.c.job_id, attempts.c.attempt_no, attempts.c.fingerprint, attempts.c.reason)
        .where(
            dialects.one_of(conn, attempts.c.job_id, [a.job_id for a, _ in todo]),
            or_(
                and_(attempts.c.state == A.FAILED, attempts.c.failure_class == FC.UNKNOWN),
                attempts.c.reason.in_(sorted(model.UNCHARGED)),
            ),
        )
        .order_by(attempts.c.job_id, attempts.c.attempt_no.desc())
    ).all()
    earlier: dict[int, dict[int, tuple[model.End, str | None]]] = defaultdict(dict)
    for r in rows:
        earlier[r.job_id][r.attempt_no] = (model.End.of(r.reason), r.fingerprint)
    for a, j in todo:
        out[a.id] = retry.streak(j.failure.fingerprint, a.attempt_no, earlier[a.job_id], longest)
    return out


def _spend_budget(
    conn: Connection,
    retries: Sequence[tuple[Applied, _Judged]],
    decisions: dict[int, retry.Decision],
    now: datetime,
    rules: retry.Retry,
) -> None:
    """Take a token from its queue's budget for every retry (a guarded update of the bucket
    in this transaction); a retry that finds none waits until the budget has one for it.
    A callback job's retries take none: no quota counts a callback (corral.callbacks)."""
    if rules.budget is None:
        return
    by_queue: dict[str, list[Applied]] = defaultdict(list)
    for a, j in retries:
        if decisions[a.id].verdict == retry.Verdict.RETRY and j.job.callback_of is None:
            by_queue[j.job.queue].append(a)
    for queue in sorted(by_queue):  # one order for every writer: no deadlock on PostgreSQL
        group = by_queue[queue]
        tokens = budget_take(conn, queue, len(group), now, rules.budget)
        for a, token_at in zip(group, tokens, strict=True):
            decisions[a.id] = decisions[a.id].waits_for_token(token_at, queue, now)
