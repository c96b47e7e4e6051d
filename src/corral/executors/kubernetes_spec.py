"""A cluster job's spec, checked and normalised: image, command, env, placement, resources
and service_account here, the pod fields in pods.py. The `kubernetes` and `argo`
executors take the same spec, under the same cluster settings (their resource ceiling,
placement classes and allowed service accounts), and refuse it before anything is made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from corral import errors
from corral.executors import base, kubernetes_settings, pods

_SPEC_FIELDS = (
    "image",
    "command",
    "env",
    "placement",
    "resources",
    "service_account",
    *pods.FIELDS,
)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(
    r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
# A container image reference (the distribution project's grammar): an optional registry
# host (with a port), path components of lower-case alphanumerics and separators, an
# optional tag, an optional digest.
_HOST_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_IMAGE_HOST = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?/)"
_IMAGE_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_TAG = r"(?::[\w][\w.-]{0,127})"
_IMAGE_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})"
_IMAGE = re.compile(
    rf"^{_IMAGE_HOST}?{_IMAGE_PART}(?:/{_IMAGE_PART})*{_IMAGE_TAG}?{_IMAGE_DIGEST}?$"
)
_RESOURCE_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def normalise_spec(
    spec: Mapping[str, Any], cluster: kubernetes_settings.KubernetesExecutorSettings, *, kind: str
) -> dict[str, Any]:
    """A container spec (image, command, env, placement, resources, service_account),
    normalised under these cluster settings; InvalidInput names the `kind` of executor,
    the field and the rule. It checks the fields only, not the object they make."""
    try:
        return _normalise(spec, cluster)
    except errors.FieldRefused as exc:
        raise errors.InvalidInput(base.spec_error(kind, exc.field, exc.rule)) from None


def check_cluster_settings(k8s: kubernetes_settings.KubernetesExecutorSettings) -> None:
    """ConfigError naming the setting when the ceiling on resources is not one, or the
    default resources or a placement class's resources or security contexts are not what a
    job's spec could hold (above the ceiling among them)."""
    try:
        _ceiling(k8s.max_resources)
        _resources(k8s.default_resources, "executors.kubernetes.default_resources", cluster=k8s)
        for name, placement in k8s.placements.items():
            where = f"executors.kubernetes.placements.{name}.resources"
            _resources(placement.resources, where, cluster=k8s)
            pods.check_placement(name, placement, k8s)
    except errors.FieldRefused as exc:
        raise errors.ConfigError(f"{exc.field}: {exc.rule}") from None


def _normalise(
    spec: Mapping[str, Any], k8s: kubernetes_settings.KubernetesExecutorSettings
) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise _bad("spec", "must be a JSON object")
    if unknown := sorted(set(spec) - set(_SPEC_FIELDS)):
        raise _bad(unknown[0], f"unknown field (allowed: {', '.join(_SPEC_FIELDS)})")
    normal: dict[str, Any] = {
        "image": _image(spec.get("image")),
        "command": _command(spec.get("command")),
    }
    if "env" in spec:
        normal["env"] = _env(spec["env"])
    placement = spec.get("placement", k8s.default_placement)
    if placement is not None:
        if not isinstance(placement, str) or placement not in k8s.placements:
            known = ", ".join(sorted(k8s.placements)) or "none are configured"
            raise _bad("placement", f"unknown placement class {placement!r} ({known})")
        normal["placement"] = placement
    if "resources" in spec:
        normal["resources"] = _resources(spec["resources"], cluster=k8s)
    account = spec.get("service_account")
    if account is not None:
        if not isinstance(account, str) or not _DNS_SUBDOMAIN.match(account):
            raise _bad("service_account", "must be a DNS-1123 subdomain")
        _allowed_account(account, k8s)
        normal["service_account"] = account
    normal.update(pods.normalise(spec, k8s))
    for n, sidecar in enumerate(normal.get("sidecars", [])):
        _check_sidecar(f"sidecars[{n}]", sidecar, k8s)
    return normal


def _image(image: Any, field: str = "image") -> str:
    if image is None or image == "":
        raise _bad(field, "required: a container image reference, e.g. busybox:1.36")
    if not isinstance(image, str) or not _IMAGE.match(image):
        raise _bad(
            field,
            f"{image!r} is not an image reference: [REGISTRY[:PORT]/]NAME[:TAG][@DIGEST],"
            " lower-case name parts, e.g. busybox:1.36 or ghcr.io/acme/etl:1.4",
        )
    return image


def _check_sidecar(
    where: str, sidecar: dict[str, Any], k8s: kubernetes_settings.KubernetesExecutorSettings
) -> None:
    """A sidecar's image, command, args and resources, by the job container's rules."""
    _image(sidecar["image"], f"{where}.image")
    try:
        sidecar["command"] = _command(sidecar["command"])
        if "args" in sidecar:
            sidecar["args"] = _args(sidecar["args"])
        if "resources" in sidecar:
            sidecar["resources"] = _resources(sidecar["resources"], cluster=k8s)
    except errors.FieldRefused as exc:
        raise _bad(f"{where}.{exc.field}", exc.rule) from None


def _args(args: Any) -> list[str]:
    if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        raise _bad("args", "must be a list of strings")
    return list(args)


