"""Judging an HTTP attempt's answer (pure): its phase, reason and failure class from the
status and the spec's `expect`, then from its assertions (http_assertions.py), its
Retry-After, its message, and the run log of its request, response and assertions,
secrets redacted.
"""

from __future__ import annotations

import base64
import email.utils
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral import callbacks, launching, model, plain, redaction
from corral.executors import http_assertions, http_spec

TRANSIENT_STATUSES = frozenset({408, 429})
"""Besides every 5xx: the server asks to be asked again later."""


MESSAGE_CHARS = 500


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one request, redirects followed."""

    status: int | None = None
    reason_phrase: str = ""
    address: str | None = None
    seconds: float = 0.0
    body: bytes = b""
    error: str | None = None  # no response: why (a timeout, a refused connection)
    refused: str | None = None  # the guard's refusal
    retry_after: str | None = None  # the response's Retry-After, as it came
    headers: tuple[tuple[str, str], ...] = ()  # the response's
    body_cut: bool = False  # the body went on past what was kept
    hops: tuple[str, ...] = ()  # the redirects followed: status and where to


def judge(
    outcome: Outcome, expect: Sequence[str]
) -> tuple[launching.Phase, str, model.FailureClass | None]:
    """The phase, reason and failure class of an outcome (pure)."""
    took = f"in {outcome.seconds * 1000:.0f} ms"
    if outcome.refused is not None:
        return launching.Phase.FAILED, f"refused: {outcome.refused}", model.FailureClass.PERMANENT
    if outcome.status is None:
        at = f" ({outcome.address})" if outcome.address else ""
        return launching.Phase.FAILED, f"{outcome.error}{at}", model.FailureClass.TRANSIENT
    said = f"HTTP {outcome.status}{' ' + outcome.reason_phrase if outcome.reason_phrase else ''}"
    reason = f"{said} {took} ({outcome.address})"
    if http_spec.expected(outcome.status, expect):
        return launching.Phase.SUCCEEDED, reason, None
    if outcome.status >= 500 or outcome.status in TRANSIENT_STATUSES:
        return launching.Phase.FAILED, reason, model.FailureClass.TRANSIENT
    return launching.Phase.FAILED, reason, model.FailureClass.PERMANENT


@dataclass(frozen=True, slots=True)
class Verdict:
    """An outcome judged against its whole spec: the status, then the assertions."""

    phase: launching.Phase
    reason: str
    failure: model.FailureClass | None
    message: str | None  # a failure's: the failed assertion, or the body's first line
    checks: tuple[http_assertions.Check, ...] = ()


def verdict(outcome: Outcome, spec: Mapping[str, Any]) -> Verdict:
    """The outcome judged by its status (`judge`) and, when that succeeded, by the spec's
    assertions: the first that fails makes it a failure of class `assertion`, its reason
    and message saying which and what was seen."""
    phase, reason, failure = judge(outcome, spec["expect"])
    if phase is not launching.Phase.SUCCEEDED:
        return Verdict(phase, reason, failure, first_line(outcome.body))
    if not http_assertions.given(spec):
        return Verdict(phase, reason, None, None)
    encoding = next((v for k, v in outcome.headers if k.lower() == "content-encoding"), None)
    response = http_assertions.Response(outcome.body, outcome.body_cut, outcome.seconds, encoding)
    checks = tuple(http_assertions.judge(spec, response))
    failed = [c for c in checks if not c.ok]
    if not failed:
        return Verdict(phase, reason, None, None, checks)
    said = http_assertions.failure_text(failed[0], len(failed) - 1)
    return Verdict(
        launching.Phase.FAILED, f"{said}; {reason}", model.FailureClass.ASSERTION, said, checks
    )


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A Retry-After header's wait in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max((at - now).total_seconds(), 0.0)


def _header_lines(headers: Iterable[tuple[str, str]]) -> str:
    """Headers as lines, the values of those that carry a secret redacted."""
    lines = []
    for name, value in headers:
        shown = redaction.REDACTED if redaction.names_a_secret(name) else redaction.redacted(value)
        lines.append(f"{name}: {shown}\n")
    return "".join(lines)


def request_stream(
    method: str, url: str, headers: Mapping[str, str], content: bytes | None, limit: int
) -> launching.Stream:
    """The request as the run log keeps it: its line, its headers and the first `limit`
    bytes of its body, secrets redacted (in a JSON body, the values of secret-named keys,
    as `jobs show` shows the spec)."""
    head = f"{method} {redaction.redacted(url)}\n{_header_lines(headers.items())}"
    body = content or b""
    try:
        shown = json.dumps(redaction.redacted(json.loads(body))).encode() if body else body
    except ValueError:  # not JSON (UnicodeDecodeError is one): as it is
        shown = body
    return _message("request", head, shown, len(shown) > limit, limit, size=len(body))


def response_stream(outcome: Outcome) -> launching.Stream | None:
    """The response as the run log keeps it: the redirects followed, its status line, its
    headers (secrets redacted) and the first part of its body; None without a response."""
    if outcome.status is None:
        return None
    status = f"HTTP {outcome.status} {outcome.reason_phrase}".rstrip()
    head = "".join(f"{hop}\n" for hop in outcome.hops)
    head += f"{status}\n{_header_lines(outcome.headers)}"
    return _message("response", head, outcome.body, outcome.body_cut, len(outcome.body))


def _message(
    name: str, head: str, body: bytes, cut: bool, limit: int, *, size: int | None = None
) -> launching.Stream:
    kept = body[:limit]
    text = head if not body else f"{head}\n{launching.decoded(kept, cut_after=cut)}"
    total = len(head.encode()) + (1 + (len(body) if size is None else size) if body else 0)
    return launching.Stream(name, text, total, cut)


def run_log(
    request: launching.Stream | None,
    outcome: Outcome,
    checks: Sequence[http_assertions.Check] = (),
) -> launching.RunLog:
    """An HTTP attempt's run log: its request (None when it could not be made), response,
    the assertions judged (when it has any), status, latency and the address it reached."""
    judged = None
    if checks:
        text = http_assertions.stream_text(checks)
        judged = launching.Stream("assertions", text, len(text.encode()))
    streams = tuple(s for s in (request, response_stream(outcome), judged) if s is not None)
    return launching.RunLog(
        streams=streams,
        latency=outcome.seconds,
        status=outcome.status,
        address=outcome.address,
        result=callback_result(outcome),
    )


def callback_result(outcome: Outcome) -> dict[str, Any] | None:
    """What a callback sends of the response (corral.callbacks): its headers, secrets
    redacted as the run log shows them (a name given twice: its values joined by `, `),
    and the first callbacks.OUTPUT_BYTES of its body as base64; None without a response."""
    if outcome.status is None:
        return None
    headers: dict[str, str] = {}
    for line in _header_lines(outcome.headers).splitlines():
        name, _, value = line.partition(": ")
        name = name.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    kept = outcome.body[: callbacks.OUTPUT_BYTES]
    return {
        "headers": headers,
        "body_base64": base64.b64encode(kept).decode("ascii"),
        "body_cut": outcome.body_cut or len(outcome.body) > len(kept),
    }


def first_line(body: bytes) -> str | None:
    """A failure's message: the body's first line that is not blank, a NUL of a binary
    body as U+FFFD (corral.plain)."""
    for line in body.decode("utf-8", "replace").splitlines():
        if line := line.strip():
            return plain.mended_text(line[:MESSAGE_CHARS])
    return None
