"""The `http` executor's spec, checked and normalised before anything is sent: method,
url, headers, body or json (at most max_request_body_bytes), the statuses that mean
success (`expect`), and the assertions on the response (`expect_body`, `expect_json`,
`max_response_time`: http_assertions.py).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from corral import errors
from corral.executors import base, http_assertions, http_guard

KIND = "http"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_EXPECT = re.compile(r"^(?:[1-5]xx|[1-5][0-9][0-9])$")
_SET_BY_CORRAL = frozenset(
    {
        "host",
        "content-length",
        "corral-job-id",
        "corral-attempt",
        "corral-fence",
        "idempotency-key",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


ASSERTIONS: Mapping[str, Callable[[Any], Any]] = {
    "expect_body": http_assertions.check_body,
    "expect_json": http_assertions.check_json,
    "max_response_time": http_assertions.check_max_time,
}
"""The spec's assertions on the response, each with its check (an empty list is none)."""

MAX_REQUEST_BODY = 256 * 1024
"""By default, the largest request body (`body`, or `json` as sent) an HTTP job may carry."""


def check_spec(
    spec: Mapping[str, Any],
    *,
    guard: http_guard.Guard | None = None,
    max_body: int = MAX_REQUEST_BODY,
) -> dict[str, Any]:
    """The spec, normalised: method, url, headers, body or json, expect, and the
    assertions given (http_assertions). InvalidInput names the field and the rule. With
    `guard`, a URL whose host is a literal address the guard refuses is refused now (a
    name is checked when the request is sent); a body past `max_body` bytes is refused."""
    allowed = ("method", "url", "headers", "body", "json", "expect", *ASSERTIONS)
    if unknown := sorted(set(spec) - set(allowed)):
        raise errors.InvalidInput(
            base.spec_error(KIND, unknown[0], f"unknown field (allowed: {', '.join(allowed)})")
        )
    method = spec.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise _bad("method", f"must be one of {', '.join(METHODS)}")
    normal: dict[str, Any] = {"method": method.upper(), "url": check_url(spec.get("url"))}
    normal["headers"] = _checked_headers(spec.get("headers", {}))
    if "body" in spec and "json" in spec:
        raise _bad("body", "give body or json, not both")
    if "body" in spec:
        if not isinstance(spec["body"], str):
            raise _bad("body", "must be a string (use json for a JSON body)")
        normal["body"] = spec["body"]
    if "json" in spec:
        normal["json"] = spec["json"]
    size = _body_size(normal)
    if size > max_body:
        field = "body" if "body" in normal else "json"
        raise _bad(
            field,
            f"is {size:,} bytes; a request body is at most {max_body:,}"
            " (executors.http.max_request_body_bytes): send a reference to the data instead",
        )
    if guard is not None and (why := _literal_refusal(normal["url"], guard)) is not None:
        raise _bad("url", f"{why}: it could never be sent")
    normal["expect"] = check_expect(spec.get("expect", "2xx"))
    return normal | _checked_assertions(spec)


def _checked_assertions(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The assertions a spec gives, each checked and normalised."""
    normal = {}
    for field, check in ASSERTIONS.items():
        if field in spec and (given := spec[field]) not in ([], ()):
            try:
                normal[field] = check(given)
            except ValueError as exc:
                raise _bad(field, str(exc)) from None
    return normal


def _checked_headers(headers: Any) -> dict[str, str]:
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise _bad("headers", "must be a mapping of header names to strings")
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise _bad("headers", f"{name!r} is not a header name")
        if name.lower() in _SET_BY_CORRAL:
            raise _bad("headers", f"{name} is set by corral")
        if any(c in value for c in "\r\n\0"):
            raise _bad("headers", f"{name}: a value must be one line")
    return dict(headers)


def _body_size(normal: Mapping[str, Any]) -> int:
    if "body" in normal:
        return len(normal["body"].encode("utf-8", "surrogatepass"))
    if "json" in normal:
        return len(json.dumps(normal["json"], separators=(",", ":")).encode("utf-8", "replace"))
    return 0


def _literal_refusal(url: str, guard: http_guard.Guard) -> str | None:
    """The guard's refusal of a URL whose host is a literal address; None for a name."""
    parsed = httpx.URL(url)
    try:
        ipaddress.ip_address(parsed.host.strip("[]"))
    except ValueError:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return guard.refusal(parsed.host.strip("[]"), port)


def check_url(url: Any) -> str:
    """An absolute http or https URL with a host."""
    if not isinstance(url, str) or not url:
        raise _bad("url", "must be an absolute http:// or https:// URL")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise _bad("url", f"is not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        given = f" (not {parsed.scheme}:)" if parsed.scheme else ""
        raise _bad("url", f"must start with http:// or https://{given}")
    if not parsed.host:
        raise _bad("url", "must name a host")
    return url


def check_expect(expect: Any) -> list[str]:
    """The statuses that mean success: `2xx`, `200,204`, or a list of them, as strings."""
    items: Iterable[Any]
    if isinstance(expect, str):
        items = [part.strip() for part in expect.split(",")]
    elif isinstance(expect, list | tuple):
        items = [str(part) for part in expect]
    else:
        items = [expect]
    normal = [str(item).lower() for item in items]
    if not normal or not all(_EXPECT.match(item) for item in normal):
        raise _bad("expect", "must be statuses (200,204) or classes (2xx), comma-separated")
    return normal


def expected(status: int, expect: Sequence[str]) -> bool:
    return str(status) in expect or f"{status // 100}xx" in expect


def _bad(field: str, rule: str) -> errors.InvalidInput:
    return errors.InvalidInput(base.spec_error(KIND, field, rule))
