"""Sending one HTTP attempt's request through the guard (http_guard.py): the connection goes
to the address that was checked, with the name kept for the Host header and TLS; redirects
are followed by corral itself, at most MAX_REDIRECTS, each checked again, and only http and
https are spoken. What comes back is an Outcome (http_outcome.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping

import httpx

from corral import errors, redaction
from corral.executors import http_guard, http_outcome

MAX_REDIRECTS = 5


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


@dataclasses.dataclass(slots=True)
class _Trip:
    """One request on its way, redirects and all: what it asks now (a redirect may change
    it), the last address it reached, the redirects it followed, and when it began."""

    method: str
    headers: dict[str, str]
    content: bytes | None
    started: float
    address: str | None = None
    hops: list[str] = dataclasses.field(default_factory=list)

    def took(self) -> float:
        return time.monotonic() - self.started


async def send(
    clients: Callable[[str], httpx.AsyncClient],
    guard: http_guard.Guard,
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes | None,
    seconds: float,
    body_bytes: int,
) -> http_outcome.Outcome:
    """Send one request through the guard, following redirects (each checked again).
    `clients(name)` is the client for a host name: connections (and their TLS sessions)
    are never shared between names, though the URL names the checked address."""
    trip = _Trip(method, dict(headers), content, time.monotonic())
    try:
        async with asyncio.timeout(seconds):
            return await _follow(clients, guard, trip, httpx.URL(url), seconds, body_bytes)
    except errors.DestinationRefused as exc:
        return http_outcome.Outcome(refused=str(exc), seconds=trip.took())
    except TimeoutError:
        why = f"no response in {seconds:g}s"
        return http_outcome.Outcome(error=why, address=trip.address, seconds=trip.took())
    except httpx.TimeoutException as exc:
        why = f"timed out: {exc or type(exc).__name__}"
        return http_outcome.Outcome(error=why, address=trip.address, seconds=trip.took())
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {exc}"
        return http_outcome.Outcome(error=why, address=trip.address, seconds=trip.took())


async def _follow(
    clients: Callable[[str], httpx.AsyncClient],
    guard: http_guard.Guard,
    trip: _Trip,
    target: httpx.URL,
    seconds: float,
    body_bytes: int,
) -> http_outcome.Outcome:
    """The request to `target`, and the redirects it leads to, at most MAX_REDIRECTS."""
    for _ in range(MAX_REDIRECTS + 1):
        if target.scheme not in ("http", "https"):
            refused = f"a redirect to {target.scheme}: is refused"
            return http_outcome.Outcome(refused=refused, seconds=trip.took())
        response, body, cut = await _ask(clients, guard, trip, target, seconds, body_bytes)
        location = response.headers.get("location")
        if not (response.is_redirect and location):
            return http_outcome.Outcome(
                response.status_code,
                response.reason_phrase,
                trip.address,
                trip.took(),
                body,
                retry_after=response.headers.get("retry-after"),
                headers=tuple(response.headers.multi_items()),
                body_cut=cut,
                hops=tuple(trip.hops),
            )
        following = target.join(location)
        if (why := _redirect(trip, response, target, following)) is not None:
            return http_outcome.Outcome(refused=why, address=trip.address, seconds=trip.took())
        target = following
    why = f"more than {MAX_REDIRECTS} redirects"
    return http_outcome.Outcome(error=why, address=trip.address, seconds=trip.took())


async def _ask(
    clients: Callable[[str], httpx.AsyncClient],
    guard: http_guard.Guard,
    trip: _Trip,
    target: httpx.URL,
    seconds: float,
    body_bytes: int,
) -> tuple[httpx.Response, bytes, bool]:
    """One request of the trip, to the address the guard checked for `target`'s host:
    its response, and up to `body_bytes` of its body (and whether there was more)."""
    host = target.raw_host.decode("ascii")  # IDNA as it is sent: one name for all
    port = target.port or (443 if target.scheme == "https" else 80)
    trip.address = await guard.address(host, port)
    client = clients(f"{target.scheme}://{host}:{port}")
    request = client.build_request(
        trip.method,
        target.copy_with(host=trip.address),
        headers={**trip.headers, "Host": target.netloc.decode("ascii")},
        content=trip.content,
        extensions={"sni_hostname": host, "timeout": _timeouts(seconds)},
    )
    response = await client.send(request, stream=True)
    try:
        body, cut = await _read(response, body_bytes)
    finally:
        await response.aclose()
    return response, body, cut


def _redirect(
    trip: _Trip, response: httpx.Response, target: httpx.URL, following: httpx.URL
) -> str | None:
    """Note the redirect from `target` to `following` and make the trip's next request
    from it; why it is refused (from https to http), or None."""
    where = redaction.redacted(str(following))
    trip.hops.append(f"HTTP {response.status_code} {response.reason_phrase} -> {where}")
    if target.scheme == "https" and following.scheme == "http":
        return f"a redirect from https to http ({following.host}) is refused"
    body_kept = not (response.status_code in (301, 302, 303) and trip.method != "HEAD")
    if not body_kept:
        trip.method, trip.content = "GET", None  # as every browser does
    same = (following.scheme, following.raw_host, following.port) == (
        target.scheme,
        target.raw_host,
        target.port,
    )
    trip.headers = _redirected_headers(trip.headers, same_origin=same, body_kept=body_kept)
    return None


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
