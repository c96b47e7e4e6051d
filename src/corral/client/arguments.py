"""A job given as JSON (an API body, a line of `corral submit --from-file`) as
`Client.submit`'s keyword arguments, and the rule for a run_at in the past."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from corral import durations, errors
from corral.client import jobs

_TEXT_FIELDS = (
    "executor", "queue", "tenant", "pool", "idempotency_key", "code_version", "callback",
    "failure_callback", "flow",
)  # fmt: skip
_NULLABLE = frozenset(
    {"pool", "idempotency_key", "code_version", "max_attempts", "run_at", "task_version"}
    | {"callback", "failure_callback", "flow"}
)


def submit_arguments(given: Any, *, now: datetime | None = None) -> dict[str, Any]:
    """A job as a JSON object (the keys of `Client.submit`, e.g. `{"spec": {"command":
    ["echo", "hi"]}, "queue": "q", "idempotency_key": "k"}`) as `Client.submit`'s keyword
    arguments; InvalidInput naming the field and the rule when one is wrong. Given `now`
    (a submit, not a template), it also takes `delay` (a duration: run_at is now plus it)
    and `allow_past` (a run_at more than a second before `now` is refused without it)."""
    if not isinstance(given, dict):
        raise errors.InvalidInput(
            'must be a JSON object, e.g. {"spec": {"command": ["echo", "hi"]}}'
        )
    if now is not None:
        given = dict(given)
        delay, allow_past = given.pop("delay", None), given.pop("allow_past", False)
        return _timed(submit_arguments(given), now, delay=delay, allow_past=allow_past)
    unknown = sorted(set(given) - set(jobs.SUBMIT_FIELDS))
    if unknown:
        raise errors.InvalidInput(
            f"{unknown[0]}: unknown field (allowed: {', '.join(jobs.SUBMIT_FIELDS)})"
        )
    if "spec" not in given and "task" not in given:
        raise errors.InvalidInput(
            'spec: required, e.g. {"command": ["echo", "hi"]}; or a Python task:'
            ' {"task": "send-invoice", "payload": {...}}'
        )
    args = dict(given)
    for field, value in given.items():
        if not (value is None and field in _NULLABLE) and (rule := _wrong(field, value)):
            raise errors.InvalidInput(f"{field}: {rule}")
    if (run_at := given.get("run_at")) is not None:
        try:
            args["run_at"] = datetime.fromisoformat(run_at)
        except ValueError:
            raise errors.InvalidInput(
                f"run_at: {run_at!r} is not an ISO 8601 time, e.g. 2026-12-01T09:00:00+00:00"
            ) from None
    return args


def _wrong(field: str, value: Any) -> str | None:
    """What is wrong with a job's field given as JSON, or None (the values themselves are
    checked by `check_job`, as for any job)."""
    if field in _TEXT_FIELDS or field == "run_at":
        return None if isinstance(value, str) else "must be a string"
    if field == "task":
        return None if isinstance(value, str) else "must be a string: the task's name"
    if field in ("priority", "max_attempts", "task_version"):
        whole = isinstance(value, int) and not isinstance(value, bool)
        return None if whole else "must be a whole number"
    if field in ("spec", "policy"):
        return None if isinstance(value, dict) else "must be a JSON object"
    if field == "labels":
        strings = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return None if strings else "must be an object of strings"
    return None


PAST_SLACK = timedelta(seconds=1)
"""How far before now a run_at may be without `allow_past`: a clock's skew, no more."""


def _timed(
    args: dict[str, Any], now: datetime, *, delay: Any = None, allow_past: Any = False
) -> dict[str, Any]:
    """`args` with run_at from `delay`, and a run_at in the past refused unless
    `allow_past`."""
    from corral import cadence

    if not isinstance(allow_past, bool):
        raise errors.InvalidInput("allow_past: must be true or false")
    if delay is not None:
        if args.get("run_at") is not None:
            raise errors.InvalidInput("delay: give run_at or delay, not both")
        if isinstance(delay, bool) or not isinstance(delay, str | int | float):
            raise errors.InvalidInput("delay: must be a duration, e.g. 10m, 1h30m or 90 (seconds)")
        args["run_at"] = now + cadence.parse_duration(str(delay), "delay")
    run_at = args.get("run_at")
    if run_at is not None and not allow_past and (before := past_by(run_at, now)):
        raise errors.InvalidInput(
            f"run_at: {run_at.isoformat()} is {before} before now; send allow_past: true"
            " (corral submit --allow-past) to run it at once"
        )
    return args


def past_by(run_at: datetime, now: datetime) -> str | None:
    """How long before `now` a run_at is, in words, when that is more than PAST_SLACK (a
    typo in a date must not run a job at once: the API's `allow_past` and the CLI's
    `--allow-past` take one); None for a time to come, or a naive one."""
    if run_at.tzinfo is None or run_at >= now - PAST_SLACK:
        return None
    return durations.format_duration(timedelta(seconds=int((now - run_at).total_seconds())))
