"""What a cluster job's spec names on its cluster, and whether a tenant may name it.

The kubelet mounts whatever a pod names in its namespace: a Secret in an env value, an
`env_from` or a volume (projected ones too), a pull secret, a service account. A tenant's
Kubernetes and Argo jobs run in the tenant's own namespace (`[tenants.NAME] namespace`)
and may name only the Secrets, ConfigMaps and service accounts its table allows, and never
corral's own objects (its database Secret, any attempt's token Secret or payload
ConfigMap: every object corral makes is named `corral-...`). The operator's jobs keep the
executor's own rules (`executors.kubernetes.*`).

The walk reads the spec as kubernetes.normalise_spec leaves it, so what it reads is what
the manifest will hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from corral import config, errors, scheduling, tenancy
from corral.executors.pods import RESERVED_PREFIX

CLUSTER_KINDS = frozenset({"kubernetes", "argo"})
"""The executors whose specs name cluster objects."""

_SOURCES = {"secret": "secret", "config_map": "config_map"}
_VOLUME_REFS = {
    # A volume type's key, and where in it the Secret or ConfigMap it names is.
    "secret": ("secret", "secretName"),
    "configMap": ("config_map", "name"),
}


@dataclass(frozen=True, slots=True)
class Reference:
    """One object a spec names: where (the spec's field), what kind, and its name."""

    field: str
    kind: str  # secret, config_map, service_account
    name: str


def references(spec: Mapping[str, Any]) -> Iterator[Reference]:
    """Every Secret, ConfigMap and service account a normalised cluster spec names."""
    yield from _env("env", spec.get("env"), spec.get("env_from"))
    for n, sidecar in enumerate(spec.get("sidecars") or ()):
        yield from _env(f"sidecars[{n}].env", sidecar.get("env"), sidecar.get("env_from"))
    for n, volume in enumerate(spec.get("volumes") or ()):
        yield from _volume(f"volumes[{n}]", volume)
    for n, name in enumerate(spec.get("image_pull_secrets") or ()):
        yield Reference(f"image_pull_secrets[{n}]", "secret", str(name))
    if spec.get("service_account") is not None:
        yield Reference("service_account", "service_account", str(spec["service_account"]))


def _env(field: str, env: Any, env_from: Any) -> Iterator[Reference]:
    for name, value in (env or {}).items():
        for source, kind in _SOURCES.items():
            if isinstance(value, Mapping) and source in value:
                yield Reference(f"{field}.{name}.{source}", kind, str(value[source]))
    prefix = field.removesuffix("env") + "env_from"
    for n, item in enumerate(env_from or ()):
        for source, kind in _SOURCES.items():
            if source in item:
                yield Reference(f"{prefix}[{n}].{source}", kind, str(item[source]))


def _volume(field: str, volume: Mapping[str, Any]) -> Iterator[Reference]:
    for key, (kind, name_key) in _VOLUME_REFS.items():
        if isinstance(volume.get(key), Mapping):
            yield Reference(f"{field}.{key}.{name_key}", kind, str(volume[key].get(name_key)))
    projected = volume.get("projected")
    if isinstance(projected, Mapping):
        for m, source in enumerate(projected.get("sources") or ()):
            for key, kind in (("secret", "secret"), ("configMap", "config_map")):
                if isinstance(source, Mapping) and isinstance(source.get(key), Mapping):
                    where = f"{field}.projected.sources[{m}].{key}.name"
                    yield Reference(where, kind, str(source[key].get("name")))
    for key, value in volume.items():  # csi, cephfs, azureFile...: any other secret they name
        if isinstance(value, Mapping):
            for ref_key in ("secretRef", "nodePublishSecretRef"):
                ref = value.get(ref_key)
                if isinstance(ref, Mapping) and "name" in ref:
                    yield Reference(f"{field}.{key}.{ref_key}.name", "secret", str(ref["name"]))
            if key == "azureFile" and "secretName" in value:
                yield Reference(f"{field}.{key}.secretName", "secret", str(value["secretName"]))


ALLOWED_IN = {
    "secret": ("allowed_secrets", "Secrets"),
    "config_map": ("allowed_config_maps", "ConfigMaps"),
    "service_account": ("service_accounts", "service accounts"),
}
"""Each kind of reference: the tenant's setting that allows it, and what it lists."""


def refusal(spec: Mapping[str, Any], tenant: str, settings: config.Settings) -> str | None:
    """Why tenant `tenant` may not run the normalised cluster `spec`: a namespace not its
    own, or a reference its table does not allow or that is corral's own. None if it may."""
    scope = tenancy.resolved(settings.tenants, tenant)
    table = f"tenants.{tenant}"
    namespace = spec.get("namespace")
    if namespace != scope.namespace:
        return (
            f"spec.namespace: tenant {tenant!r} runs its cluster jobs in its own namespace"
            f" {scope.namespace!r} ({table}.namespace), not {namespace!r}"
        )
    own = (settings.executors.kubernetes.database_url_secret or "").partition("/")[0]
    for ref in references(spec):
        setting, what = ALLOWED_IN[ref.kind]
        allowed = getattr(scope, setting) or ()
        if ref.name.startswith(RESERVED_PREFIX) or (own and ref.name == own):
            return f"spec.{ref.field}: {ref.name!r} is corral's own; a tenant's job may not name it"
        if ref.name not in allowed:
            return (
                f"spec.{ref.field}: {ref.name!r} is not one of the {what} tenant {tenant!r}"
                f" may name ({table}.{setting}: {', '.join(allowed) or 'none'})"
            )
    return None


def scoped(
    executor: str, spec: Mapping[str, Any], tenant: str, settings: config.Settings
) -> dict[str, Any]:
    """A tenant's `spec` for `executor` as it may run: a cluster job in the tenant's
    namespace (its own when the spec names none); NotGranted (403) naming the field, the
    rule and the setting when it names a namespace or an object the tenant may not. The
    walk reads the spec as given: the shapes it reads are those validation then requires
    (strictly, against the Kubernetes schemas), so nothing it skips can run."""
    if executor not in CLUSTER_KINDS:
        return dict(spec)
    mine = {**spec}
    mine.setdefault("namespace", tenancy.resolved(settings.tenants, tenant).namespace)
    if (why := refusal(mine, tenant, settings)) is not None:
        raise errors.NotGranted(why)
    return mine


def firing_refusal(settings: config.Settings) -> Callable[[scheduling.Schedule], str | None]:
    """Why a firing of a schedule a tenant made is refused under `settings`, checked at
    every firing: its executor no longer granted, or (a cluster job) a namespace or a name
    its tenant's table no longer allows. None when it may run."""

    def why(schedule: scheduling.Schedule) -> str | None:
        executor = tenancy.executor_of(schedule.template)
        if (refused := tenancy.refusal(settings.tenants, schedule.tenant, executor)) is not None:
            return refused
        spec = schedule.template.get("spec")
        if executor in tenancy.CLUSTER and isinstance(spec, Mapping):
            return refusal(spec, schedule.tenant, settings)
        return None

    return why
