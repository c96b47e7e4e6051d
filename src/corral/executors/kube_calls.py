"""Calls to a cluster's API server: one connection (`connect`), every request with a
client-side timeout, bounded retries, lists in pages, and the client's errors turned into
corral's (`translate`).

- Every request carries a client-side timeout (`request_timeout`), so a cut connection
  fails instead of hanging; a watch's is its server-side `timeoutSeconds` plus that.
- 429, 5xx, timeouts and refused connections are retried a few times with full jitter
  (creates too: they are idempotent by name); anything else fails at once. A 429 or 503
  that carries Retry-After (an API server shedding load, its priority and fairness
  queues full) is tried again after what it asks, for as long as the call's deadline
  allows (`(RETRIES + 1) * request_timeout` from its start), not after a quick jitter.
- Client errors become ExecutorError (the platform could not be asked) or InvalidInput
  (422/400: the API server refused the object as invalid).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.aio import client
from kubernetes.aio import config as kube_config

from corral import clock, errors
from corral.executors import kube_objects, kubernetes_settings, startup

MERGE_PATCH = "application/merge-patch+json"
log = logging.getLogger("corral.executors.kubernetes")

RETRIES = 3
"""How many times a request that failed for a passing reason is tried again."""
BACKOFF_BASE = 0.2
BACKOFF_CAP = 5.0
_PASSING = {408, 425, 429, 500, 502, 503, 504}
_THROTTLED = {429, 503}
"""The answers whose Retry-After corral waits for."""


LIST_PAGE = 500
"""Objects per list request; longer lists come in pages."""


@dataclass(frozen=True, slots=True)
class Listing:
    """One consistent list: its items and the resourceVersion to watch from."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Connection:
    """An API client, and the task that keeps its token fresh (for kubeconfig users whose
    tokens come from an exec plugin or a cloud provider and expire: EKS, GKE)."""

    client: client.ApiClient
    refresher: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
            await asyncio.gather(self.refresher, return_exceptions=True)
        await self.client.close()  # type: ignore[no-untyped-call]


async def connect(
    settings: kubernetes_settings.KubernetesExecutorSettings,
    configuration: client.Configuration | None = None,
) -> Connection:
    """An API client: on `configuration` if given, else the kubeconfig file of the
    settings, else the pod's service account (in-cluster), else ~/.kube/config."""
    loader = None
    if configuration is None:
        configuration = client.Configuration()
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and settings.kubeconfig is None:
                # corral runs in a pod: its service account token, refreshed by the client
                kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                loader = await kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                    context=settings.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (kube_config.ConfigException, OSError, ValueError) as exc:
            raise errors.ConfigError(
                f"executors.kubernetes: cannot load the cluster's connection settings: {exc}"
                " (set executors.kubernetes.kubeconfig, or run corral in a pod with a"
                " service account)"
            ) from None
    configuration.retries = None  # retries are ours: bounded, jittered, counted
    refresher = None
    if loader is not None:
        refresher = asyncio.get_running_loop().create_task(
            kube_config.refresh_token(loader, configuration)  # type: ignore[no-untyped-call]
        )
    return Connection(client.ApiClient(configuration), refresher)


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, client.ApiException) and exc.status in codes


