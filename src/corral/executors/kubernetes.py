"""The `kubernetes` executor's Jobs: each attempt is one batch/v1 Job.

This module turns a job's spec and an attempt's Launch into the exact Job corral creates,
and checks it before anything is sent: against the published Kubernetes schemas of the
oldest and the newest Kubernetes version corral supports (kubernetes-validate, strict:
unknown fields are errors), and against the rules those schemas do not hold (DNS-1123
names, the 63-character limit, label syntax, resource quantities).

    spec = {
        "image": "ghcr.io/acme/etl:1.4",          # required
        "command": ["python", "-m", "etl"],        # required
        "env": {"LOG_LEVEL": "info"},              # optional
        "placement": "batch",                      # optional: a class from settings
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
        "service_account": "etl",                  # optional, default from settings
    }

The Job: `backoffLimit: 0` (corral owns retries), `activeDeadlineSeconds` what is left of
the attempt's deadline, `ttlSecondsAfterFinished` long enough to outlive a corral outage,
the attempt's labels on the Job and its pod template (full values of hashed ones in
annotations), the CORRAL_* environment, and the placement class's node selector,
tolerations and priority class.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import kubernetes_validate

from corral import config, errors, model
from corral.executors import base

KIND = "kubernetes"
SUPPORTED_VERSIONS = ("1.31", "1.37")
"""The oldest and the newest Kubernetes version whose schemas every Job is checked against."""
CONTAINER = "main"
DATABASE_URL = "CORRAL_DATABASE_URL"

_SPEC_FIELDS = ("image", "command", "env", "placement", "resources", "service_account")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(
    r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_RESOURCE_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class JobTemplate:
    """Specs and Job manifests for the `kubernetes` executor, under these settings."""

    kind = KIND

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self.k8s = settings.executors.kubernetes

    # --- spec ------------------------------------------------------------------------------

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec, normalised; InvalidInput names the field and the rule."""
        if not isinstance(spec, Mapping):
            raise _bad("spec", "must be a JSON object")
        if unknown := sorted(set(spec) - set(_SPEC_FIELDS)):
            raise _bad(unknown[0], f"unknown field (allowed: {', '.join(_SPEC_FIELDS)})")
        image = spec.get("image")
        if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
            raise _bad("image", "required: a container image reference, e.g. busybox:1.36")
        normal: dict[str, Any] = {"image": image, "command": _command(spec.get("command"))}
        if "env" in spec:
            normal["env"] = _env(spec["env"])
        placement = spec.get("placement", self.k8s.default_placement)
        if placement is not None:
            if not isinstance(placement, str) or placement not in self.k8s.placements:
                known = ", ".join(sorted(self.k8s.placements)) or "none are configured"
                raise _bad("placement", f"unknown placement class {placement!r} ({known})")
            normal["placement"] = placement
        if "resources" in spec:
            normal["resources"] = _resources(spec["resources"])
        account = spec.get("service_account")
        if account is not None:
            if not isinstance(account, str) or not _DNS_SUBDOMAIN.match(account):
                raise _bad("service_account", "must be a DNS-1123 subdomain")
            normal["service_account"] = account
        # The whole Job this spec makes must pass the schemas: refuse it now, not at launch.
        check_manifest(self.manifest(placeholder_launch(normal), normal))
        return normal

    # --- the Job ---------------------------------------------------------------------------

    def manifest(self, launch: model.Launch, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The batch/v1 Job for `launch`."""
        k8s = self.k8s
        deadline = launch.deadline_seconds
        if deadline is None:
            deadline = self.settings.timeouts.attempt_deadline.total_seconds()
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": _whole(k8s.termination_grace.total_seconds()),
            "containers": [_container(launch, spec, k8s.database_url_secret)],
        }
        account = spec.get("service_account", k8s.service_account)
        if account:
            pod["serviceAccountName"] = account
        if placement := spec.get("placement"):
            if placement not in k8s.placements:
                raise errors.ExecutorError(
                    f"{launch.name}: placement class {placement!r} is no longer in the settings"
                    " (executors.kubernetes.placements); add it back or cancel the job"
                )
            pod.update(_placement(k8s.placements[placement]))
        metadata: dict[str, Any] = {
            "name": launch.name,
            "namespace": k8s.namespace,
            "labels": dict(launch.labels),
        }
        if launch.annotations:
            metadata["annotations"] = dict(launch.annotations)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": metadata,
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": _whole(deadline),
                "ttlSecondsAfterFinished": _whole(k8s.ttl_after_finished.total_seconds()),
                "template": {"metadata": {"labels": dict(launch.labels)}, "spec": pod},
            },
        }


def dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> dict[str, Any]:
    """The Job the first attempt of `job` (already validated) would create, without a store
    or a cluster: its job id and fence are placeholders (0) until it is stored."""
    launch = base.launch_for(model.first_claim(job, now), settings, now)
    return JobTemplate(settings).manifest(launch, job.spec)


def placeholder_launch(spec: Mapping[str, Any]) -> model.Launch:
    """The Launch of a job not stored yet, with this spec and nothing else: for checks."""
    draft = model.NewJob(executor=KIND, spec=spec)
    return model.build_launch(
        model.first_claim(draft, _EPOCH), reach=model.Reach(), deadline_seconds=None
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- checks ---------------------------------------------------------------------------------------


def check_manifest(doc: Mapping[str, Any]) -> None:
    """Raise InvalidInput unless `doc` passes the strict schemas of every supported
    Kubernetes version and the name and label rules the schemas leave out."""
    for version in SUPPORTED_VERSIONS:
        try:
            kubernetes_validate.validate(dict(doc), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "(top)"
            raise errors.InvalidInput(
                f"{doc.get('kind', 'manifest')} {where}: {exc.message}"
                f" (Kubernetes {version} schema)"
            ) from None
    for problem in manifest_problems(doc):
        raise errors.InvalidInput(problem)


def manifest_problems(doc: Mapping[str, Any]) -> list[str]:
    """The name and label rules Kubernetes' API server enforces but its schemas do not."""
    problems = []
    kind = doc.get("kind", "manifest")
    name = str(doc.get("metadata", {}).get("name", ""))
    if not _DNS_LABEL.match(name):
        problems.append(
            f"{kind} metadata.name {name!r}: must be a DNS-1123 label (lower-case a-z, 0-9"
            " and '-', starting and ending alphanumeric, at most 63 characters)"
        )
    for where, labels in _all_labels(doc):
        for key, value in labels.items():
            if problem := model.label_problem(str(key), str(value)):
                problems.append(f"{kind} {where}: {problem}")
    return problems


def _all_labels(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found = [("metadata.labels", doc.get("metadata", {}).get("labels") or {})]
    template = doc.get("spec", {}).get("template", {})
    found.append(
        ("spec.template.metadata.labels", template.get("metadata", {}).get("labels") or {})
    )
    return found


# --- parts ---------------------------------------------------------------------------------------


def _container(launch: model.Launch, spec: Mapping[str, Any], secret: str | None) -> dict[str, Any]:
    # corral's own variables win; the database URL never goes into a manifest in the clear.
    env = {**spec.get("env", {}), **launch.env}
    env.pop(DATABASE_URL, None)
    entries: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    if secret is not None:
        name, _, key = secret.partition("/")
        ref = {"secretKeyRef": {"name": name, "key": key}}
        entries.append({"name": DATABASE_URL, "valueFrom": ref})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec["image"],
        "command": list(spec["command"]),
        "env": entries,
    }
    if resources := spec.get("resources"):
        container["resources"] = resources
    return container


def _placement(placement: config.Placement) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if placement.node_selector:
        out["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        out["tolerations"] = [t.manifest() for t in placement.tolerations]
    if placement.priority_class:
        out["priorityClassName"] = placement.priority_class
    return out


def _whole(seconds: float) -> int:
    return max(1, math.ceil(seconds))


def _bad(field: str, rule: str) -> errors.InvalidInput:
    return errors.InvalidInput(base.spec_error(KIND, field, rule))


def _command(command: Any) -> list[str]:
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and "\0" not in a for a in command)
    ):
        raise _bad("command", "required: a non-empty list of strings, e.g. ['python', 'job.py']")
    return list(command)


