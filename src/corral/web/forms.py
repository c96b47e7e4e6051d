"""What the dashboard's forms of HTTP jobs and schedules share: a form read into the body
the API takes (the request's spec, the job's fields and policy), so that the client checks
it as it checks the API's (corral.client.bodies); each refusal placed beside the field it
names; a stored job or template shown in the form with its secrets redacted; and those
secrets kept when a field comes back still showing the redaction marker.

Each input is named as the body's field it fills: the request's `method`, `url`,
`headers` (one `Name: value` a line), `body`, `json`, `expect` and its assertions
(`expect_body`, `expect_json` one a line, `max_response_time`); the job's
`max_attempts`, `queue`, `pool`, `priority`, `labels` (one `key=value` a line), `payload`,
`code_version`, `flow` (one of the tenant's flows; empty: none) and `policy` (JSON: what
the fields below do not say); and the policy's
shortcuts, as `corral submit` has them: `retry_base` and `retry_cap` (the backoff),
`http_request_timeout` (the request's timeout) and `attempt_deadline` (the job's
deadline), `sla`. An error is shown in `#error-{field}` right after its input; one no
field owns in `#error-form`.

A kept secret is sent only where it went before: a marker left in a header, the body, the
payload or the URL keeps the stored value while the URL keeps its scheme, host and port;
with another, the secret must be typed again (so an operator who cannot read it cannot
send it elsewhere either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from fastapi import Request
from starlette.responses import Response

from corral import (
    access,
    cadence,
    client,
    config,
    durations,
    errors,
    redaction,
    scheduling,
    timeouts,
)
from corral.web import pages

FORM = "form"
"""Where an error no field owns is shown (`#error-form`, above the form)."""
POLICY_SHORTCUTS = {
    "retry_base": ("retry", "base"),
    "retry_cap": ("retry", "cap"),
    "http_request_timeout": ("limits", "http_request_timeout"),
    "attempt_deadline": ("limits", "attempt_deadline"),
    "sla": ("sla",),
}
"""The policy's fields the form has an input of, and where each lies in the policy."""
SECRETS_IN = ("url", "headers", "body", "json")
"""The request's fields a secret may hide in (besides the job's payload)."""

REFUSALS = (errors.InvalidInput, errors.NotGranted, errors.QuotaExceeded, errors.FieldRefused)
"""What the client's checks refuse a form's body with: each drawn beside its field."""

Errors = dict[str, str]
"""A form's errors: the field's name, and what is wrong with it."""


def may_act(who: access.WebSession) -> None:
    """Forbidden (403) unless the session may act: a viewer sees no form."""
    if not who.role.allows(access.Role.OPERATOR):
        raise errors.Forbidden(f"a {who.role} may look but not act; it takes an operator")


def typed(form: Mapping[str, str]) -> dict[str, str]:
    """A form's fields as typed (browsers send a text area's line breaks as CRLF)."""
    return {name: value.replace("\r\n", "\n") for name, value in form.items()}


ASSERTIONS = ("expect_body", "expect_json", "max_response_time")
"""The request's assertions on its response, each a field (expect_json one a line)."""


def line(form: Mapping[str, str], name: str) -> str:
    """A one-line field, trimmed."""
    return form.get(name, "").strip()


def lines(form: Mapping[str, str], name: str) -> str:
    """A text area, its line breaks LF."""
    return form.get(name, "").replace("\r\n", "\n")


