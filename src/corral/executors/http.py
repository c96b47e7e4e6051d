"""The `http` executor: each attempt is one HTTP request, sent with httpx from the
dispatcher's event loop (at most `launch_concurrency` at once); its outcome is pushed
through `events`.

A request leaves nothing on a platform that corral could list afterwards, so this
executor says it is not observable (`observable = False`): the dispatcher records an
attempt `running` before its request is sent, and recovery never sends it again under
the same name. One that has no outcome by recovery_grace (corral died mid-request) is
`lost`, and its job retries as a new attempt: a higher fence, the same Idempotency-Key.

Every request carries `Corral-Job-Id`, `Corral-Attempt`, `Corral-Fence` and an
`Idempotency-Key` that is the same on every attempt of a job (the job's own key, or
`corral-job-<id>`), so a receiver can drop a retry it has already done and refuse a
stale attempt.

The guard against server-side request forgery is on by default. The URL's name is
resolved once; the request is refused if any of its addresses is loopback, private,
link-local (169.254.0.0/16, the cloud metadata address, included), shared (CGNAT),
unique-local, multicast, reserved or unspecified, IPv4 or IPv6, unless it is in
`executors.http.allow_networks`. The connection goes to the address that was checked
(no second lookup, so a name that changes its answer in between cannot slip past), with
the name kept for the Host header and TLS. Redirects are followed by corral itself, at
most MAX_REDIRECTS, each checked again; only http and https are spoken. Proxies from
the environment are not used: a proxy would make the lookup the guard cannot see.

Outcomes: a status the spec expects (`expect`, default any 2xx) succeeds. Connection
errors, timeouts, 5xx, 408 and 429 are transient failures (retried); any other status
is permanent (the job is quarantined at once); a refusal by the guard is permanent.
The reason says the status, the time it took and the address; a failure's message is
the start of the response body.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import ipaddress
import json
import logging
import re
import socket
import time
import urllib.parse
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from corral import clock, config, errors, launching, model, netrules, redaction
from corral.executors import base

log = logging.getLogger("corral.executors.http")

KIND = "http"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_REDIRECTS = 5
TRANSIENT_STATUSES = frozenset({408, 429})
"""Besides every 5xx: the server asks to be asked again later."""
CLIENTS_KEPT = 64
"""Origins whose clients (and pooled connections) are kept; the least recently used closes."""
REMEMBERED = 10_000
"""How many finished requests `observe` still answers for (a poll may come after the push)."""
MESSAGE_CHARS = 500

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
KEYS_FRESH_SECONDS = 5.0
"""How long a tenant's signing secrets are used before they are read again: a rotation
signs every request within this long."""


# --- the spec ------------------------------------------------------------------------------


MAX_REQUEST_BODY = 256 * 1024
"""By default, the largest request body (`body`, or `json` as sent) an HTTP job may carry."""


def check_spec(
    spec: Mapping[str, Any], *, guard: Guard | None = None, max_body: int = MAX_REQUEST_BODY
) -> dict[str, Any]:
    """The spec, normalised: method, url, headers, body or json, expect. InvalidInput names
    the field and the rule. With `guard`, a URL whose host is a literal address the guard
    refuses is refused now (a name is checked when the request is sent); a body past
    `max_body` bytes is refused."""
    allowed = ("method", "url", "headers", "body", "json", "expect")
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


def _literal_refusal(url: str, guard: Guard) -> str | None:
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


class SpecCheck:
    """Checks specs without a client (for --dry-run and submit), under these settings."""

    def __init__(self, settings: config.Settings | None = None) -> None:
        own = (settings or config.Settings()).executors.http
        self.guard = Guard(own.allow_networks)
        self.max_body = own.max_request_body_bytes

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return check_spec(spec, guard=self.guard, max_body=self.max_body)


# --- the guard -----------------------------------------------------------------------------


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # CGNAT: not global, yet not `is_private`


class Refused(Exception):
    """The guard refused a destination: why."""


class Guard:
    """Which addresses and ports a request may go to: global addresses on any port, and
    those of `allow` (corral.netrules) on purpose."""

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.allow = tuple(netrules.parse(entry) for entry in allow)

    def refusal(self, address: str, port: int) -> str | None:
        """Why a request must not go to `address` on `port`, or None."""
        ip = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        elif isinstance(ip, ipaddress.IPv6Address):
            # An IPv4 address carried in an IPv6 one is reached through it: 2002:a9fe:a9fe::
            # (6to4), 2001:0:... (Teredo: its client).
            inner = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
            if inner is not None and not any(o.opens(ip, port) for o in self.allow):
                why = self.refusal(str(inner), port)
                return None if why is None else f"{address} holds {why}"
        if any(o.opens(ip, port) for o in self.allow):
            return None
        if nearly := [str(o) for o in self.allow if ip in o.network]:
            return (
                f"{address} port {port} is not opened: executors.http.allow_networks opens"
                f" {', '.join(nearly)}; name the port there (e.g. {ip}:{port})"
            )
        for kind, hit in (
            ("unspecified", ip.is_unspecified),
            ("loopback", ip.is_loopback),
            ("link-local", ip.is_link_local),
            ("multicast", ip.is_multicast),
            ("shared (CGNAT)", ip in _SHARED),
            ("reserved", ip.is_reserved),
            ("private", ip.is_private),
            ("non-public", not ip.is_global),
        ):
            if hit:
                return f"{address} is a {kind} address (executors.http.allow_networks opens it)"
        return None

    async def address(self, host: str, port: int) -> str:
        """The one address to connect to for `host`: resolved once, every answer checked."""
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from exc
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for found in addresses:
            if why := self.refusal(found, port):
                raise Refused(f"{host}: {why}" if found != host else why)
        return addresses[0]


# --- one request -----------------------------------------------------------------------------


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


_CROSS_ORIGIN_DROPPED = ("webhook-id", "webhook-timestamp", "webhook-signature", "cookie")


def _redirected_headers(
    headers: Mapping[str, str], *, same_origin: bool, body_kept: bool
) -> dict[str, str]:
    """The headers a redirect is followed with: to another origin, none that carries a
    credential or corral's signature (as browsers and httpx do); without the body, none
    that describes it (the signature was of the body)."""
    kept = {}
    for name, value in headers.items():
        low = name.lower()
        if not same_origin and (low in _CROSS_ORIGIN_DROPPED or redaction.names_a_secret(low)):
            continue
        if not body_kept and (low.startswith("content-") or low.startswith("webhook-")):
            continue
        kept[name] = value
    return kept


async def send(
    clients: Callable[[str], httpx.AsyncClient],
    guard: Guard,
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes | None,
    seconds: float,
    body_bytes: int,
) -> Outcome:
    """Send one request through the guard, following redirects (each checked again).
    `clients(name)` is the client for a host name: connections (and their TLS sessions)
    are never shared between names, though the URL names the checked address."""
    started = time.monotonic()
    address: str | None = None
    headers = dict(headers)
    hops: list[str] = []

    def took() -> float:
        return time.monotonic() - started

    try:
        async with asyncio.timeout(seconds):
            target = httpx.URL(url)
            for _ in range(MAX_REDIRECTS + 1):
                if target.scheme not in ("http", "https"):
                    refused = f"a redirect to {target.scheme}: is refused"
                    return Outcome(refused=refused, seconds=took())
                host = target.raw_host.decode("ascii")  # IDNA as it is sent: one name for all
                port = target.port or (443 if target.scheme == "https" else 80)
                address = await guard.address(host, port)
                client = clients(f"{target.scheme}://{host}:{port}")
                request = client.build_request(
                    method,
                    target.copy_with(host=address),
                    headers={**headers, "Host": target.netloc.decode("ascii")},
                    content=content,
                    extensions={"sni_hostname": host, "timeout": _timeouts(seconds)},
                )
                response = await client.send(request, stream=True)
                try:
                    body, cut = await _read(response, body_bytes)
                finally:
                    await response.aclose()
                location = response.headers.get("location")
                if not (response.is_redirect and location):
                    return Outcome(
                        response.status_code,
                        response.reason_phrase,
                        address,
                        took(),
                        body,
                        retry_after=response.headers.get("retry-after"),
                        headers=tuple(response.headers.multi_items()),
                        body_cut=cut,
                        hops=tuple(hops),
                    )
                following = target.join(location)
                where = redaction.redacted(str(following))
                hops.append(f"HTTP {response.status_code} {response.reason_phrase} -> {where}")
                if target.scheme == "https" and following.scheme == "http":
                    refused = f"a redirect from https to http ({following.host}) is refused"
                    return Outcome(refused=refused, address=address, seconds=took())
                body_kept = not (response.status_code in (301, 302, 303) and method != "HEAD")
                if not body_kept:
                    method, content = "GET", None  # as every browser does
                same = (following.scheme, following.raw_host, following.port) == (
                    target.scheme,
                    target.raw_host,
                    target.port,
                )
                headers = _redirected_headers(headers, same_origin=same, body_kept=body_kept)
                target = following
            return Outcome(
                error=f"more than {MAX_REDIRECTS} redirects", address=address, seconds=took()
            )
    except Refused as exc:
        return Outcome(refused=str(exc), seconds=took())
    except TimeoutError:
        return Outcome(error=f"no response in {seconds:g}s", address=address, seconds=took())
    except httpx.TimeoutException as exc:
        why = f"timed out: {exc or type(exc).__name__}"
        return Outcome(error=why, address=address, seconds=took())
    except httpx.HTTPError as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}", address=address, seconds=took())


def _timeouts(total: float) -> dict[str, float]:
    return {"connect": total, "read": total, "write": total, "pool": total}


async def _read(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the body (the rest is not read), and whether there was more."""
    kept = bytearray()
    async for chunk in response.aiter_raw():
        room = limit - len(kept)
        kept += chunk[:room]
        if len(chunk) > room:
            return bytes(kept), True
    return bytes(kept), False


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
    if expected(outcome.status, expect):
        return launching.Phase.SUCCEEDED, reason, None
    if outcome.status >= 500 or outcome.status in TRANSIENT_STATUSES:
        return launching.Phase.FAILED, reason, model.FailureClass.TRANSIENT
    return launching.Phase.FAILED, reason, model.FailureClass.PERMANENT


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
    shown = redaction.REDACTED
    return "".join(
        f"{name}: {shown if redaction.names_a_secret(name) else redaction.redacted(value)}\n"
        for name, value in headers
    )


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


