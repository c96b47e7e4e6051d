"""Watching a cluster's objects: list, then watch from the list's resourceVersion, resume
from the last one seen when a stream ends or breaks, and list again after 410 Gone
(`changes`); and each object's finish, once, from those changes (`finishes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client
from kubernetes.aio import watch as kube_watch

from corral.executors import kube_calls

log = logging.getLogger("corral.executors.kubernetes")

WATCH_BACKOFF_CAP = 30.0


@dataclass(frozen=True, slots=True)
class Change:
    """What a list or a watch says about one object. `kind` is ADDED, MODIFIED or DELETED
    from a watch, or LISTED (`relisted` True after a 410: the stream missed changes)."""

    kind: str
    obj: dict[str, Any]
    relisted: bool = False


async def finishes(
    changes: AsyncIterator[Change], finished: Callable[[Mapping[str, Any]], bool]
) -> AsyncIterator[dict[str, Any]]:
    """Each object's finish, once. Objects already finished at the first list are left
    out (recovery settles what finished while no one watched); after a relist, finishes
    the stream missed come out."""
    told: set[str] = set()
    async for change in changes:
        name = str(change.obj.get("metadata", {}).get("name", ""))
        if change.kind == "DELETED":
            told.discard(name)
            continue
        if name in told or not finished(change.obj):
            continue
        told.add(name)
        if change.kind == "LISTED" and not change.relisted:
            continue
        yield change.obj


@dataclasses.dataclass(slots=True)
class _Cursor:
    """Where a watch goes on from: the last resourceVersion seen (None: list first),
    whether the first list was made, and the failures in a row."""

    version: str | None = None
    listed: bool = False
    failures: int = 0


async def changes(
    api: kube_calls.Api,
    what: str,
    list_call: Callable[..., Awaitable[Any]],
    *,
    selector: str,
    closed: asyncio.Event,
    **scope: Any,
) -> AsyncIterator[Change]:
    """Forever, until `closed`: list the objects `selector` matches, then watch them.

    The first list is only yielded as LISTED; after a 410 Gone the list is yielded
    again with `relisted`, since the stream missed what happened in between. A stream
    that ends, breaks or stalls past its timeout is resumed from the last
    resourceVersion seen (bookmarks keep it fresh on a quiet selector). A stream that
    fails, or ends at once with nothing in it (an error page from a proxy reads that
    way), is resumed after a jittered pause that grows with each failure."""
    at = _Cursor()
    while not closed.is_set():
        began = api.clock.monotonic()
        try:
            if at.version is None:
                listing = await api.list_all(what, list_call, selector=selector, **scope)
                at.version = listing.resource_version
                for item in listing.items:
                    yield Change("LISTED", item, relisted=at.listed)
                at.listed = True
            watching = _watch(api, list_call, selector, scope, at, closed=closed, began=began)
            async with contextlib.aclosing(watching) as stream:
                async for change in stream:
                    yield change
        except Exception as exc:  # a broken stream must never end the watching for good
            api_error = isinstance(exc, client.ApiException)
            if kube_calls.is_status(exc, 410):
                log.info("%s: watch expired (410 Gone); listing again", what)
                at.version = None
                continue
            at.failures += 1
            why = kube_calls.translate(exc, f"watching {what}") if api_error else exc
            await _pause(api, what, why, at.failures, closed)


async def _watch(
    api: kube_calls.Api,
    list_call: Callable[..., Awaitable[Any]],
    selector: str,
    scope: Mapping[str, Any],
    at: _Cursor,
    *,
    closed: asyncio.Event,
    began: float,
) -> AsyncGenerator[Change, None]:
    """One watch stream from `at.version`, moving `at` on with each event, until it ends
    or `closed`. ApiException (status 0) for a stream that ends at once with nothing in
    it, or that sends something other than an event."""
    heard = 0
    watch_seconds = max(1, int(api.settings.watch_timeout.total_seconds()))
    # Events as plain JSON too ("object"), not the client's strict models;
    # `async with` closes the stream even when this generator is dropped.
    async with kube_watch.Watch(return_type="object") as stream:  # type: ignore[no-untyped-call]
        async for event in stream.stream(
            list_call,
            **scope,
            label_selector=selector,
            resource_version=at.version,
            allow_watch_bookmarks=True,
            timeout_seconds=watch_seconds,
            _request_timeout=watch_seconds + api.timeout,
        ):
            obj = event.get("raw_object") if isinstance(event, dict) else None
            if not isinstance(obj, dict):
                raise client.ApiException(status=0, reason=f"not an event: {event!r}")
            at.version = obj.get("metadata", {}).get("resourceVersion") or at.version
            heard += 1
            at.failures = 0
            if event.get("type") == "BOOKMARK":
                continue
            yield Change(str(event.get("type")), obj)
            if closed.is_set():
                return
    if heard == 0 and api.clock.monotonic() - began < 1.0:
        raise client.ApiException(status=0, reason="the watch ended at once, empty")


async def _pause(
    api: kube_calls.Api, what: str, exc: BaseException, failures: int, closed: asyncio.Event
) -> None:
    delay = api.rng.uniform(0, min(WATCH_BACKOFF_CAP, kube_calls.BACKOFF_BASE * 2**failures))
    log.warning("%s: watch broke (%r); resuming in %.1fs", what, exc, delay)
    if not closed.is_set():
        await api.clock.sleep(delay)
