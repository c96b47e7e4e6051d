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
tolerations and priority class. The pod fields beyond these (a namespace from the allowed
ones, the restricted securityContext and default resources every pod gets, volumes,
Secret and ConfigMap references, pull secrets, affinity, annotations, native sidecars)
are pods.py's; the spec's own fields are kubernetes_spec.py's.

The job's payload (kubernetes_owned.Payload): none when it is null; its JSON in
`CORRAL_PAYLOAD` when that is at most PAYLOAD_ENV_BYTES (32 KiB) of UTF-8; else in a
ConfigMap named after the launch, with the Job's labels, mounted read-only at
PAYLOAD_DIR, `CORRAL_PAYLOAD_FILE` naming its file. The ConfigMap is created after the
Job, owned by it (its uid, so that it goes when the Job goes), and the pod waits in
ContainerCreating until it exists. A launch that stopped between the two (a crash, an
API server that failed) is finished by the next launch of the name: the Job's 409 counts
as launched and the ConfigMap is made (its own 409 counts as made), which recovery asks
for before it adopts an attempt.

The attempt token (CORRAL_ATTEMPT_TOKEN, when corral has an `api_url`) is never in the
Job in the clear, where whoever may read Jobs would see it: it is in a Secret named
after the launch (kubernetes_owned.attempt_secret), made after the Job and owned by it
like the ConfigMap (a launch cut short in between is finished the same way), and the
container reads it with `valueFrom.secretKeyRef`, not optional: the pod waits until the
Secret exists.

The `argo` executor takes the same spec, checked by kubernetes_spec.normalise_spec, and
runs the same container (`container`) under the same placement classes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate

from corral import config, errors, launching, model
from corral.executors import (
    kube_client,
    kube_schemas,
    kubernetes_owned,
    kubernetes_settings,
    pods,
)

KIND = "kubernetes"
SUPPORTED_VERSIONS = kube_schemas.SUPPORTED_VERSIONS
"""The oldest and the newest Kubernetes version whose schemas every Job is checked against."""
DATABASE_URL = "CORRAL_DATABASE_URL"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def job(
    launch: launching.Launch, spec: Mapping[str, Any], settings: config.Settings
) -> dict[str, Any]:
    """The batch/v1 Job for `launch`, from its normalised spec, under these settings."""
    k8s = settings.executors.kubernetes
    metadata: dict[str, Any] = {
        "name": launch.name,
        "namespace": spec.get("namespace", k8s.namespace),
        "labels": dict(launch.labels),
    }
    if launch.annotations:
        metadata["annotations"] = dict(launch.annotations)
    pod_metadata: dict[str, Any] = {"labels": dict(launch.labels)}
    if spec.get("annotations"):
        pod_metadata["annotations"] = dict(spec["annotations"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": active_deadline(launch, settings),
            "ttlSecondsAfterFinished": whole_seconds(k8s.ttl_after_finished.total_seconds()),
            # A pod lost with its node, or evicted, is replaced within the same attempt
            # (and Job): only once the old pod is gone, so two never run at once.
            "podFailurePolicy": {"rules": [_IGNORE_DISRUPTIONS]},
            "podReplacementPolicy": "Failed",
            "template": {"metadata": pod_metadata, "spec": pod_spec(launch, spec, settings)},
        },
    }


_IGNORE_DISRUPTIONS = {
    "action": "Ignore",
    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
}


def pod_spec(
    launch: launching.Launch, spec: Mapping[str, Any], settings: config.Settings
) -> dict[str, Any]:
    """The pod of `launch`'s Job: its container, the pod fields of the spec, its volumes,
    its service account, and its placement class's node selector and tolerations."""
    k8s = settings.executors.kubernetes
    payload = kubernetes_owned.Payload.of(launch)
    placement = placement_class(spec, k8s, launch.name)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": whole_seconds(k8s.termination_grace.total_seconds()),
        "containers": [container(launch, spec, payload, settings)],
        **pods.pod_fields(spec, k8s, placement),
    }
    if volumes := volumes_of(launch, spec, payload):
        pod["volumes"] = volumes
    account = spec.get("service_account", k8s.service_account)
    if account:
        pod["serviceAccountName"] = account
    # A job needs no API token to run: only the accounts the settings name mount one.
    pod["automountServiceAccountToken"] = account in k8s.token_accounts
    if placement:
        pod.update(_placement(placement))
    return pod