def whole(form: Mapping[str, str], name: str, errs: Errors) -> int | None:
    """A whole number field; None when left empty."""
    text = line(form, name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        errs.setdefault(name, f"{name}: {text!r} is not a whole number")
        return None


def _json(form: Mapping[str, str], name: str, errs: Errors) -> Any:
    """A JSON field, read; None when left empty."""
    text = lines(form, name)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        errs.setdefault(name, f"{name}: not valid JSON ({exc})")
        return None


def request_spec(form: Mapping[str, str], errs: Errors) -> dict[str, Any]:
    """The `http` spec of the request's fields (its executor checks it)."""
    spec: dict[str, Any] = {"method": line(form, "method") or "GET", "url": line(form, "url")}
    if headers := _headers(lines(form, "headers"), errs):
        spec["headers"] = headers
    if (body := lines(form, "body")).strip():
        spec["body"] = body
    if (given := _json(form, "json", errs)) is not None:
        spec["json"] = given
    if expect := line(form, "expect"):
        spec["expect"] = expect
    if pattern := line(form, "expect_body"):
        spec["expect_body"] = pattern
    if said := [row.strip() for row in lines(form, "expect_json").split("\n") if row.strip()]:
        spec["expect_json"] = said
    if within := line(form, "max_response_time"):
        spec["max_response_time"] = within
    return spec


def _headers(text: str, errs: Errors) -> dict[str, str]:
    """`Name: value` lines as headers; each name once."""
    headers: dict[str, str] = {}
    for n, row in enumerate(text.split("\n"), start=1):
        if not row.strip():
            continue
        name, colon, value = row.partition(":")
        name = name.strip()
        if not colon or not name:
            errs.setdefault("headers", f"headers: line {n}, {row.strip()!r}: write 'Name: value'")
        elif name.lower() in (h.lower() for h in headers):
            errs.setdefault("headers", f"headers: {name} is given twice; give each header once")
        else:
            headers[name] = value.strip()
    return headers


def _labels(text: str, errs: Errors) -> dict[str, str]:
    """`key=value` lines as labels (their keys and values checked with the job)."""
    labels: dict[str, str] = {}
    for n, row in enumerate(text.split("\n"), start=1):
        if not row.strip():
            continue
        key, eq, value = row.strip().partition("=")
        if not eq or not key.strip():
            errs.setdefault("labels", f"labels: line {n}, {row.strip()!r}: write key=value")
        else:
            labels[key.strip()] = value.strip()
    return labels


def policy(form: Mapping[str, str], errs: Errors) -> dict[str, Any]:
    """The job's policy: the `policy` field's JSON object with the shortcut fields set in
    it. A shortcut the JSON gives too is refused: neither wins silently."""
    given = _json(form, "policy", errs)
    if given is not None and not isinstance(given, dict):
        errs.setdefault("policy", 'policy: must be a JSON object, e.g. {"quarantine_after": 3}')
        given = None
    made: dict[str, Any] = given or {}
    for field, path in POLICY_SHORTCUTS.items():
        if not (value := line(form, field)):
            continue
        where = made
        for key in path[:-1]:
            where = where.setdefault(key, {})
            if not isinstance(where, dict):
                errs.setdefault("policy", f"policy: {key} must be a JSON object")
                break
        else:
            if path[-1] in where:
                errs.setdefault("policy", f"policy: {'.'.join(path)} is {field}'s: give it there")
            where[path[-1]] = value
    return made


def job_fields(form: Mapping[str, str], errs: Errors) -> dict[str, Any]:
    """An HTTP job's body (a schedule's job template) of the form's fields."""
    return {
        "executor": "http",
        "spec": request_spec(form, errs),
        "max_attempts": whole(form, "max_attempts", errs),
        "queue": line(form, "queue") or "default",
        "pool": line(form, "pool") or None,
        "priority": whole(form, "priority", errs) or 0,
        "labels": _labels(lines(form, "labels"), errs),
        "payload": _json(form, "payload", errs),
        "code_version": line(form, "code_version") or None,
        "policy": policy(form, errs),
        "flow": line(form, "flow") or None,
    }


def run_at(form: Mapping[str, str], errs: Errors) -> str | None:
    """`run_at` (wall time in `tz`, unless it carries an offset) as the instant the API
    takes, in ISO 8601; None (and the error) when it is missing or wrong."""
    text = line(form, "run_at")
    if not text:
        errs.setdefault("run_at", "run_at: give the time to run at, e.g. 2026-12-24T09:00")
        return None
    try:
        client.bodies.in_range(text, "run_at")
        return cadence.parse_instant(text, "run_at", line(form, "tz") or "UTC").isoformat()
    except errors.InvalidInput as exc:
        said = str(exc)
        errs.setdefault(said.partition(":")[0], said)
        return None


def tenant_of(who: access.WebSession, form: Mapping[str, str]) -> dict[str, str]:
    """The body's tenant: a session of every tenant names one in the form (else default);
    a session of one tenant says nothing, and the client takes its own."""
    if who.tenant is not None:
        return {}
    return {"tenant": line(form, "tenant") or "default"}


# --- where a refusal is shown --------------------------------------------------------------


def field_of(message: str, form: Mapping[str, str], fields: tuple[str, ...]) -> str:
    """The form field a refusal names (its message begins with the body's field), or
    FORM when it names none of `fields`."""
    head, _, rest = message.partition(":")
    if head.endswith(" spec"):  # "http spec: url: ...": the request's own field
        head = rest.strip().partition(":")[0]
    if head.startswith("label "):
        head = "labels"
    elif head == "policy.limits":  # the chain of limits broken: the one given last
        head = "http_request_timeout" if line(form, "http_request_timeout") else "attempt_deadline"
    elif head.startswith("policy"):
        dotted = {"policy." + ".".join(p): f for f, p in POLICY_SHORTCUTS.items()}
        head = dotted.get(head, "policy")
    return head if head in fields else FORM


def refused(
    exc: errors.CorralError, form: Mapping[str, str], fields: tuple[str, ...], errs: Errors
) -> tuple[int, dict[str, str]]:
    """`exc` (a refusal of the client's checks) placed beside its field in `errs`: the
    status of the form drawn again, as the API would answer (422, 409 for a name taken,
    403 for what the tenant is not granted or past a quota, 429 past its submit_rate with
    Retry-After), and its headers."""
    said = str(exc)
    errs.setdefault(field_of(said, form, fields), said)
    if isinstance(exc, errors.RateLimited):
        return 429, {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, errors.Conflict):
        return 409, {}
    if isinstance(exc, errors.InvalidInput):
        return 422, {}
    return 403, {}


def refused_page(request: Request, who: access.WebSession, exc: errors.CorralError) -> Response:
    """The page of an action (not a form of fields) the tenant's grant, quotas or the
    client's checks refused: 422 for what it would store, 403, or 429 with Retry-After
    past the tenant's submit rate."""
    status = 429 if isinstance(exc, errors.RateLimited) else 403
    status = 422 if isinstance(exc, errors.InvalidInput) else status
    shown = pages.page(request, "error.html", who, status=status, title="Refused", said=str(exc))
    if isinstance(exc, errors.RateLimited):
        shown.headers["Retry-After"] = str(exc.retry_after)
    return shown


# --- secrets kept --------------------------------------------------------------------------


def _origin(url: Any) -> tuple[str, str]:
    """Where a URL sends a request: its scheme, and its host and port (no user part)."""
    if not isinstance(url, str):
        return "", ""
    parts = urlsplit(url.strip())
    return parts.scheme.lower(), parts.netloc.rpartition("@")[2].lower()


def _holds_marker(value: Any) -> bool:
    return redaction.REDACTED in json.dumps(value)


def keep_secrets(job: MutableMapping[str, Any], stored: Mapping[str, Any], errs: Errors) -> None:
    """`job` (a body of the form) with each redaction marker left as it was shown put back
    to the secret of `stored` (the job or template the form was drawn from; {} for none).
    A marker with nothing stored behind it, or one the request would now carry elsewhere
    (another scheme, host or port), is refused naming its field."""
    spec, kept = job["spec"], dict(stored.get("spec") or {})
    here = _origin(spec.get("url"))
    same = here == _origin(kept.get("url")) and bool(here[1])
    places: list[tuple[str, MutableMapping[str, Any], Mapping[str, Any]]] = [
        (field, spec, kept) for field in SECRETS_IN
    ]
    places.append(("payload", job, {"payload": stored.get("payload")}))
    for field, holder, before in places:
        if field not in holder or not _holds_marker(holder[field]):
            continue
        if not same and before.get(field) is not None:
            errs.setdefault(field, f"{field}: {redaction.REDACTED} keeps a stored secret only"
                            " while the request goes where it went (the same scheme, host"
                            " and port); type the secret again")  # fmt: skip
            continue
        holder[field] = redaction.restored(holder[field], before.get(field))
        if _holds_marker(holder[field]):
            errs.setdefault(field, f"{field}: {redaction.REDACTED} stands for a secret stored"
                            " before, and there is none here: type the value")  # fmt: skip


# --- a stored job or template, shown -------------------------------------------------------


def template_values(template: Mapping[str, Any], settings: config.Settings) -> dict[str, str]:
    """A job template (or a job's fields) as the form's values, its secrets redacted."""
    spec = redaction.redacted(dict(template.get("spec") or {}))
    payload = template.get("payload")
    return {
        "method": str(spec.get("method", "GET")),
        "url": str(spec.get("url", "")),
        "headers": "\n".join(f"{k}: {v}" for k, v in (spec.get("headers") or {}).items()),
        "body": str(spec.get("body", "")),
        "json": _shown_json(spec["json"]) if "json" in spec else "",
        "expect": ",".join(spec.get("expect") or []),
        "expect_body": str(spec.get("expect_body", "")),
        "expect_json": "\n".join(spec.get("expect_json") or []),
        "max_response_time": str(spec.get("max_response_time", "")),
        "max_attempts": _text(template.get("max_attempts")),
        "queue": str(template.get("queue") or "default"),
        "pool": _text(template.get("pool")),
        "priority": _text(template.get("priority") or 0),
        "labels": "\n".join(f"{k}={v}" for k, v in (template.get("labels") or {}).items()),
        "payload": _shown_json(redaction.redacted(payload)) if payload is not None else "",
        "code_version": _text(template.get("code_version")),
        "flow": _text(template.get("flow")),
        **policy_values(template.get("policy") or {}, settings),
    }


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _shown_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def policy_values(stored: Mapping[str, Any], settings: config.Settings) -> dict[str, str]:
    """A stored policy as the shortcut fields and, in `policy`, the rest of it. Inner
    limits the job's deadline tightened by itself (as `job_policy` does) are left out:
    the same deadline tightens them again."""
    rest = json.loads(json.dumps(dict(stored)))  # a deep copy, to take parts out of
    limits = rest.get("limits") or {}
    for name in _derived(limits, settings):
        limits.pop(name)
    values = {}
    for field, path in POLICY_SHORTCUTS.items():
        *outer, last = path
        where = rest.get(outer[0]) if outer else rest
        seconds = where.pop(last, None) if isinstance(where, dict) else None
        values[field] = "" if seconds is None else _duration(seconds)
    for key in ("retry", "limits"):
        if rest.get(key) == {}:
            del rest[key]
    values["policy"] = _shown_json(rest) if rest else ""
    return values


def _derived(limits: Mapping[str, Any], settings: config.Settings) -> list[str]:
    """The inner limits of a stored policy that its attempt_deadline alone makes."""
    if "attempt_deadline" not in limits:
        return []
    given = timedelta(seconds=limits["attempt_deadline"])
    current: dict[str, timedelta] = dict(settings.timeouts)
    made = timeouts.tighten_inner(
        {**current, "attempt_deadline": given}, {"attempt_deadline"}, for_job=True
    )
    return [
        name
        for name in ("step_deadline", "http_request_timeout")
        if name in limits and made[name] == timedelta(seconds=limits[name])
    ]


def _duration(seconds: float) -> str:
    return durations.format_duration(timedelta(seconds=seconds)) if seconds else "0s"


def rule_values(s: scheduling.Schedule) -> dict[str, str]:
    """A schedule's rule and options as the form's values (its times with their offset,
    in its zone)."""
    return {
        "name": s.name,
        "when": "cron" if s.cron else "every",
        "cron": s.cron or "",
        "tz": s.tz,
        "every": _duration(s.every_seconds) if s.every_seconds else "",
        "start": _wall(s.anchor, s.tz),
        "until": _wall(s.until, s.tz),
        "catchup": s.catchup.value,
        "catchup_window": _duration(s.catchup_window_seconds),
        "catchup_max": str(s.catchup_max),
        "overlap": s.overlap.value,
        "jitter": _duration(s.jitter_seconds) if s.jitter_seconds else "",
        "pause_after": "" if s.pause_after is None else str(s.pause_after),
    }


def _wall(at: datetime | None, tz: str) -> str:
    return "" if at is None else at.astimezone(ZoneInfo(tz)).isoformat(timespec="seconds")
