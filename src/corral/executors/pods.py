"""The pod a cluster job runs in, beyond its image and command: least privilege by default,
and the fields users reach for, each checked at submit.

Every pod the `kubernetes` and `argo` executors make meets the Pod Security Standard
"restricted" unless the settings say otherwise (`executors.kubernetes.pod_security`): the
pod runs as non-root with the runtime's seccomp profile, every container without privilege
escalation and with all capabilities dropped. Every container has requests and limits
(`executors.kubernetes.default_resources`), so no pod is BestEffort. A placement class, then
the job's spec, may change them, field by field (resource by resource), and only within the
level the settings allow: the rule broken is named with the field.

    spec = {
        ...,                                       # image, command, env... (kubernetes.py)
        "namespace": "etl",                        # from executors.kubernetes.namespaces
        "env": {"PASSWORD": {"secret": "etl-db", "key": "password"},
                "REGION": {"config_map": "etl", "key": "region"}},
        "env_from": [{"config_map": "etl-settings"}, {"secret": "etl-keys", "prefix": "K_"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "etl-data"}}],
        "volume_mounts": [{"name": "data", "mountPath": "/data"}],
        "image_pull_secrets": ["registry"],
        "pod_security_context": {"runAsUser": 1000, "fsGroup": 1000},
        "security_context": {"readOnlyRootFilesystem": True},
        "affinity": {"nodeAffinity": {...}},       # core/v1 Affinity
        "annotations": {"example.com/team": "data"},
        "sidecars": [{"name": "proxy", "image": "envoy:1.31", "command": ["envoy"]}],
    }

Kubernetes objects (a volume, a mount, an affinity, a security context) are written as
Kubernetes writes them and checked against its published schemas (strict) of every
supported version, so an error names the spec field and the schema's rule. A sidecar is a
native one (an init container with `restartPolicy: Always`): it starts before the job's
container and is stopped when that one ends, so it never keeps the pod, and the attempt,
running.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from corral import errors, model
from corral.executors import kube_schemas, kubernetes_settings

POD_DEFAULTS: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The pod securityContext of every pod: restricted's."""
CONTAINER_DEFAULTS: Mapping[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
"""The securityContext of every container corral makes (the job's and its sidecars)."""

POD_CONTEXT_FIELDS = (
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "fsGroup",
    "fsGroupChangePolicy",
    "supplementalGroups",
    "seccompProfile",
    "appArmorProfile",
)
CONTAINER_CONTEXT_FIELDS = (
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "capabilities",
    "seccompProfile",
    "appArmorProfile",
)
"""What a spec or placement class may set in a securityContext: nothing that the Pod
Security Standards' baseline forbids outright (privileged, host namespaces, SELinux users,
procMount, sysctls) can even be written."""

RESTRICTED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
"""The volume types Pod Security "restricted" allows; baseline allows all but hostPath."""
BASELINE_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)
"""The capabilities baseline lets a container add; restricted allows NET_BIND_SERVICE alone."""

RESERVED_DIR = "/var/run/corral"
"""Where corral mounts what it gives a pod (the payload): a job may mount nothing there."""
RESERVED_PREFIX = "corral-"
"""Names of volumes corral makes start with it (corral-payload): a job's may not."""
MAIN = "main"
"""The job's own container."""
ANNOTATIONS_BYTES = 256 * 1024
"""The most an object's annotations may hold (the API server's rule)."""

