"""What an alert is about, as the subject the outbox and the streaks store: the job's
schedule when it has one, else its idempotency key, else the job itself; each a tenant's,
never another tenant's of the same name. Pure: the alerter's rules name subjects with
these, and the store's reads find a subject's jobs by them."""

from __future__ import annotations

import hashlib

SUBJECT_CHARS = 300
"""The longest subject stored (alerts.subject, alert_streaks.subject)."""


def schedule_subject(tenant: str, schedule: str) -> str:
    """The subject of messages about a schedule: its firings and their jobs."""
    return f"schedule:{tenant}/{schedule}"


def key_subject(tenant: str, key: str) -> str:
    """The subject of messages about the jobs of a tenant's idempotency key (of no
    schedule): the job through its retries, and any job of that key after it. A key too
    long to store in a subject is stored by its hash (`keyhash:TENANT/SHA256`)."""
    said = f"key:{tenant}/{key}"
    if len(said) <= SUBJECT_CHARS:
        return said
    return f"keyhash:{tenant}/{hashlib.sha256(key.encode()).hexdigest()}"


def job_subject(tenant: str, job_id: int) -> str:
    """The subject of messages about one job of neither a schedule nor a key."""
    return f"job:{tenant}/{job_id}"


def monitor_subject(tenant: str, monitor: str) -> str:
    """The subject of messages about a monitor (corral.monitoring)."""
    return f"monitor:{tenant}/{monitor}"


def tenant_subject(tenant: str) -> str:
    """The subject of a digest: what a rule held back of all of a tenant's subjects."""
    return f"tenant:{tenant}"


def job_subjects(tenant: str, job_id: int, schedule: str | None, key: str | None) -> set[str]:
    """Every subject a job's news may be about (the rules pick one of them)."""
    found = {job_subject(tenant, job_id)}
    if schedule is not None:
        found.add(schedule_subject(tenant, schedule))
    if key is not None:
        found.add(key_subject(tenant, key))
    return found


def subject_parts(subject: str) -> tuple[str, str, str]:
    """A subject's kind, tenant and name (`schedule`, `acme`, `nightly`); a subject of an
    older corral (`queue:billing`, its tenant unsaid) has the tenant ''."""
    kind, _, about = subject.partition(":")
    tenant, slash, name = about.partition("/")
    return (kind, tenant, name) if slash else (kind, "", about)
