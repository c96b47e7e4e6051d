"""The objects a cluster launch owns (its payload's ConfigMap, its attempt token's
Secret), made on the API server after their Job or Workflow: idempotent by name, and one
left by an earlier owner of the name is given the new owner. What they hold is
kubernetes_owned.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import pydantic
from kubernetes.aio import client

from corral import errors, launching
from corral.executors import kube_calls, kube_objects, rbac

log = logging.getLogger("corral.executors.kubernetes")

Owned = TypeVar("Owned", client.V1ConfigMap, client.V1Secret)

OWNED_RULES = (
    rbac.Rule(
        "",
        "configmaps",
        ("create", "get", "patch"),
        "a payload over 32 KiB: a ConfigMap owned by its Job or Workflow (patch: one left by"
        " an earlier owner of the name is given the new one)",
    ),
    rbac.Rule(
        "",
        "secrets",
        ("create", "get", "patch"),
        "with api_url, an attempt's token: a Secret owned by its Job or Workflow (patch: as"
        " for the ConfigMap)",
    ),
)
"""What create_owned calls."""


async def create(
    api: kube_calls.Api, core: client.CoreV1Api, launch: launching.Launch, body: Mapping[str, Any]
) -> None:
    """Create `body`, a ConfigMap or Secret of `launch` owned by its Job or Workflow
    (ClusterExecutor.create_owned says how a 409 is read)."""
    calls = _calls(core, api.timeout, launch.name, body)
    what = f"{calls.kind} {body['metadata']['namespace']}/{launch.name}"
    made = await api.call(
        f"creating {what}", calls.create, ok=lambda exc: kube_calls.is_status(exc, 409)
    )
    if made is not None:
        return
    found = await api.call(
        f"reading {what}", calls.read, ok=lambda exc: kube_calls.is_status(exc, 404)
    )
    owners = list(body["metadata"]["ownerReferences"])
    if kube_objects.owned_by(what, found, launch, owners):
        return
    log.info("%s: held by another owner; taking it over for the launch", what)
    await api.call(
        f"giving {what} its owner",
        lambda: calls.patch({"metadata": {"ownerReferences": owners}}),
    )


@dataclass(frozen=True, slots=True)
class _Calls:
    """The API calls that make and mend one object a launch owns (ConfigMap, Secret)."""

    kind: str
    create: Callable[[], Awaitable[aiohttp.ClientResponse]]
    read: Callable[[], Awaitable[aiohttp.ClientResponse]]
    patch: Callable[[dict[str, Any]], Awaitable[aiohttp.ClientResponse]]


def _calls(core: client.CoreV1Api, timeout: float, name: str, body: Mapping[str, Any]) -> _Calls:
    """The create, read and merge-patch of `body` (a ConfigMap or a Secret) by name."""
    namespace, kind = body["metadata"]["namespace"], str(body.get("kind"))
    what = f"{kind} {namespace}/{name}"
    if kind == "ConfigMap":
        config_map = _typed(client.V1ConfigMap, body, what)
        return _Calls(
            kind,
            create=lambda: core.create_namespaced_config_map_without_preload_content(
                namespace, config_map, _request_timeout=timeout
            ),
            read=lambda: core.read_namespaced_config_map_without_preload_content(
                name, namespace, _request_timeout=timeout
            ),
            patch=lambda change: core.patch_namespaced_config_map_without_preload_content(
                name,
                namespace,
                change,
                _content_type=kube_calls.MERGE_PATCH,
                _request_timeout=timeout,
            ),
        )
    if kind == "Secret":
        return _secret_calls(core, timeout, name, namespace, _typed(client.V1Secret, body, what))
    raise errors.LaunchRefused(f"creating {what}: a launch owns only ConfigMaps and Secrets")


def _secret_calls(
    core: client.CoreV1Api, timeout: float, name: str, namespace: str, secret: client.V1Secret
) -> _Calls:
    """The create, read and merge-patch of the Secret `secret`, `name` in `namespace`."""
    return _Calls(
        "Secret",
        create=lambda: core.create_namespaced_secret_without_preload_content(
            namespace, secret, _request_timeout=timeout
        ),
        read=lambda: core.read_namespaced_secret_without_preload_content(
            name, namespace, _request_timeout=timeout
        ),
        patch=lambda change: core.patch_namespaced_secret_without_preload_content(
            name,
            namespace,
            change,
            _content_type=kube_calls.MERGE_PATCH,
            _request_timeout=timeout,
        ),
    )


def _typed(model_class: type[Owned], body: Mapping[str, Any], what: str) -> Owned:
    """`body` as the client's model of it; LaunchRefused when it cannot be one."""
    try:
        typed = model_class.from_dict(dict(body))
    except pydantic.ValidationError as exc:
        kind = body.get("kind")
        raise errors.LaunchRefused(f"creating {what}: not a valid {kind}: {exc}") from None
    if typed is None:
        raise errors.LaunchRefused(f"creating {what}: empty manifest")
    return typed