SIDECAR_FIELDS = (
    "name",
    "image",
    "command",
    "args",
    "env",
    "env_from",
    "resources",
    "volume_mounts",
    "security_context",
)
_ENV_REF = {"secret": "secretKeyRef", "config_map": "configMapKeyRef"}
_ENV_FROM = {"secret": "secretRef", "config_map": "configMapRef"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


# --- Kubernetes' schemas, part by part -------------------------------------------------------


def _kube_object(field: str, value: Any, kind: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise errors.FieldRefused(field, f"must be an object (a core/v1 {kind})")
    if problem := kube_schemas.schema_problem(dict(value), kind):
        where, rule = problem
        raise errors.FieldRefused(f"{field}{where}", rule)
    return dict(value)


def _list(field: str, value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise errors.FieldRefused(field, f"must be a list of {what}")
    return value


# --- the fields -----------------------------------------------------------------------------


def normalise(
    spec: Mapping[str, Any], k8s: kubernetes_settings.KubernetesExecutorSettings
) -> dict[str, Any]:
    """The pod fields of `spec` (those in FIELDS it holds), normalised; FieldRefused names the
    field and the rule. `env` and `resources` stay kubernetes.py's, but for references."""
    out: dict[str, Any] = {}
    for field, check in FIELDS.items():
        if field in spec:
            out[field] = check(spec[field], k8s)
    volumes = {v["name"] for v in out.get("volumes", [])}
    for n, mount in enumerate(out.get("volume_mounts", [])):
        _mounted(f"volume_mounts[{n}]", mount, volumes)
    for n, sidecar in enumerate(out.get("sidecars", [])):
        for m, mount in enumerate(sidecar.get("volume_mounts", [])):
            _mounted(f"sidecars[{n}].volume_mounts[{m}]", mount, volumes)
    return out


def _namespace(value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings) -> str:
    allowed = k8s.namespaces_allowed
    if not isinstance(value, str) or value not in allowed:
        raise errors.FieldRefused(
            "namespace",
            f"{value!r} is not allowed: a job may only run in one of"
            f" executors.kubernetes.namespaces ({', '.join(allowed)}; by default the configured"
            " namespace alone); add it there, and corral's Role in it (`corral deploy rbac`)",
        )
    return value


def env_value(name: str, value: Any, field: str = "env") -> str | dict[str, Any]:
    """One variable's value: a string, or a reference to a key of a Secret or ConfigMap
    (`{"secret": NAME, "key": KEY}`, optional: `"optional": true`)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping) or len(set(value) & set(_ENV_REF)) != 1:
        raise errors.FieldRefused(
            f"{field}.{name}",
            'must be a string or {"secret": NAME, "key": KEY} or {"config_map": NAME, "key": KEY}',
        )
    [source] = set(value) & set(_ENV_REF)
    if unknown := sorted(set(value) - {source, "key", "optional"}):
        raise errors.FieldRefused(
            f"{field}.{name}", f"{unknown[0]}: unknown (allowed: {source}, key, optional)"
        )
    _object_name(f"{field}.{name}.{source}", value[source])
    key = value.get("key")
    if not isinstance(key, str) or not _ENV_KEY.match(key):
        raise errors.FieldRefused(f"{field}.{name}.key", "required: the key in it, [-._a-zA-Z0-9]+")
    if not isinstance(value.get("optional", False), bool):
        raise errors.FieldRefused(f"{field}.{name}.optional", "must be true or false")
    return dict(value)


def env_entry(name: str, value: str | Mapping[str, Any]) -> dict[str, Any]:
    """The core/v1 EnvVar of a normalised value."""
    if isinstance(value, str):
        return {"name": name, "value": value}
    [source] = set(value) & set(_ENV_REF)
    ref: dict[str, Any] = {"name": value[source], "key": value["key"]}
    if "optional" in value:
        ref["optional"] = value["optional"]
    return {"name": name, "valueFrom": {_ENV_REF[source]: ref}}


def _env_from(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings, field: str = "env_from"
) -> list[dict[str, Any]]:
    out = []
    for n, item in enumerate(_list(field, value, '{"config_map": NAME} or {"secret": NAME}')):
        where = f"{field}[{n}]"
        if not isinstance(item, Mapping) or len(set(item) & set(_ENV_FROM)) != 1:
            raise errors.FieldRefused(where, 'must be {"config_map": NAME} or {"secret": NAME}')
        [source] = set(item) & set(_ENV_FROM)
        if unknown := sorted(set(item) - {source, "prefix", "optional"}):
            raise errors.FieldRefused(
                where, f"{unknown[0]}: unknown (allowed: {source}, prefix, optional)"
            )
        _object_name(f"{where}.{source}", item[source])
        prefix = item.get("prefix", "")
        if not isinstance(prefix, str) or (prefix and not _ENV_KEY.match(prefix)):
            raise errors.FieldRefused(f"{where}.prefix", "must be a string of [-._a-zA-Z0-9]")
        if prefix.startswith("CORRAL_"):
            raise errors.FieldRefused(f"{where}.prefix", "names starting CORRAL_ are set by corral")
        if not isinstance(item.get("optional", False), bool):
            raise errors.FieldRefused(f"{where}.optional", "must be true or false")
        out.append(dict(item))
    return out


def env_from_entries(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The core/v1 EnvFromSource list of normalised `env_from` items."""
    out = []
    for item in items:
        [source] = set(item) & set(_ENV_FROM)
        ref: dict[str, Any] = {"name": item[source]}
        if "optional" in item:
            ref["optional"] = item["optional"]
        entry: dict[str, Any] = {_ENV_FROM[source]: ref}
        if item.get("prefix"):
            entry["prefix"] = item["prefix"]
        out.append(entry)
    return out


def _volumes(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings
) -> list[dict[str, Any]]:
    out, names = [], set()
    for n, item in enumerate(_list("volumes", value, "core/v1 Volumes")):
        volume = _kube_object(f"volumes[{n}]", item, "Volume")
        name = str(volume.get("name", ""))
        if not _DNS_LABEL.match(name) or name.startswith(RESERVED_PREFIX) or name in names:
            raise errors.FieldRefused(
                f"volumes[{n}].name",
                f"{name!r}: a unique DNS-1123 label, not starting {RESERVED_PREFIX!r} (corral's)",
            )
        names.add(name)
        types = set(volume) - {"name"}
        allowed = _volume_types(k8s.pod_security)
        if bad := sorted(t for t in types if t not in allowed):
            raise errors.FieldRefused(
                f"volumes[{n}]",
                f"{bad[0]} volumes are not allowed under Pod Security {k8s.pod_security!r}"
                f" (executors.kubernetes.pod_security); allowed: {', '.join(sorted(allowed))}",
            )
        out.append(volume)
    return out


def _volume_types(level: str) -> set[str]:
    if level == "restricted":
        return set(RESTRICTED_VOLUMES)
    schema = kube_schemas.validator("Volume", kube_schemas.SUPPORTED_VERSIONS[-1]).schema
    properties = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    return set(properties) - {"name", "hostPath"}


def _volume_mounts(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings, field: str = "volume_mounts"
) -> list[dict[str, Any]]:
    out = []
    for n, item in enumerate(_list(field, value, "core/v1 VolumeMounts")):
        mount = _kube_object(f"{field}[{n}]", item, "VolumeMount")
        path = str(mount.get("mountPath", ""))
        if path.rstrip("/") == RESERVED_DIR or path.startswith(RESERVED_DIR + "/"):
            raise errors.FieldRefused(
                f"{field}[{n}].mountPath", f"{RESERVED_DIR} is corral's (the payload)"
            )
        out.append(mount)
    return out


def _mounted(field: str, mount: Mapping[str, Any], volumes: set[str]) -> None:
    if mount.get("name") not in volumes:
        raise errors.FieldRefused(
            f"{field}.name", f"{mount.get('name')!r} is not one of the spec's volumes"
        )


def _image_pull_secrets(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings
) -> list[str]:
    names = _list("image_pull_secrets", value, "Secret names")
    for n, name in enumerate(names):
        _object_name(f"image_pull_secrets[{n}]", name)
    return list(names)


def _pod_security_context(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings
) -> dict[str, Any]:
    return security_context("pod_security_context", value, k8s, pod=True)


def _security_context(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings
) -> dict[str, Any]:
    return security_context("security_context", value, k8s, pod=False)


def security_context(
    field: str, value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings, *, pod: bool
) -> dict[str, Any]:
    """A pod's (`pod`) or a container's securityContext fields as a spec or placement class
    writes them: only the fields corral lets through, each within the Pod Security level
    of the settings, and the whole against Kubernetes' schema."""
    allowed = POD_CONTEXT_FIELDS if pod else CONTAINER_CONTEXT_FIELDS
    if isinstance(value, Mapping) and (unknown := sorted(set(value) - set(allowed))):
        raise errors.FieldRefused(
            f"{field}.{unknown[0]}", f"may not be set (allowed: {', '.join(allowed)})"
        )
    context = _kube_object(field, value, "PodSecurityContext" if pod else "SecurityContext")
    for key, rule in context_problems(context, k8s.pod_security):
        raise errors.FieldRefused(
            f"{field}.{key}",
            f"{rule} under Pod Security {k8s.pod_security!r} (executors.kubernetes.pod_security)",
        )
    return context


def context_problems(context: Mapping[str, Any], level: str) -> list[tuple[str, str]]:
    """Where a securityContext (pod or container) breaks the Pod Security `level`, and how."""
    problems = []
    for where in ("seccompProfile", "appArmorProfile"):
        if (context.get(where) or {}).get("type") == "Unconfined":
            problems.append((f"{where}.type", "Unconfined is not allowed"))
    added = (context.get("capabilities") or {}).get("add") or []
    allowed = ("NET_BIND_SERVICE",) if level == "restricted" else BASELINE_CAPABILITIES
    if bad := [c for c in added if c.removeprefix("CAP_") not in allowed]:
        problems.append(
            ("capabilities.add", f"{bad[0]} may not be added (allowed: {', '.join(allowed)})")
        )
    if level != "restricted":
        return problems
    if context.get("runAsNonRoot") is False:
        problems.append(("runAsNonRoot", "must stay true"))
    if context.get("runAsUser") == 0:
        problems.append(("runAsUser", "0 (root) is not allowed"))
    if context.get("allowPrivilegeEscalation") is True:
        problems.append(("allowPrivilegeEscalation", "must stay false"))
    capabilities = context.get("capabilities")
    if capabilities is not None and "ALL" not in (capabilities.get("drop") or []):
        problems.append(("capabilities.drop", "must include ALL"))
    return problems


def _affinity(value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings) -> dict[str, Any]:
    return _kube_object("affinity", value, "Affinity")


def _annotations(value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise errors.FieldRefused("annotations", "must be an object of key: value strings")
    for key, text in value.items():
        if not isinstance(key, str) or (problem := model.label_problem(key, "")):
            raise errors.FieldRefused(
                "annotations", (problem or repr(key)).replace("label key", "key")
            )
        if key.startswith(model.LABEL_PREFIX):
            raise errors.FieldRefused(
                f"annotations.{key}", f"the prefix {model.LABEL_PREFIX!r} is corral's"
            )
        if not isinstance(text, str):
            raise errors.FieldRefused(f"annotations.{key}", "the value must be a string")
    if sum(len(k) + len(v.encode()) for k, v in value.items()) > ANNOTATIONS_BYTES // 2:
        raise errors.FieldRefused(
            "annotations",
            f"more than {ANNOTATIONS_BYTES // 2} bytes (half the API server's limit: the rest"
            " is corral's)",
        )
    return dict(value)


def _sidecars(
    value: Any, k8s: kubernetes_settings.KubernetesExecutorSettings
) -> list[dict[str, Any]]:
    out, names = [], {MAIN}
    for n, item in enumerate(_list("sidecars", value, "containers (name, image, command...)")):
        where = f"sidecars[{n}]"
        if not isinstance(item, Mapping):
            raise errors.FieldRefused(where, "must be an object (name, image, command, ...)")
        if unknown := sorted(set(item) - set(SIDECAR_FIELDS)):
            raise errors.FieldRefused(
                f"{where}.{unknown[0]}", f"unknown field (allowed: {', '.join(SIDECAR_FIELDS)})"
            )
        name = item.get("name")
        if not isinstance(name, str) or not _DNS_LABEL.match(name) or name in names:
            raise errors.FieldRefused(
                f"{where}.name", f"{name!r}: a unique DNS-1123 label, not {MAIN!r}"
            )
        names.add(name)
        out.append(_sidecar(where, item, k8s))
    return out


def _sidecar(
    where: str, item: Mapping[str, Any], k8s: kubernetes_settings.KubernetesExecutorSettings
) -> dict[str, Any]:
    sidecar: dict[str, Any] = {"name": item["name"]}
    for key in ("image", "command"):
        if key not in item:
            raise errors.FieldRefused(f"{where}.{key}", "required")
    for key, value in item.items():
        if key in ("name",):
            continue
        if key == "env":
            if not isinstance(value, Mapping):
                raise errors.FieldRefused(f"{where}.env", "must be an object of NAME: value")
            sidecar["env"] = {
                str(k): env_value(str(k), v, f"{where}.env") for k, v in value.items()
            }
        elif key == "env_from":
            sidecar["env_from"] = _env_from(value, k8s, f"{where}.env_from")
        elif key == "volume_mounts":
            sidecar["volume_mounts"] = _volume_mounts(value, k8s, f"{where}.volume_mounts")
        elif key == "security_context":
            sidecar["security_context"] = security_context(
                f"{where}.security_context", value, k8s, pod=False
            )
        else:
            sidecar[key] = value  # image, command, args, resources: checked as the job's
    return sidecar


FIELDS: dict[str, Callable[[Any, kubernetes_settings.KubernetesExecutorSettings], Any]] = {
    "namespace": _namespace,
    "env_from": _env_from,
    "volumes": _volumes,
    "volume_mounts": _volume_mounts,
    "image_pull_secrets": _image_pull_secrets,
    "pod_security_context": _pod_security_context,
    "security_context": _security_context,
    "affinity": _affinity,
    "annotations": _annotations,
    "sidecars": _sidecars,
}
"""The pod fields a spec may hold, and what checks each."""


def _object_name(field: str, name: Any) -> None:
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise errors.FieldRefused(field, f"{name!r} is not an object name (a DNS-1123 subdomain)")


# --- the pod ---------------------------------------------------------------------------------


def resources(
    own: Mapping[str, Mapping[str, str]] | None,
    k8s: kubernetes_settings.KubernetesExecutorSettings,
    placement: kubernetes_settings.Placement | None = None,
) -> dict[str, dict[str, str]]:
    """A container's requests and limits: the settings' defaults, then the placement
    class's, then its `own`; a layer that names a resource (as a request or a limit)
    replaces both of the layers below for it, so a request never meets a lower limit
    it did not choose."""
    merged: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    for layer in (k8s.default_resources, placement.resources if placement else {}, own or {}):
        named = {name for amounts in layer.values() for name in amounts}
        for kept in merged.values():
            for name in named:
                kept.pop(name, None)
        for part, amounts in layer.items():
            merged[part].update(amounts)
    return {part: amounts for part, amounts in merged.items() if amounts}


def pod_context(
    spec: Mapping[str, Any], placement: kubernetes_settings.Placement | None, run_as_user: int
) -> dict[str, Any]:
    """The pod's securityContext: restricted's defaults, the class's fields, the job's;
    `run_as_user` where none of them names a uid (a kubelet refuses runAsNonRoot for an
    image that declares root unless a uid is given)."""
    context = {
        **POD_DEFAULTS,
        **(placement.pod_security_context if placement else {}),
        **spec.get("pod_security_context", {}),
    }
    context.setdefault("runAsUser", run_as_user)
    return context


def container_context(
    own: Mapping[str, Any] | None, placement: kubernetes_settings.Placement | None = None
) -> dict[str, Any]:
    """A container's securityContext: restricted's defaults, the class's fields, its own."""
    return {
        **CONTAINER_DEFAULTS,
        **(placement.security_context if placement else {}),
        **(own or {}),
    }


def container_fields(
    spec: Mapping[str, Any],
    k8s: kubernetes_settings.KubernetesExecutorSettings,
    placement: kubernetes_settings.Placement | None,
) -> dict[str, Any]:
    """What the spec's pod fields put on the job's container: its securityContext and
    resources (with the defaults), envFrom and volumeMounts."""
    out: dict[str, Any] = {
        "securityContext": container_context(spec.get("security_context"), placement),
        "resources": resources(spec.get("resources"), k8s, placement),
    }
    if spec.get("env_from"):
        out["envFrom"] = env_from_entries(spec["env_from"])
    if spec.get("volume_mounts"):
        out["volumeMounts"] = [dict(m) for m in spec["volume_mounts"]]
    return out


def pod_fields(
    spec: Mapping[str, Any],
    k8s: kubernetes_settings.KubernetesExecutorSettings,
    placement: kubernetes_settings.Placement | None,
) -> dict[str, Any]:
    """What the spec's pod fields put on the pod (core/v1 PodSpec): its securityContext,
    imagePullSecrets, affinity and sidecars. Volumes are the caller's, beside its own."""
    out: dict[str, Any] = {"securityContext": pod_context(spec, placement, k8s.run_as_user)}
    if spec.get("image_pull_secrets"):
        out["imagePullSecrets"] = [{"name": name} for name in spec["image_pull_secrets"]]
    if spec.get("affinity"):
        out["affinity"] = dict(spec["affinity"])
    if spec.get("sidecars"):
        out["initContainers"] = [sidecar(s, k8s) for s in spec["sidecars"]]
    return out


def sidecar(
    spec: Mapping[str, Any], k8s: kubernetes_settings.KubernetesExecutorSettings
) -> dict[str, Any]:
    """The core/v1 Container of a normalised sidecar: a native sidecar (an init container
    that restarts Always), which the kubelet stops once the job's container has ended."""
    container: dict[str, Any] = {
        "name": spec["name"],
        "image": spec["image"],
        "command": list(spec["command"]),
        "restartPolicy": "Always",
        "securityContext": container_context(spec.get("security_context")),
        "resources": resources(spec.get("resources"), k8s),
    }
    if "args" in spec:
        container["args"] = list(spec["args"])
    if spec.get("env"):
        container["env"] = [env_entry(k, v) for k, v in sorted(spec["env"].items())]
    if spec.get("env_from"):
        container["envFrom"] = env_from_entries(spec["env_from"])
    if spec.get("volume_mounts"):
        container["volumeMounts"] = [dict(m) for m in spec["volume_mounts"]]
    return container


def check_placement(
    name: str,
    placement: kubernetes_settings.Placement,
    k8s: kubernetes_settings.KubernetesExecutorSettings,
) -> None:
    """FieldRefused (its field named as a setting) when a placement class's security contexts
    break the Pod Security level or are not Kubernetes'."""
    where = f"executors.kubernetes.placements.{name}"
    security_context(f"{where}.pod_security_context", placement.pod_security_context, k8s, pod=True)
    security_context(f"{where}.security_context", placement.security_context, k8s, pod=False)
