"""What a job's page shows of what the job does and when: an HTTP job's whole request as it
will be sent (method, URL, headers, the body or JSON, the statuses that mean success and
what else it asserts of the response), its
secrets redacted (shapes.shown); a command, a task or an image otherwise; and, while it
waits to run, when it runs, also as words ("in 5 min"). Pure: the page passes its clock's
now."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import unquote_plus

from corral import model, redaction, shapes

_FORM = re.compile(r"^[^=&\s]+=[^&\s]*(&[^=&\s]+=[^&\s]*)*$")
"""A body that is form fields (a=1&b=2): a field's value is redacted by its name."""


def what_and_when(job: model.Job, now: datetime) -> dict[str, Any]:
    """The page's values: `target` (shapes.job_target), `sends` (an HTTP job's request, else
    None), `callbacks` (callbacks_of), `next_run` (its run_at while it waits to run, else
    None) and `from_now`."""
    waits = job.state in shapes.WAITING
    return {
        "target": shapes.job_target(job),
        "sends": request_of(job),
        "callbacks": callbacks_of(job),
        "next_run": job.run_at if waits else None,
        "from_now": from_now(job.run_at, now) if waits else "",
    }


def request_of(job: model.Job) -> dict[str, Any] | None:
    """An HTTP job's request as its page shows it, secrets redacted: None for any other."""
    if shapes.job_target(job)["kind"] != "http":
        return None
    spec, shown = job.spec, shapes.shown(dict(job.spec))
    headers = shown.get("headers")
    return {
        "method": str(spec.get("method", "GET")).upper(),
        "url": shown["url"],
        "headers": sorted(headers.items()) if isinstance(headers, Mapping) else [],
        "body": body_shown(spec["body"]) if isinstance(spec.get("body"), str) else None,
        "json": json.dumps(shown["json"], indent=2, ensure_ascii=False) if "json" in spec else None,
        "expect": ", ".join(str(e) for e in spec.get("expect", ["2xx"])),
        "assertions": assertions(spec),
    }


def callbacks_of(job: model.Job) -> list[tuple[str, str]]:
    """Where the job's result goes when it ends (docs/callbacks.md), secrets redacted."""
    named = (("callback", job.callback), ("failure callback", job.failure_callback))
    return [(label, redaction.redacted(url)) for label, url in named if url]


def assertions(spec: Mapping[str, Any]) -> list[str]:
    """What an HTTP job asserts of its response besides its status (docs/assertions.md),
    one line each."""
    lines = [f"body matches {spec['expect_body']}"] if spec.get("expect_body") else []
    lines += [f"JSON {check}" for check in spec.get("expect_json") or ()]
    if spec.get("max_response_time"):
        lines.append(f"response within {spec['max_response_time']}")
    return lines


def body_shown(body: str) -> str:
    """A text body as it may be shown: its URLs' secrets redacted, and a form's fields whose
    names name a secret (redaction.names_a_secret)."""
    if not _FORM.match(body):
        return redaction.redacted_text(body)
    fields = []
    for field in body.split("&"):
        name, _, value = field.partition("=")
        secret = value and redaction.names_a_secret(unquote_plus(name))
        fields.append(f"{name}={redaction.REDACTED}" if secret else field)
    return "&".join(fields)


def from_now(at: datetime, now: datetime) -> str:
    """How long until `at`, in words: "in 40 s", "in 5 min", "in 4 min 10 s", "in 2 h 5 min",
    "in 3 d 4 h"; "due now" once it has come."""
    seconds = int((at - now).total_seconds())
    if seconds <= 0:
        return "due now"
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        parts = [(days, "d"), (hours, "h")]
    elif hours:
        parts = [(hours, "h"), (minutes, "min")]
    else:
        parts = [(minutes, "min"), (secs, "s")]
    return "in " + " ".join(f"{n} {unit}" for n, unit in parts if n)