def status_reason(exc: client.ApiException) -> str:
    """The Status message the API server sent, or the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "no reason given")


def translate(exc: BaseException, doing: str) -> errors.CorralError:
    """corral's error for a failed API call."""
    if isinstance(exc, client.ApiException):
        why = status_reason(exc)
        if exc.status in (400, 422):
            return errors.LaunchRefused(f"{doing}: the API server refused it as invalid: {why}")
        if exc.status == 403 and startup.denied(why):
            return errors.LaunchRefused(f"{doing}: refused by admission: {why}")
        if exc.status == 403 and "exceeded quota" in why:
            return errors.ExecutorError(f"{doing}: a ResourceQuota is full: {why}")
        if exc.status in (401, 403):
            return errors.ExecutorError(
                f"{doing}: forbidden ({exc.status}): {why}; check the service account's Role"
                " (deploy/ has the one corral needs)"
            )
        return errors.ExecutorError(f"{doing}: API server answered {exc.status}: {why}")
    if isinstance(exc, TimeoutError):
        return errors.ExecutorError(f"{doing}: no answer from the API server in time")
    return errors.ExecutorError(f"{doing}: cannot reach the API server: {exc}")


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 or 503 asks to wait (its Retry-After header, in seconds as the
    API server sends it); None without one, or for any other error."""
    if not isinstance(exc, client.ApiException) or exc.status not in _THROTTLED:
        return None
    value = (exc.headers or {}).get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from an API server; the usual backoff then


def passing(exc: BaseException) -> bool:
    """Whether trying again may help."""
    if isinstance(exc, client.ApiException):
        return exc.status in _PASSING or exc.status == 0
    return isinstance(exc, TimeoutError | aiohttp.ClientError | OSError)


class Api:
    """Calls to one API server, with timeouts, retries and error translation."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        settings: kubernetes_settings.KubernetesExecutorSettings,
        clock: clock.Clock,
        rng: random.Random | None = None,
    ) -> None:
        self.client = api_client
        self.settings = settings
        self.timeout = settings.request_timeout.total_seconds()
        self.clock = clock
        self.rng = rng or random.Random()

    async def call(
        self,
        doing: str,
        request: Callable[[], Awaitable[aiohttp.ClientResponse]],
        *,
        ok: Callable[[BaseException], bool] = lambda _: False,
        retries: int = RETRIES,
    ) -> dict[str, Any] | None:
        """The JSON answer of `request()` (a client call `..._without_preload_content`:
        the answer is read as plain JSON, so fields newer than this client never break
        it), tried again on passing failures. None when `ok(exc)` says the error is an
        answer (404 on a get, say); otherwise corral's error."""
        ends = self.clock.monotonic() + self.timeout * (retries + 1)
        failures = 0
        while True:
            try:
                return await _json(await request())
            except (client.ApiException, TimeoutError, aiohttp.ClientError, OSError) as exc:
                if ok(exc):
                    return None
                if not passing(exc):
                    raise translate(exc, doing) from None
                failures += 1
                delay = self._wait(exc, failures, retries, ends - self.clock.monotonic())
                if delay is None:
                    raise translate(exc, doing) from None
                log.info("%s: %s; trying again in %.2fs", doing, translate(exc, doing), delay)
                await self.clock.sleep(delay)

    def _wait(self, exc: BaseException, failures: int, retries: int, left: float) -> float | None:
        """How long to wait before trying again after a passing failure, None to give up:
        what a Retry-After asks (at least BACKOFF_BASE: a 0 is no reason to hammer), cut to
        the `left` of the call's deadline; else a full
        jitter that grows, for at most `retries` tries."""
        asked = retry_after(exc)
        if asked is not None:
            return min(max(asked, BACKOFF_BASE), left) if left > 0 else None
        if failures > retries:
            return None
        return self.rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (failures - 1)))

    async def list_all(
        self, what: str, list_call: Callable[..., Awaitable[Any]], *, selector: str, **scope: Any
    ) -> Listing:
        """Every object `selector` matches, in pages of LIST_PAGE (`limit`/`continue`),
        and the resourceVersion of the list to watch from."""
        owner = list_call.__self__  # type: ignore[attr-defined]
        raw = getattr(owner, list_call.__name__ + "_without_preload_content")
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = {"_continue": token} if token else {}
            data = await self.call(
                f"listing {what}",
                lambda page=page: raw(  # type: ignore[misc]
                    **scope,
                    **page,
                    label_selector=selector,
                    limit=LIST_PAGE,
                    _request_timeout=self.timeout,
                ),
            )
            found += kube_objects.items(data)
            meta = (data or {}).get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                return Listing(found, str(meta.get("resourceVersion") or ""))


async def _json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """A raw answer as JSON; an error status raises the client's ApiException with the
    Status body, as the client's own calls do."""
    try:
        text = await response.text()
    finally:
        response.release()
    if response.status >= 400:
        exc = client.ApiException(status=response.status, reason=response.reason, body=text)
        exc.headers = response.headers  # Retry-After, as the client's own calls keep it
        raise exc
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        raise client.ApiException(status=0, reason=f"not JSON: {text[:200]!r}") from None
    return data if isinstance(data, dict) else {}
