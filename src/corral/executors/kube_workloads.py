"""Reading a cluster's workloads for `corral lint --cluster`: its Deployments and
StatefulSets, on the same connection as the executors (kube_calls.connect); a refusal
names the permission the identity lacks.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client
from kubernetes.aio import config as kube_config

from corral import clock, errors
from corral.executors import kube_calls, kube_objects, kubernetes_settings

WORKLOADS = (("Deployment", "deployment"), ("StatefulSet", "stateful_set"))
"""The kinds `list_workloads` reads (group apps/v1), and their name in the client's calls."""


@dataclass(frozen=True, slots=True)
class Workloads:
    """What `list_workloads` read, and from where: the kubeconfig context, or `in-cluster`."""

    context: str
    items: list[dict[str, Any]]


async def list_workloads(
    settings: kubernetes_settings.KubernetesExecutorSettings,
    *,
    namespace: str | None,
    clock: clock.Clock,
) -> Workloads:
    """Every Deployment and StatefulSet in `namespace` (None: in all), as plain JSON with its
    `kind` set (a list's items carry none). The connection is the executors' (`connect`);
    a 401/403 is ExecutorError naming the verb the identity lacks."""
    connection = await kube_calls.connect(settings)
    try:
        api = kube_calls.Api(connection.client, settings=settings, clock=clock)
        apps = client.AppsV1Api(connection.client)
        context = _context_name(settings)
        source = f"context {context}, {connection.client.configuration.host}"
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        found: list[dict[str, Any]] = []
        for kind, noun in WORKLOADS:
            if namespace is None:
                list_call, scope = getattr(apps, f"list_{noun}_for_all_namespaces"), {}
            else:
                list_call = getattr(apps, f"list_namespaced_{noun}")
                scope = {"namespace": namespace}
            listed = await _list_or_say_why(api, f"{kind}s", where, source, list_call, scope)
            found += [{**item, "kind": kind} for item in listed]
        return Workloads(context, found)
    finally:
        await connection.close()


async def _list_or_say_why(
    api: kube_calls.Api,
    what: str,
    where: str,
    source: str,
    list_call: Callable[..., Awaitable[Any]],
    scope: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Every object of `list_call`, in pages as `Api.list_all` reads them; a refusal (401,
    403) says which permission to grant, rather than pointing at corral's own Role."""
    doing = f"listing {what} {where} ({source})"
    raw = getattr(list_call.__self__, list_call.__name__ + "_without_preload_content")  # type: ignore[attr-defined]

    def refused(exc: BaseException) -> bool:
        if isinstance(exc, client.ApiException) and exc.status in (401, 403):
            why = kube_calls.status_reason(exc)
            raise errors.ExecutorError(
                f"{doing}: forbidden ({exc.status}): {why}; the identity needs"
                f" the verb list on {what.lower()} (API group apps) {where}"
            ) from None
        return False

    found: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = {"_continue": token} if token else {}
        data = await api.call(
            doing,
            lambda page=page: raw(
                **scope, **page, limit=kube_calls.LIST_PAGE, _request_timeout=api.timeout
            ),  # type: ignore[misc]
            ok=refused,
        )
        found += kube_objects.items(data)
        token = ((data or {}).get("metadata") or {}).get("continue") or None
        if token is None:
            return found


def _context_name(settings: kubernetes_settings.KubernetesExecutorSettings) -> str:
    """The kubeconfig context `connect` used, or `in-cluster` for the pod's service account."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and settings.kubeconfig is None:
        return "in-cluster"
    if settings.context:
        return settings.context
    file = str(settings.kubeconfig) if settings.kubeconfig else None
    _, current = kube_config.list_kube_config_contexts(file)  # type: ignore[no-untyped-call]
    return str((current or {}).get("name") or "current")