def _allowed_account(account: str, k8s: kubernetes_settings.KubernetesExecutorSettings) -> None:
    """A job runs only as an account corral was told it may use: any other could be
    corral's own, whose token creates Jobs (a job that could name it could do anything)."""
    allowed = k8s.accounts_allowed
    if account not in allowed:
        listed = ", ".join(allowed) or "none"
        raise _bad(
            "service_account",
            f"{account!r} is not allowed: a job may only run as one of"
            f" executors.kubernetes.allowed_service_accounts ({listed}; by default the"
            " configured service_account alone); add it there if jobs may use it",
        )


def _bad(field: str, rule: str) -> errors.FieldRefused:
    return errors.FieldRefused(field, rule)


def _command(command: Any) -> list[str]:
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and "\0" not in a for a in command)
    ):
        raise _bad("command", "required: a non-empty list of strings, e.g. ['python', 'job.py']")
    if not command[0].strip():  # an empty argument is fine (grep '' file); no program is not
        raise _bad("command", "its first item, the program to run, is empty")
    return list(command)


def _env(env: Any) -> dict[str, str | dict[str, Any]]:
    if not isinstance(env, Mapping):
        raise _bad("env", "must be an object of NAME: value strings")
    out: dict[str, str | dict[str, Any]] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name) or name in (".", ".."):
            raise _bad("env", f"{name!r} is not a valid environment variable name")
        if name.startswith("CORRAL_"):
            raise _bad("env", f"{name!r}: names starting CORRAL_ are set by corral")
        if not isinstance(value, str | Mapping):
            raise _bad("env", f"{name}: the value must be a string")
        out[name] = pods.env_value(name, value)
    return out


_SUFFIX: dict[str, Decimal] = {
    **{s: Decimal(2) ** (10 * n) for n, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3))},
    **{s: Decimal(10) ** (3 * n) for n, s in enumerate(("M", "G", "T", "P", "E"), 2)},
}


def quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity as a number (`500m` is 0.5, `1Gi` is 2**30)."""
    match = re.fullmatch(r"[+]?([0-9.]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?", text)
    if match is None or not _QUANTITY.match(text):
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * Decimal(10) ** int(suffix[1:])
    return number * _SUFFIX[suffix]


def _resources(
    resources: Any,
    field: str = "resources",
    *,
    cluster: kubernetes_settings.KubernetesExecutorSettings,
) -> dict[str, dict[str, str]]:
    if not isinstance(resources, Mapping) or set(resources) - {"requests", "limits"}:
        raise _bad(field, "must be an object with `requests` and/or `limits`")
    out: dict[str, dict[str, str]] = {}
    for part, amounts in resources.items():
        if not isinstance(amounts, Mapping):
            raise _bad(f"{field}.{part}", "must be an object such as {cpu: 500m, memory: 1Gi}")
        for name, amount in amounts.items():
            if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
                raise _bad(f"{field}.{part}", f"{name!r} is not a resource name")
            if not isinstance(amount, str | int) or not _QUANTITY.match(str(amount)):
                raise _bad(
                    f"{field}.{part}.{name}",
                    f"{amount!r} is not a quantity (e.g. 500m, 2, 1Gi, 512Mi)",
                )
        out[part] = {str(k): str(v) for k, v in amounts.items()}
    _requests_fit_limits(out.get("requests", {}), out.get("limits", {}), field)
    _within_ceiling(out, cluster.max_resources, field)
    return out


MAX_RESOURCES = "executors.kubernetes.max_resources"


def _ceiling(ceiling: Mapping[str, str]) -> None:
    """FieldRefused (the setting named) unless each of `ceiling`'s names is a resource and
    each amount a quantity."""
    for name, amount in ceiling.items():
        if not _RESOURCE_NAME.match(name):
            raise _bad(MAX_RESOURCES, f"{name!r} is not a resource name")
        if not _QUANTITY.match(amount):
            raise _bad(f"{MAX_RESOURCES}.{name}", f"{amount!r} is not a quantity (e.g. 8, 32Gi)")


def _within_ceiling(
    resources: Mapping[str, Mapping[str, str]], ceiling: Mapping[str, str], field: str
) -> None:
    """FieldRefused when a request or a limit asks more of a resource than the ceiling
    (max_resources) allows. One flat number a resource bounds both: a request is at most
    its limit, so a ceiling for each would only say the same thing twice."""
    for part, amounts in resources.items():
        for name, amount in amounts.items():
            most = ceiling.get(name)
            if most is not None and quantity(amount) > quantity(most):
                raise _bad(
                    f"{field}.{part}.{name}",
                    f"{amount} is more than {MAX_RESOURCES} allows ({most})",
                )


def _requests_fit_limits(
    requests: Mapping[str, str], limits: Mapping[str, str], field: str = "resources"
) -> None:
    """What the API server checks: a request is at most its limit, and an extended
    resource (a name with a domain, like nvidia.com/gpu) is whole and not overcommitted."""
    for name, amount in {**requests, **limits}.items():
        if "/" in name and not name.startswith(("kubernetes.io/", "requests.")):
            if quantity(amount) % 1:
                raise _bad(f"{field}.{name}", f"{amount}: an extended resource is whole units")
            if name in requests and name in limits and requests[name] != limits[name]:
                raise _bad(f"{field}.{name}", "an extended resource's request must equal its limit")
    for name, request in requests.items():
        if name in limits and quantity(request) > quantity(limits[name]):
            raise _bad(
                f"{field}.requests.{name}",
                f"{request} is more than its limit {limits[name]}",
            )
