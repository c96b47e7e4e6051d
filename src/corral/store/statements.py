"""The SQL text every claim and settle shares, whichever database and path writes it.

The general path (claims.py, completions.py) and both databases' hot paths (postgres/,
sqlite/) write the same rows: an attempt per claimed job, the same run-log lines, the same
columns of a success. Each piece is written here once, as SQL where the statements build it
and as the Python value beside it where the general path builds it, so a change to a run-log
line or a column cannot reach one path and miss another.
"""

from __future__ import annotations

EVENT_COLUMNS = "job_id, attempt_id, entity, from_state, to_state, reason, at, details"
"""The columns of an events row a claim or a settle writes, in the order they give them."""

ATTEMPT_COLUMNS = (
    "job_id, attempt_no, launch_name, executor, state, created_at, updated_at,"
    " deadline_at, lease_until, lease_seconds"
)
"""The columns of the attempt a claim makes."""

RUN_LOG_COLUMNS = (
    "attempt_id, job_id, recorded_at, latency, status, address, streams, bytes, tenant"
)
"""The columns of a run log a success keeps."""

CLAIM_ORDER = "priority DESC, run_at, id"
"""The order a claim takes due jobs in: most urgent first (claims.urgency in Python)."""


def claimed(attempt_no: int) -> str:
    """The run log's reason when a claim takes a job."""
    return f"claimed: attempt {attempt_no} launching"


def claimed_sql(attempt_no: str) -> str:
    """`claimed` as an SQL expression over the column `attempt_no`."""
    return f"'claimed: attempt ' || {attempt_no} || ' launching'"


def succeeded(attempt_no: int) -> str:
    """The run log's reason when a job ends with its attempt's success."""
    return f"attempt {attempt_no} succeeded"


def succeeded_sql(attempt_no: str) -> str:
    """`succeeded` as an SQL expression over the column `attempt_no`."""
    return f"'attempt ' || {attempt_no} || ' succeeded'"


def ended(code: int | None, reason: str | None, state: str = "succeeded") -> str:
    """The run log's reason when an attempt ends in `state`: its own reason, else its exit
    code, else the state it ended in."""
    return reason or (f"exit {code}" if code is not None else state)


def ended_sql(code: str, reason: str) -> str:
    """`ended` of a success as an SQL expression over the columns `code` and `reason`."""
    return f"coalesce({reason}, 'exit ' || {code}, 'succeeded')"


def success_set(now: str, code: str, reason: str) -> str:
    """The SET clause of an attempt that succeeded at `now`, with its exit code and reason:
    the values completions.attempt_finish gives a success."""
    return (
        f"state = 'succeeded', updated_at = {now}, exit_code = {code}, reason = {reason},"
        f" finished_at = {now}, last_seen_at = {now}, failure_class = NULL, fingerprint = NULL"
    )


def _tenants_in(state: str, name: str, also: str = "") -> str:
    return f"""{name}(tenant) AS (
    SELECT (SELECT tenant FROM jobs WHERE state = '{state}'{also} ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (
        SELECT j.tenant FROM jobs AS j
        WHERE j.state = '{state}'{also} AND j.tenant > t.tenant ORDER BY j.tenant LIMIT 1
    )
    FROM {name} AS t WHERE t.tenant IS NOT NULL
)"""


# Queued jobs of a flow are not in ix_jobs_queued_tenant (they are the flow claim's), so
# the queued tenants are those with a queued job of no flow, as its WHERE says.
TENANTS_WAITING = f"""{_tenants_in("queued", "queued_tenants", " AND flow IS NULL")},
{_tenants_in("scheduled", "scheduled_tenants")},
waiting AS (
    SELECT tenant FROM queued_tenants WHERE tenant IS NOT NULL
    UNION
    SELECT tenant FROM scheduled_tenants WHERE tenant IS NOT NULL
)"""
"""`waiting`: the tenants with queued jobs of no flow or scheduled jobs (common table
expressions of a WITH RECURSIVE), found by skipping through the claim's indexes
(ix_jobs_queued_tenant, ix_jobs_scheduled_tenant): one probe a tenant, whatever the number
of jobs."""