def placeholder_launch(spec: Mapping[str, Any], *, kind: str = KIND) -> launching.Launch:
    """The Launch of a job not stored yet, with this spec and nothing else: for checks."""
    draft = model.NewJob(executor=kind, spec=spec)
    return launching.build_launch(
        model.first_claim(draft, _EPOCH), reach=launching.Reach(), deadline_seconds=None
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    """The name, label and size rules Kubernetes' API server enforces but its schemas do not."""
    problems = []
    kind = doc.get("kind", "manifest")
    if kind == "ConfigMap" and (size := _data_size(doc)) > kubernetes_owned.CONFIG_MAP_BYTES:
        problems.append(
            f"ConfigMap data: {size} bytes, more than {kubernetes_owned.CONFIG_MAP_BYTES} allowed"
        )
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


def _data_size(doc: Mapping[str, Any]) -> int:
    """The bytes of a ConfigMap's values, as the API server counts them against its limit."""
    values = [*(doc.get("data") or {}).values(), *(doc.get("binaryData") or {}).values()]
    return sum(len(str(value).encode("utf-8")) for value in values)


def _all_labels(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found = [("metadata.labels", doc.get("metadata", {}).get("labels") or {})]
    template = doc.get("spec", {}).get("template", {})
    found.append(
        ("spec.template.metadata.labels", template.get("metadata", {}).get("labels") or {})
    )
    return found


def container(
    launch: launching.Launch,
    spec: Mapping[str, Any],
    payload: kubernetes_owned.Payload,
    settings: config.Settings,
) -> dict[str, Any]:
    """The core/v1 Container that runs a normalised spec for `launch`: its image, command,
    environment, and the pod fields of a container (pods.container_fields: security
    context, resources with the defaults, envFrom, mounts); the database URL read from
    its Secret only where the settings hand jobs the database on purpose
    (database_secret), the attempt token from the launch's own Secret (attempt_secret),
    and where its `payload` is (a mounted one at PAYLOAD_MOUNT)."""
    container: dict[str, Any] = {
        "name": kube_client.CONTAINER,
        "image": spec["image"],
        "command": list(spec["command"]),
        "env": env_entries(launch, spec, payload, settings),
        # A failed container's last log lines become its termination message: corral
        # reads the last line as the failure's message, as it reads stderr for processes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    k8s = settings.executors.kubernetes
    container.update(pods.container_fields(spec, k8s, placement_class(spec, k8s, launch.name)))
    if payload.mounted:
        container["volumeMounts"] = [
            *container.get("volumeMounts", []),
            dict(kubernetes_owned.PAYLOAD_MOUNT),
        ]
    return container


def env_entries(
    launch: launching.Launch,
    spec: Mapping[str, Any],
    payload: kubernetes_owned.Payload,
    settings: config.Settings,
) -> list[dict[str, Any]]:
    """The container's environment: the spec's, the launch's and the payload's variables,
    then the database URL or the attempt token, each read from its Secret."""
    # corral's own variables win; no credential goes into a manifest in the clear.
    env: dict[str, Any] = {**spec.get("env", {}), **launch.env, **payload.env()}
    env.pop(DATABASE_URL, None)
    token = env.pop(kubernetes_owned.ATTEMPT_TOKEN, None)
    entries = [pods.env_entry(k, v) for k, v in sorted(env.items())]
    secret = database_secret(settings)
    if secret is not None and not token:  # a token in place of the database, never both
        name, _, key = secret.partition("/")
        entries.append(_from_secret(DATABASE_URL, name, key))
    if token:
        key = kubernetes_owned.ATTEMPT_TOKEN_KEY
        entries.append(_from_secret(kubernetes_owned.ATTEMPT_TOKEN, launch.name, key))
    return entries


def database_secret(settings: config.Settings) -> str | None:
    """The `name/key` of the Secret whose database URL a pod gets as CORRAL_DATABASE_URL:
    only when executors.kubernetes.database_url_secret is set and jobs_get_database_url is
    on, and never beside an api_url (jobs then use the API with their attempt token)."""
    if not settings.jobs_get_database_url or settings.api_url:
        return None
    return settings.executors.kubernetes.database_url_secret


def volumes_of(
    launch: launching.Launch, spec: Mapping[str, Any], payload: kubernetes_owned.Payload
) -> list[Any]:
    """The pod's volumes: the spec's, and the payload's ConfigMap when it is mounted."""
    volumes = [dict(v) for v in spec.get("volumes", [])]
    if payload.mounted:
        volumes.append(payload.volume(launch.name))
    return volumes


def _from_secret(variable: str, name: str, key: str) -> dict[str, Any]:
    """An env entry read from key `key` of Secret `name` (not optional: the pod waits)."""
    return {"name": variable, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}


def placement_class(
    spec: Mapping[str, Any], cluster: kubernetes_settings.KubernetesExecutorSettings, name: str
) -> kubernetes_settings.Placement | None:
    """The placement class a normalised spec names, or None when it names none.
    ExecutorError when the settings no longer hold it, so `name` cannot launch."""
    placement = spec.get("placement")
    if not placement:
        return None
    if placement not in cluster.placements:
        raise errors.ExecutorError(
            f"{name}: placement class {placement!r} is no longer in the settings"
            " (executors.kubernetes.placements); add it back or cancel the job"
        )
    return cluster.placements[placement]


def _placement(placement: kubernetes_settings.Placement) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if placement.node_selector:
        out["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        out["tolerations"] = [t.manifest() for t in placement.tolerations]
    if placement.priority_class:
        out["priorityClassName"] = placement.priority_class
    return out


def active_deadline(launch: launching.Launch, settings: config.Settings) -> int:
    """The whole seconds `launch` may run: what is left of its deadline, or the settings'
    attempt deadline for a launch that carries none."""
    deadline = launch.deadline_seconds
    if deadline is None:
        deadline = settings.timeouts.attempt_deadline.total_seconds()
    return whole_seconds(deadline)


def whole_seconds(seconds: float) -> int:
    """`seconds` rounded up to whole seconds, at least 1, as Kubernetes fields take them."""
    return max(1, math.ceil(seconds))
