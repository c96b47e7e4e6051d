"""Building an HTTP attempt's request from its spec and launch: corral's headers (who
sends, which attempt, the job's Idempotency-Key), the body (the spec's, or the payload as
JSON), the payload's values filled into `{{path}}` placeholders, and the Standard
Webhooks signature.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from corral import errors, launching, model

_IDENTITY = {"Accept-Encoding": "identity"}


def request_headers(launch: launching.Launch, spec: Mapping[str, Any]) -> dict[str, str]:
    """The spec's headers and corral's: who sends, which attempt, and the job's key."""
    key = launch.annotations.get(model.IDEMPOTENCY_KEY) or launch.labels.get(model.IDEMPOTENCY_KEY)
    given = spec.get("headers", {})
    # The body as it is, unless the job asks otherwise: what the run log keeps is readable.
    plain = {} if any(n.lower() == "accept-encoding" for n in given) else _IDENTITY
    return {
        "User-Agent": "corral",
        **plain,
        **given,
        "Corral-Job-Id": str(launch.job_id),
        "Corral-Attempt": str(launch.attempt_no),
        "Corral-Fence": str(launch.fence),
        "Idempotency-Key": key or f"corral-job-{launch.job_id}",
    }


_PLACE = re.compile(r"\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}")


def fill(template: str, payload: Any, *, quote: bool = False) -> str:
    """`template` with each `{{path}}` replaced by that value of the payload (a dotted
    path: `{{corral.nominal_time}}`); strings as they are, anything else as JSON;
    percent-encoded when `quote` (in a URL)."""

    def value(match: re.Match[str]) -> str:
        found: Any = payload
        for key in match[1].split("."):
            if not isinstance(found, Mapping) or key not in found:
                raise errors.TemplateError(f"{{{{{match[1]}}}}} names nothing in the job's payload")
            found = found[key]
        text = found if isinstance(found, str) else json.dumps(found)
        return urllib.parse.quote(text, safe="") if quote else text

    return _PLACE.sub(value, template)


def request_body(spec: Mapping[str, Any], payload: Any, headers: dict[str, str]) -> bytes | None:
    """The body: the spec's `json`, or its `body` with the payload's values filled in; with
    neither, the job's payload as JSON (a firing's payload says its interval), if any."""
    as_json = "body" not in spec and payload is not None and spec["method"] not in ("GET", "HEAD")
    if "json" in spec or as_json:
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
        return json.dumps(spec.get("json", payload)).encode()
    body = spec.get("body")
    return None if body is None else fill(str(body), payload).encode()


def sign(headers: dict[str, str], content: bytes | None, keys: Sequence[str], at: datetime) -> None:
    """Sign the request the Standard Webhooks way: webhook-id (the Idempotency-Key: the
    same on every attempt of a job), webhook-timestamp, and webhook-signature over
    `id.timestamp.body`, one `v1,` signature per key (during a rotation, old and new)."""
    from standardwebhooks.webhooks import Webhook

    message = headers["Idempotency-Key"]
    data = (content or b"").decode("utf-8")
    headers["webhook-id"] = message
    headers["webhook-timestamp"] = str(int(at.timestamp()))
    headers["webhook-signature"] = " ".join(Webhook(k).sign(message, at, data) for k in keys)
