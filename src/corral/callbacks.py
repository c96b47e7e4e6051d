"""Callbacks: a job's result sent to a URL when the job ends (not after each attempt).

A job (or a schedule's template) may name `callback`, sent the result when the job
succeeds, and `failure_callback`, sent it when the job fails or is quarantined; a
cancelled job sends nothing. The store makes the callback job in the transaction that ends
the job (store/callbacks.py), so a crash can lose neither; this module decides, pure, what
that job is: an HTTP POST of the result as JSON to the URL, labelled `callback-of=<id>`,
in the job's tenant and queue, with no callback of its own. It is delivered as any HTTP
job is (at least once, through the address guard, signed with its tenant's secrets, with
its own retries and run log), every delivery with the same Idempotency-Key (its own
idempotency key, `callback:<job id>:<fence>`), and no quota of its tenant counts it.

The result's fields (`body`): job, attempt, fence, state, status (an HTTP job's) or
exit_code, reason, response_time (seconds, as the executor measured it), schedule and
nominal_time (a firing's job's), ended_at, and output: an HTTP job's response headers
(secrets redacted, as the run log shows them) and the first OUTPUT_BYTES of its body as
base64, a command's last OUTPUT_BYTES of stdout, a Python task's return value as JSON.
The result is what a job's program or a server made, so what a database cannot hold in it
(a NUL of binary stdout, a lone surrogate, NaN) is mended (corral.plain.mended): it becomes
the callback job's payload in the transaction that ends the job, which it must not fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from corral import launching, model, plain, scheduling

J = model.JobState

LABEL = "callback-of"
"""The label of a callback job: the id of the job whose result it sends."""
ATTEMPTS = 10
"""How many attempts a callback job has to deliver the result (a receiver that is down
for a while is waited for with the retry policy's backoff)."""
OUTPUT_BYTES = 65_536
"""How much of an output the result carries: the first bytes of a response's body, the
last of a command's stdout."""
STDOUT = "stdout"

SENT_ON: Mapping[model.JobState, str] = {
    J.SUCCEEDED: "callback",
    J.FAILED: "failure_callback",
    J.QUARANTINED: "failure_callback",
}
"""Which URL of the job each end sends its result to; an end not here sends none."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A job that just ended, with what its last attempt left: its fence, number, exit
    code or HTTP status, reason and output (None: none came back, e.g. a lost attempt)."""

    job: model.Job
    state: model.JobState
    fence: int
    attempt_no: int
    exit_code: int | None = None
    http_status: int | None = None
    reason: str | None = None
    output: launching.RunLog | None = None


def target(job: model.Job, state: model.JobState) -> str | None:
    """The URL a job that ended in `state` sends its result to, or None (a callback job
    sends none: it has no callback of its own)."""
    field = SENT_ON.get(state)
    if field is None or job.callback_of is not None:
        return None
    url: str | None = getattr(job, field)
    return url


def key(job_id: int, fence: int) -> str:
    """The callback job's idempotency key: one per end of a job (a quarantined job sent
    back may end again, with a newer attempt), and its deliveries' Idempotency-Key."""
    return f"callback:{job_id}:{fence}"


def callback_job(ended: Ended, now: datetime) -> model.NewJob | None:
    """The job that sends `ended`'s result, or None when there is nowhere to send it."""
    url = target(ended.job, ended.state)
    if url is None:
        return None
    job = ended.job
    return model.NewJob(
        executor="http",
        spec={"method": "POST", "url": url, "headers": {}, "expect": ["2xx"]},
        payload=body(ended, now),
        queue=job.queue,
        tenant=job.tenant,
        priority=job.priority,
        max_attempts=ATTEMPTS,
        idempotency_key=key(job.id, ended.fence),
        labels={LABEL: str(job.id)},
        tenant_made=job.tenant_made,
        callback_of=job.id,
    )


def body(ended: Ended, now: datetime) -> dict[str, Any]:
    """The result a callback sends, as JSON (the module's docstring lists its fields), as a
    database can hold it (corral.plain.mended)."""
    log = ended.output
    firing = _firing(ended.job.payload)
    result = {
        "job": ended.job.id,
        "attempt": ended.attempt_no,
        "fence": ended.fence,
        "state": str(ended.state),
        "status": ended.http_status if ended.http_status is not None else _status(log),
        "exit_code": ended.exit_code,
        "reason": ended.reason,
        "response_time": None if log is None else log.latency,
        "schedule": firing.get("schedule"),
        "nominal_time": firing.get("nominal_time"),
        "ended_at": model.iso(now),
        "output": output(log),
    }
    held: dict[str, Any] = plain.mended(result)
    return held


def output(log: launching.RunLog | None) -> dict[str, Any]:
    """What the result carries of an attempt's output: what its executor gave for it
    (`RunLog.result`: a response's headers and body, a return value), and a command's
    stdout, its last OUTPUT_BYTES."""
    if log is None:
        return {}
    out = dict(log.result or {})
    stdout = log.stream(STDOUT)
    if stdout is not None:
        data = stdout.text.encode("utf-8", "surrogatepass")
        cut = stdout.cut or len(data) > OUTPUT_BYTES
        out[STDOUT] = launching.decoded(data[-OUTPUT_BYTES:], cut_before=cut)
        out["stdout_cut"] = cut
    return out


def _status(log: launching.RunLog | None) -> int | None:
    return None if log is None else log.status


def _firing(payload: Any) -> Mapping[str, Any]:
    """What a firing's job's payload says of its schedule and nominal time (else nothing)."""
    said = payload.get(scheduling.FIRING) if isinstance(payload, Mapping) else None
    return said if isinstance(said, Mapping) else {}