def run_log(request: launching.Stream | None, outcome: Outcome) -> launching.RunLog:
    """An HTTP attempt's run log: its request (None when it could not be made), response,
    status, latency and the address it reached."""
    streams = tuple(s for s in (request, response_stream(outcome)) if s is not None)
    return launching.RunLog(
        streams=streams, latency=outcome.seconds, status=outcome.status, address=outcome.address
    )


def first_line(body: bytes) -> str | None:
    for line in body.decode("utf-8", "replace").splitlines():
        if line := line.strip():
            return line[:MESSAGE_CHARS]
    return None


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


class TemplateError(ValueError):
    """A placeholder names nothing in the payload."""


def fill(template: str, payload: Any, *, quote: bool = False) -> str:
    """`template` with each `{{path}}` replaced by that value of the payload (a dotted
    path: `{{corral.nominal_time}}`); strings as they are, anything else as JSON;
    percent-encoded when `quote` (in a URL)."""

    def value(match: re.Match[str]) -> str:
        found: Any = payload
        for key in match[1].split("."):
            if not isinstance(found, Mapping) or key not in found:
                raise TemplateError(f"{{{{{match[1]}}}}} names nothing in the job's payload")
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


# --- the executor ------------------------------------------------------------------------------


class HttpExecutor:
    """Runs each attempt as one HTTP request; see the module's doc."""

    kind = KIND
    observable = False
    """A request leaves nothing to list: the dispatcher records an attempt running before
    it is sent, and recovery never sends it again under the same name."""

    def __init__(
        self,
        *,
        clock: clock.Clock,
        timeout: timedelta,
        concurrency: int,
        allow_networks: Iterable[str] = (),
        body_bytes: int = 65_536,
        max_body: int = MAX_REQUEST_BODY,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._clock = clock
        self._timeout = timeout.total_seconds()
        self._slots = asyncio.Semaphore(concurrency)
        self.guard = Guard(allow_networks)
        self._body_bytes = body_bytes
        self._max_body = max_body
        self._transport = transport
        self._clients: collections.OrderedDict[str, httpx.AsyncClient] = collections.OrderedDict()
        self._closing: set[asyncio.Future[None]] = set()
        self._started = self._draining = False
        self._running: dict[str, tuple[launching.Launch, asyncio.Task[None]]] = {}
        self._ended: collections.OrderedDict[str, launching.Observation] = collections.OrderedDict()
        self._news: asyncio.Queue[launching.Observation | None] = asyncio.Queue()
        self._closed = False
        self._keys: Callable[[str], Awaitable[list[str]]] | None = None
        self._keys_read: dict[str, tuple[float, list[str]]] = {}

    def use_signing_keys(self, keys: Callable[[str], Awaitable[list[str]]]) -> None:
        """Sign each request with the secrets `keys(tenant)` gives (the store's, wired by
        the runtime); a tenant with none sends unsigned requests."""
        self._keys = keys

    async def _signing_keys(self, tenant: str) -> list[str]:
        if self._keys is None:
            return []
        now = time.monotonic()
        read = self._keys_read.get(tenant)
        if read is None or read[0] < now:
            read = (now + KEYS_FRESH_SECONDS, await self._keys(tenant))
            self._keys_read[tenant] = read
        return read[1]

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return check_spec(spec, guard=self.guard, max_body=self._max_body)

    async def start(self) -> None:
        self._started = True

    def _client(self, origin: str) -> httpx.AsyncClient:
        """The client of one origin (scheme, host name, port): its pooled connections were
        made, and their certificates checked, for that name only."""
        client = self._clients.pop(origin, None)
        if client is None:
            client = httpx.AsyncClient(
                follow_redirects=False, trust_env=False, transport=self._transport
            )
        self._clients[origin] = client  # the most recently used last
        while len(self._clients) > CLIENTS_KEPT:
            _, oldest = self._clients.popitem(last=False)
            self._closing.add(asyncio.ensure_future(oldest.aclose()))
        return client

    async def drain(self) -> list[launching.Observation]:
        """Take no more launches, let the requests in flight end (each is bounded by
        http_request_timeout), and return what ended that `events` has not yielded: the
        dispatcher writes those before it stops, so a stop loses no outcome."""
        self._draining = True
        tasks = [task for _, task in self._running.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self._timeout + 1)
        pending = []
        while not self._news.empty():
            if (observation := self._news.get_nowait()) is not None:
                pending.append(observation)
        return pending

    async def close(self) -> None:
        """Stop: requests still in flight are dropped (their attempts are lost to recovery,
        as if corral had died; `drain` first to let them end), and `events` ends."""
        self._closed = True
        for _, task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*(t for _, t in self._running.values()), return_exceptions=True)
        self._news.put_nowait(None)
        for client in self._clients.values():
            await client.aclose()
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def launch(self, launch: launching.Launch) -> None:
        """Start the request in the background, once one of the `concurrency` slots is free
        (a slow receiver holds the dispatcher's launches back, not piles of attempts that
        wait unsent), and return; a name launched before (running or ended here) is never
        sent again."""
        if self._closed or self._draining or not self._started:
            raise errors.ExecutorError("http executor: not started, or stopping")
        if launch.name in self._running or launch.name in self._ended:
            return
        spec = self.validate_spec(launch.spec)
        await self._slots.acquire()
        if launch.name in self._running or launch.name in self._ended:  # asked twice meanwhile
            self._slots.release()
            return
        task = asyncio.create_task(self._run(launch, spec), name=f"http {launch.name}")
        self._running[launch.name] = (launch, task)
        task.add_done_callback(lambda done: self._settled(launch, spec, done))

    def _settled(
        self, launch: launching.Launch, spec: dict[str, Any], task: asyncio.Task[None]
    ) -> None:
        """Whatever became of the task, its slot is free and, unless corral is stopping,
        its attempt has an outcome: one cancelled before it began, or that failed in a way
        `_run` did not foresee, is recorded so, never left running."""
        self._slots.release()
        if launch.name not in self._running or self._closed:
            return
        if task.cancelled():
            self._record(launch, spec, Outcome(error="cancelled"), self._clock.now())
        elif (exc := task.exception()) is not None:
            log.error("http executor: %s failed unforeseen", launch.name, exc_info=exc)
            self._record(
                launch, spec, Outcome(error=f"{type(exc).__name__}: {exc}"), self._clock.now()
            )

    async def _run(self, launch: launching.Launch, spec: dict[str, Any]) -> None:
        started = self._clock.now()
        request: launching.Stream | None = None
        try:
            headers = request_headers(launch, spec)
            try:
                content = request_body(spec, launch.payload, headers)
                url = fill(spec["url"], launch.payload, quote=True)
                keys = await self._signing_keys(launch.tenant)
                if keys:
                    sign(headers, content, keys, self._clock.now())
                request = request_stream(spec["method"], url, headers, content, self._body_bytes)
            except TemplateError as exc:
                outcome = Outcome(refused=f"template: {exc}")
            except UnicodeDecodeError:
                outcome = Outcome(refused="a signed request's body must be UTF-8 text")
            except errors.CorralError as exc:  # the store, for the keys: try again later
                outcome = Outcome(error=f"could not read the signing secrets: {exc}")
            else:
                outcome = await send(
                    self._client,
                    self.guard,
                    method=spec["method"],
                    url=url,
                    headers=headers,
                    content=content,
                    seconds=min(self._timeout, launch.deadline_seconds or self._timeout),
                    body_bytes=self._body_bytes,
                )
        except asyncio.CancelledError:
            if self._closed:
                raise
            outcome = Outcome(error="cancelled")
        self._record(launch, spec, outcome, started, request)

    def _record(
        self,
        launch: launching.Launch,
        spec: dict[str, Any],
        outcome: Outcome,
        started: datetime,
        request: launching.Stream | None = None,
    ) -> None:
        phase, reason, failure = judge(outcome, spec["expect"])
        ended = self._clock.now()
        observation = launching.Observation(
            name=launch.name,
            phase=phase,
            labels=launch.labels,
            reason=reason,
            started_at=started,
            finished_at=ended,
            failure_class=failure,
            message=None if phase is launching.Phase.SUCCEEDED else first_line(outcome.body),
            retry_after=None
            if phase is launching.Phase.SUCCEEDED
            else retry_after_seconds(outcome.retry_after, ended),
            http_status=outcome.status,
            output=run_log(request, outcome),
        )
        self._running.pop(launch.name, None)
        self._ended[launch.name] = observation
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)
        self._news.put_nowait(observation)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """What this process knows: a request in flight runs, one that ended says how; any
        other name is absent (sent by a process that is gone, or never sent)."""
        return {name: self._look(name) for name in names}

    def _look(self, name: str) -> launching.Observation:
        if (running := self._running.get(name)) is not None:
            return launching.Observation(name, launching.Phase.RUNNING, running[0].labels)
        return self._ended.get(name) or launching.Observation(name, launching.Phase.ABSENT)

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        names = [*self._running, *self._ended]
        seen = [self._look(name) for name in names]
        return [o for o in seen if all(o.labels.get(k) == v for k, v in selector.items())]

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Abandon the request: its attempt ends failed, `cancelled` (the server may have
        acted on it already)."""
        if (running := self._running.get(name)) is not None:
            running[1].cancel()

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Each request's outcome, as it comes, until `close`."""
        while not self._closed:
            observation = await self._news.get()
            if observation is None:
                return
            yield observation


def build(settings: config.Settings, clk: clock.Clock) -> HttpExecutor:
    http = settings.executors.http
    return HttpExecutor(
        clock=clk,
        timeout=settings.timeouts.http_request_timeout,
        concurrency=settings.launch_concurrency,
        allow_networks=http.allow_networks,
        body_bytes=http.body_bytes,
        max_body=http.max_request_body_bytes,
    )