def _env(env: Any) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise _bad("env", "must be an object of NAME: value strings")
    out = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name) or name in (".", ".."):
            raise _bad("env", f"{name!r} is not a valid environment variable name")
        if name.startswith("CORRAL_"):
            raise _bad("env", f"{name!r}: names starting CORRAL_ are set by corral")
        if not isinstance(value, str):
            raise _bad("env", f"{name}: the value must be a string")
        out[name] = value
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


def _resources(resources: Any) -> dict[str, dict[str, str]]:
    if not isinstance(resources, Mapping) or set(resources) - {"requests", "limits"}:
        raise _bad("resources", "must be an object with `requests` and/or `limits`")
    out: dict[str, dict[str, str]] = {}
    for part, amounts in resources.items():
        if not isinstance(amounts, Mapping):
            raise _bad(f"resources.{part}", "must be an object such as {cpu: 500m, memory: 1Gi}")
        for name, amount in amounts.items():
            if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
                raise _bad(f"resources.{part}", f"{name!r} is not a resource name")
            if not isinstance(amount, str | int) or not _QUANTITY.match(str(amount)):
                raise _bad(
                    f"resources.{part}.{name}",
                    f"{amount!r} is not a quantity (e.g. 500m, 2, 1Gi, 512Mi)",
                )
        out[part] = {str(k): str(v) for k, v in amounts.items()}
    _requests_fit_limits(out.get("requests", {}), out.get("limits", {}))
    return out


def _requests_fit_limits(requests: Mapping[str, str], limits: Mapping[str, str]) -> None:
    """What the API server checks: a request is at most its limit, and an extended
    resource (a name with a domain, like nvidia.com/gpu) is whole and not overcommitted."""
    for name, amount in {**requests, **limits}.items():
        if "/" in name and not name.startswith(("kubernetes.io/", "requests.")):
            if quantity(amount) % 1:
                raise _bad(f"resources.{name}", f"{amount}: an extended resource is whole units")
            if name in requests and name in limits and requests[name] != limits[name]:
                raise _bad(
                    f"resources.{name}", "an extended resource's request must equal its limit"
                )
    for name, request in requests.items():
        if name in limits and quantity(request) > quantity(limits[name]):
            raise _bad(
                f"resources.requests.{name}",
                f"{request} is more than its limit {limits[name]}",
            )
