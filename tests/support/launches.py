"""Launches for executor tests: what the dispatcher would hand an executor, and the
commands they run."""

from __future__ import annotations

from typing import Any

from corral import launching, model


def make_launch(
    kind: str,
    name: str,
    spec: dict[str, Any],
    *,
    job_id: int = 1,
    attempt_no: int = 1,
    fence: int = 1,
    deadline_seconds: float | None = None,
    reach: launching.Reach | None = None,
    payload: Any = None,
    idempotency_key: str | None = None,
    tenant: str = "acme",
) -> launching.Launch:
    """The Launch of attempt `attempt_no` (fence `fence`) of job `job_id` on `kind`."""
    labels = model.identity_labels(
        job_id=job_id,
        attempt_no=attempt_no,
        fence=fence,
        tenant=tenant,
        capability="default",
        idempotency_key=idempotency_key,
    )
    return launching.Launch(
        name=name,
        job_id=job_id,
        attempt_no=attempt_no,
        fence=fence,
        tenant=tenant,
        executor=kind,
        spec=spec,
        payload=payload,
        labels=labels,
        env=launching.attempt_env(
            labels, name=name, tenant=tenant, reach=reach or launching.Reach()
        ),
        deadline_seconds=deadline_seconds,
    )


def sh(script: str) -> list[str]:
    """The command that runs `script` with `sh -c`."""
    return ["sh", "-c", script]
