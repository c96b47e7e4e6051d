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
are pods.py's.

The job's payload (`Payload`): none when it is null; its JSON in `CORRAL_PAYLOAD` when
that is at most PAYLOAD_ENV_BYTES (32 KiB) of UTF-8; else in a ConfigMap named after the
launch, with the Job's labels, mounted read-only at PAYLOAD_DIR, `CORRAL_PAYLOAD_FILE`
naming its file. The ConfigMap is created after the Job, owned by it (its uid, so that
it goes when the Job goes), and the pod waits in ContainerCreating until it exists. A
launch that stopped between the two (a crash, an API server that failed) is finished by
the next launch of the name: the Job's 409 counts as launched and the ConfigMap is made
(its own 409 counts as made), which recovery asks for before it adopts an attempt.

The attempt token (CORRAL_ATTEMPT_TOKEN, when corral has an `api_url`) is never in the
Job in the clear, where whoever may read Jobs would see it: it is in a Secret named after
the launch (`attempt_secret`), made after the Job and owned by it like the ConfigMap (a
launch cut short in between is finished the same way), and the container reads it with
`valueFrom.secretKeyRef`, not optional: the pod waits until the Secret exists.

The `argo` executor takes the same spec, checked by `normalise_spec`, and runs the same
container (`container`) under the same placement classes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import kubernetes_validate
import pydantic
from kubernetes.aio import client as kube

from corral import config, errors, launching, model
from corral.executors import base, kube_client, kubernetes_settings, pods, rbac, startup

log = logging.getLogger("corral.executors.kubernetes")

KIND = "kubernetes"
SUPPORTED_VERSIONS = pods.SUPPORTED_VERSIONS
"""The oldest and the newest Kubernetes version whose schemas every Job is checked against."""
CONTAINER = kube_client.CONTAINER
DATABASE_URL = "CORRAL_DATABASE_URL"
ATTEMPT_TOKEN = "CORRAL_ATTEMPT_TOKEN"
ATTEMPT_TOKEN_KEY = "token"
"""The attempt token's key in its Secret."""
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
"""The label the API server puts on a Job's pods: the Job's uid."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The label the API server puts on a Job's pods: the name of their Job."""
FOLLOW_SECONDS = 24 * 3600.0
"""The longest a followed pod log is read: it ends with its container, this only bounds
one that never does."""
FOLLOW_PAUSE = 0.5
"""How long a follow waits between two looks at a pod that has not started yet."""
CANCEL_TRIES = 5
"""Reads and deletes a cancel makes of a Job whose status keeps changing in between."""

PAYLOAD_ENV_BYTES = 32 * 1024
"""The largest payload (JSON, UTF-8 bytes) passed in CORRAL_PAYLOAD; larger ones go in a
ConfigMap. Well under what a process's environment holds (Linux: 128 KiB a variable)."""
CONFIG_MAP_BYTES = 1024 * 1024
"""The most a ConfigMap's data may hold (the API server's rule): the largest payload a
cluster launch carries."""
PAYLOAD_DIR = "/var/run/corral/payload"
"""Where a payload's ConfigMap is mounted in the container."""
PAYLOAD_KEY = "payload.json"
"""The payload's key in its ConfigMap: its file name under PAYLOAD_DIR."""
PAYLOAD_VOLUME = "corral-payload"
READ_ONLY = 0o444

_SPEC_FIELDS = (
    "image",
    "command",
    "env",
    "placement",
    "resources",
    "service_account",
    *pods.FIELDS,
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
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


class JobTemplate:
    """Specs and Job manifests for the `kubernetes` executor, under these settings."""

    kind = KIND

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self.k8s = settings.executors.kubernetes
        check_cluster_settings(self.k8s)

    # --- spec ------------------------------------------------------------------------------

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec, normalised; InvalidInput names the field and the rule."""
        normal = normalise_spec(spec, self.k8s, kind=KIND)
        # The whole Job this spec makes must pass the schemas: refuse it now, not at launch.
        check_manifest(self.manifest(placeholder_launch(normal), normal))
        return normal

    # --- the Job ---------------------------------------------------------------------------

    def manifest(self, launch: launching.Launch, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The batch/v1 Job for `launch`."""
        k8s = self.k8s
        payload = Payload.of(launch)
        placement = placement_class(spec, k8s, launch.name)
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": whole_seconds(k8s.termination_grace.total_seconds()),
            "containers": [container(launch, spec, payload, self.settings)],
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
        metadata: dict[str, Any] = {
            "name": launch.name,
            "namespace": spec.get("namespace", k8s.namespace),
            "labels": dict(launch.labels),
        }
        pod_metadata: dict[str, Any] = {"labels": dict(launch.labels)}
        if spec.get("annotations"):
            pod_metadata["annotations"] = dict(spec["annotations"])
        if launch.annotations:
            metadata["annotations"] = dict(launch.annotations)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": metadata,
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": active_deadline(launch, self.settings),
                "ttlSecondsAfterFinished": whole_seconds(k8s.ttl_after_finished.total_seconds()),
                # A pod lost with its node, or evicted, is replaced within the same attempt
                # (and Job): only once the old pod is gone, so two never run at once.
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                        }
                    ]
                },
                "podReplacementPolicy": "Failed",
                "template": {"metadata": pod_metadata, "spec": pod},
            },
        }


def dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> dict[str, Any]:
    """The Job the first attempt of `job` (already validated) would create, without a store
    or a cluster: its job id and fence are placeholders (0) until it is stored."""
    return JobTemplate(settings).manifest(kube_client.first_launch(job, settings, now), job.spec)


# --- the payload ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Payload:
    """How a launch's payload reaches its container: `text` is its JSON (None: a null
    payload, nothing to deliver), `size` its UTF-8 bytes. Up to PAYLOAD_ENV_BYTES it is the
    value of CORRAL_PAYLOAD; beyond, it is `mounted`: a ConfigMap's file, which
    CORRAL_PAYLOAD_FILE names."""

    text: str | None
    size: int

    @classmethod
    def of(cls, launch: launching.Launch) -> Payload:
        text = launching.payload_json(launch.payload)
        return cls(text, 0 if text is None else len(text.encode("utf-8")))

    @property
    def mounted(self) -> bool:
        return self.size > PAYLOAD_ENV_BYTES

    def env(self) -> dict[str, str]:
        """The variables that say where the payload is (none for a null payload)."""
        if self.text is None:
            return {}
        if self.mounted:
            return {"CORRAL_PAYLOAD_FILE": f"{PAYLOAD_DIR}/{PAYLOAD_KEY}"}
        return {"CORRAL_PAYLOAD": self.text}

    def volume(self, name: str) -> dict[str, Any]:
        """The pod's volume of the ConfigMap `name` (not optional: the pod waits for it)."""
        return {"name": PAYLOAD_VOLUME, "configMap": {"name": name, "defaultMode": READ_ONLY}}

    def check_size(self, doing: str) -> None:
        """LaunchRefused when no ConfigMap can hold the payload (max_payload_bytes was set
        above CONFIG_MAP_BYTES): before anything is created, so nothing is left half-made."""
        if self.size > CONFIG_MAP_BYTES:
            raise errors.LaunchRefused(
                f"{doing}: its payload is {self.size} bytes of JSON, more than a ConfigMap"
                f" holds ({CONFIG_MAP_BYTES}); keep max_payload_bytes at most that for jobs on"
                " a cluster, or pass a reference to the data instead"
            )


PAYLOAD_MOUNT = {"name": PAYLOAD_VOLUME, "mountPath": PAYLOAD_DIR, "readOnly": True}
"""Where the container sees a mounted payload."""


def owner_reference(api_version: str, kind: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """A reference to `owner` (an object as the API server returned it, uid and all) that
    makes its dependent go when it goes, and, deleted in the foreground, go first."""
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": False,
        "blockOwnerDeletion": True,
    }


def payload_config_map(
    launch: launching.Launch, payload: Payload, *, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any]:
    """The v1 ConfigMap that holds a payload too large for the environment: named after the
    launch, with its labels, immutable, and owned by `owner` (an owner_reference)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _owned_metadata(launch, namespace, owner),
        "immutable": True,
        "data": {PAYLOAD_KEY: payload.text or "null"},  # held only when past the env's limit
    }


def attempt_secret(
    launch: launching.Launch, *, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The v1 Secret that holds `launch`'s attempt token (None when it has none): named
    after the launch, with its labels, immutable, and owned by `owner` (an owner_reference)."""
    token = launch.env.get(ATTEMPT_TOKEN)
    if not token:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _owned_metadata(launch, namespace, owner),
        "type": "Opaque",
        "immutable": True,
        "stringData": {ATTEMPT_TOKEN_KEY: token},
    }


def owned_objects(
    launch: launching.Launch, payload: Payload, *, namespace: str, owner: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """What a launch makes after its Job or Workflow, owned by it: the ConfigMap of a
    payload too large for the environment, and the Secret of its attempt token."""
    made = []
    if payload.mounted:
        made.append(payload_config_map(launch, payload, namespace=namespace, owner=owner))
    if (secret := attempt_secret(launch, namespace=namespace, owner=owner)) is not None:
        made.append(secret)
    return made


def _owned_metadata(
    launch: launching.Launch, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": launch.name,
        "namespace": namespace,
        "labels": dict(launch.labels),
        "ownerReferences": [dict(owner)],
    }
    if launch.annotations:
        metadata["annotations"] = dict(launch.annotations)
    return metadata


def placeholder_launch(spec: Mapping[str, Any], *, kind: str = KIND) -> launching.Launch:
    """The Launch of a job not stored yet, with this spec and nothing else: for checks."""
    draft = model.NewJob(executor=kind, spec=spec)
    return launching.build_launch(
        model.first_claim(draft, _EPOCH), reach=launching.Reach(), deadline_seconds=None
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- the spec -------------------------------------------------------------------------------------


def normalise_spec(
    spec: Mapping[str, Any], cluster: kubernetes_settings.KubernetesExecutorSettings, *, kind: str
) -> dict[str, Any]:
    """A container spec (image, command, env, placement, resources, service_account),
    normalised under these cluster settings; InvalidInput names the `kind` of executor,
    the field and the rule. It checks the fields only, not the object they make."""
    try:
        return _normalise(spec, cluster)
    except pods.Refused as exc:
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
    except pods.Refused as exc:
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
    except pods.Refused as exc:
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
    """The name, label and size rules Kubernetes' API server enforces but its schemas do not."""
    problems = []
    kind = doc.get("kind", "manifest")
    if kind == "ConfigMap" and (size := _data_size(doc)) > CONFIG_MAP_BYTES:
        problems.append(f"ConfigMap data: {size} bytes, more than {CONFIG_MAP_BYTES} allowed")
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


# --- parts ---------------------------------------------------------------------------------------


def container(
    launch: launching.Launch, spec: Mapping[str, Any], payload: Payload, settings: config.Settings
) -> dict[str, Any]:
    """The core/v1 Container that runs a normalised spec for `launch`: its image, command,
    environment, and the pod fields of a container (pods.container_fields: security
    context, resources with the defaults, envFrom, mounts); the database URL read from
    its Secret only where the settings hand jobs the database on purpose
    (database_secret), the attempt token from the launch's own Secret (attempt_secret),
    and where its `payload` is (a mounted one at PAYLOAD_MOUNT)."""
    # corral's own variables win; no credential goes into a manifest in the clear.
    env: dict[str, Any] = {**spec.get("env", {}), **launch.env, **payload.env()}
    env.pop(DATABASE_URL, None)
    token = env.pop(ATTEMPT_TOKEN, None)
    entries = [pods.env_entry(k, v) for k, v in sorted(env.items())]
    secret = database_secret(settings)
    if secret is not None and not token:  # a token in place of the database, never both
        name, _, key = secret.partition("/")
        entries.append(_from_secret(DATABASE_URL, name, key))
    if token:
        entries.append(_from_secret(ATTEMPT_TOKEN, launch.name, ATTEMPT_TOKEN_KEY))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec["image"],
        "command": list(spec["command"]),
        "env": entries,
        # A failed container's last log lines become its termination message: corral
        # reads the last line as the failure's message, as it reads stderr for processes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    k8s = settings.executors.kubernetes
    container.update(pods.container_fields(spec, k8s, placement_class(spec, k8s, launch.name)))
    if payload.mounted:
        container["volumeMounts"] = [*container.get("volumeMounts", []), dict(PAYLOAD_MOUNT)]
    return container


def database_secret(settings: config.Settings) -> str | None:
    """The `name/key` of the Secret whose database URL a pod gets as CORRAL_DATABASE_URL:
    only when executors.kubernetes.database_url_secret is set and jobs_get_database_url is
    on, and never beside an api_url (jobs then use the API with their attempt token)."""
    if not settings.jobs_get_database_url or settings.api_url:
        return None
    return settings.executors.kubernetes.database_url_secret


def volumes_of(launch: launching.Launch, spec: Mapping[str, Any], payload: Payload) -> list[Any]:
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


def _bad(field: str, rule: str) -> pods.Refused:
    return pods.Refused(field, rule)


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
    """Refused (the setting named) unless each of `ceiling`'s names is a resource and
    each amount a quantity."""
    for name, amount in ceiling.items():
        if not _RESOURCE_NAME.match(name):
            raise _bad(MAX_RESOURCES, f"{name!r} is not a resource name")
        if not _QUANTITY.match(amount):
            raise _bad(f"{MAX_RESOURCES}.{name}", f"{amount!r} is not a quantity (e.g. 8, 32Gi)")


def _within_ceiling(
    resources: Mapping[str, Mapping[str, str]], ceiling: Mapping[str, str], field: str
) -> None:
    """Refused when a request or a limit asks more of a resource than the ceiling
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


# --- the executor -------------------------------------------------------------------------------

_FINAL = ("Complete", "Failed")

RULES = rbac.Rules(
    corral=(
        rbac.Rule(
            "batch",
            "jobs",
            ("create", "get", "list", "watch", "delete", "patch"),
            "a Job an attempt: created, read, listed and watched for finishes, deleted to"
            " cancel; patched once with the installation's label, when an earlier corral made"
            " it without",
        ),
        rbac.Rule(
            "",
            "pods",
            ("list", "delete", "patch"),
            "a Job's pods: why one waits to start, and how a finished one ended (exit code,"
            " reason, a disruption); delete: a pod left running by a Job deleted without a"
            " propagation policy; patch: the installation's"
            " label, as for its Job",
        ),
        rbac.Rule(
            "",
            "pods/log",
            ("get",),
            "a pod's log: a finished one's last lines, kept in the attempt's run log, and a"
            " running one's, followed by `corral jobs logs --follow`",
        ),
        rbac.Rule(
            "",
            "events",
            ("list",),
            "a Job's FailedCreate events: the message of an admission webhook or a quota that"
            " refused its pod",
        ),
        *kube_client.OWNED_RULES,
        rbac.Rule(
            "batch",
            "jobs/finalizers",
            ("update",),
            "the owner references of a Job's ConfigMap and Secret set blockOwnerDeletion,"
            " which the OwnerReferencesPermissionEnforcement admission plugin allows only to"
            " whoever may update the owner's finalizers",
        ),
    )
)
"""The API calls this executor makes (`corral deploy rbac`)."""


class KubernetesExecutor(kube_client.ClusterExecutor):
    """Runs each attempt as one batch/v1 Job, and reads its outcome back from the Job's
    conditions and its pod. Its only truth is the API server: corral keeps no copy."""

    kind = KIND
    objects = "Jobs"
    make_template = JobTemplate
    pod_label = JOB_NAME_LABEL

    def _bind(self, api_client: kube.ApiClient) -> None:
        self._batch = kube.BatchV1Api(api_client)

    # --- the protocol --------------------------------------------------------------------

    async def launch(self, launch: launching.Launch) -> None:
        """Create the Job `launch.name`, then, owned by the Job, the ConfigMap of a payload
        too large for the environment and the Secret of the attempt token. A Job of that
        name that carries this attempt's identity and is not being deleted counts as
        launched (a create whose answer was lost, then tried again, or a launch stopped
        before its ConfigMap or Secret, which this one makes); any other raises
        LaunchConflict. Every object is named with the name prefix and carries the
        installation's label (`on_cluster`)."""
        launch = self.on_cluster(launch)
        namespace = self.namespace_of(launch)
        doing = f"creating Job {namespace}/{launch.name}"
        payload = Payload.of(launch)
        payload.check_size(doing)
        # The spec was checked at submit; a placement class removed from the settings
        # since then is the manifest's ExecutorError ("add it back or cancel the job").
        manifest = self.template.manifest(launch, launch.spec)
        try:
            body = kube.V1Job.from_dict(manifest)
        except pydantic.ValidationError as exc:
            raise errors.LaunchRefused(f"{doing}: not a valid Job: {exc}") from None
        if body is None:
            raise errors.LaunchRefused(f"{doing}: empty manifest")
        job = await self.create_once(
            launch,
            lambda: self._batch.create_namespaced_job_without_preload_content(
                namespace, body, _request_timeout=self.api.timeout
            ),
        )
        # After the Job, whose uid owns them; its pod waits for them.
        owner = owner_reference("batch/v1", "Job", job)
        for owned in owned_objects(launch, payload, namespace=namespace, owner=owner):
            await self.create_owned(launch, owned)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """A fresh list of corral's Jobs in each namespace that may hold one of `names`
        (one request a page, not a read per Job), and, for a Job that has finished or
        waits to start, its pods: from one list of corral's pods in its namespace, made
        only when one of the Jobs asked for needs them (a Job none of whose pods that list
        holds, one made since, say, has its own read)."""
        wanted = {self.platform_name(name) for name in names}
        pods: dict[str, list[dict[str, Any]]] = {}

        async def list_in(namespace: str) -> kube_client.Listing:
            listing = await self._list_in(namespace)
            if any(_may_need_pods(job) for job in listing.items if _name(job) in wanted):
                pods.update(await self._pods_by_job(namespace))
            return listing

        async def observation(job: dict[str, Any]) -> launching.Observation:
            return await self._observation(job, pods.get(job["metadata"].get("uid", "")))

        return await self.observe_listed(names, list_in, observation)

    async def _list_in(self, namespace: str, selector: str | None = None) -> kube_client.Listing:
        return await self.api.list_all(
            "Jobs",
            self._batch.list_namespaced_job,
            selector=selector or self.managed,
            namespace=namespace,
        )

    async def _label(self, name: str, namespace: str, change: Any) -> dict[str, Any] | None:
        return await self.api.call(
            f"labelling Job {namespace}/{name}",
            lambda: self._batch.patch_namespaced_job_without_preload_content(
                name,
                namespace,
                change,
                _content_type=kube_client.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_client.is_status(exc, 404),
        )

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Every Job in the namespace whose labels include all of `selector` (in pages),
        with one list of corral's pods for the exit codes of the failed ones."""
        listing = await self.api.list_all(
            "Jobs",
            self._batch.list_namespaced_job,
            selector=self.selector(selector),
            namespace=self.namespace,
        )
        finished = any(_finished(job) for job in listing.items)
        pods = await self._pods_by_job(self.namespace) if finished else {}
        return [
            self.named(job_observation(job, pods.get(job.get("metadata", {}).get("uid", ""), [])))
            for job in listing.items
        ]

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Delete the Job with `propagationPolicy: Background`, so its pods are deleted too
        (never orphaned); `grace` is the Job's deletion grace. Each pod then gets SIGTERM,
        and SIGKILL after its own terminationGracePeriodSeconds
        (`executors.kubernetes.termination_grace`). A Job already gone is fine, and one
        that has finished is left as it is: it is the record of the attempt's result, and
        its TTL removes it. The delete carries the resourceVersion that was read as its
        precondition, so a Job that finishes in between is refused (409) and read again."""
        await self._cancel(self.platform_name(name), grace)

    async def _cancel(self, name: str, grace: timedelta) -> None:
        """`cancel` of the Job `name` (its name on the cluster)."""
        seconds = max(0, math.ceil(grace.total_seconds()))
        for _ in range(CANCEL_TRIES):
            job = await self._get(name)
            if job is None or _finished(job) or self.foreign(job):
                return
            if await self._delete(job, seconds):
                return
        raise errors.ExecutorError(
            f"deleting Job {self.namespace}/{name}: it changed under each of {CANCEL_TRIES} tries"
        )

    async def _delete(self, job: Mapping[str, Any], grace_seconds: int) -> bool:
        """Delete the Job (in its namespace) if it is still at the resourceVersion read;
        False when it is not (409) or already gone (404), so the caller reads it again."""
        meta = job["metadata"]
        name, namespace = meta["name"], meta.get("namespace") or self.namespace
        options = kube.V1DeleteOptions(
            propagation_policy="Background",
            grace_period_seconds=grace_seconds,
            preconditions=kube.V1Preconditions(resource_version=meta["resourceVersion"]),
        )
        answer = await self.api.call(
            f"deleting Job {namespace}/{name}",
            lambda: self._batch.delete_namespaced_job_without_preload_content(
                name, namespace, body=options, _request_timeout=self.api.timeout
            ),
            ok=lambda exc: kube_client.is_status(exc, 404, 409),
        )
        return answer is not None

    def _owner_uids(self, pod: Mapping[str, Any]) -> set[str]:
        """Its owner references' uids and its controller-uid label's, which stays on a pod
        whose Job was deleted with `--cascade=orphan`."""
        uids = super()._owner_uids(pod)
        if uid := kube_client.labels_of(pod).get(CONTROLLER_UID):
            uids.add(uid)
        return uids

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Each Job's finish, once, as the watch sees it. Jobs that had finished before the
        first list are left to recovery; a relist after 410 Gone yields the finishes the
        stream missed. Polling (`observe`) covers whatever a broken watch still misses."""
        async for job in kube_client.finishes(
            self.api.changes(
                "Jobs",
                self._batch.list_namespaced_job,
                selector=self.managed,
                closed=self._closed,
                namespace=self.namespace,
            ),
            finished=_finished,
        ):
            yield self.named(await self._observation(job))

    # --- reading -------------------------------------------------------------------------

    async def _get(self, name: str) -> dict[str, Any] | None:
        for namespace in self.namespaces_for(name):
            if (job := await self._read(name, namespace)) is not None:
                return job
        return None

    async def _read(self, name: str, namespace: str) -> dict[str, Any] | None:
        job = await self.api.call(
            f"reading Job {namespace}/{name}",
            lambda: self._batch.read_namespaced_job_without_preload_content(
                name, namespace, _request_timeout=self.api.timeout
            ),
            ok=lambda exc: kube_client.is_status(exc, 404),
        )
        return job

    async def _pods(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The Job's pods, by its uid (a namesake Job's are not its own)."""
        uid = job["metadata"].get("uid", "")
        namespace = job["metadata"].get("namespace") or self.namespace
        return await self._pods_in(namespace, f"{CONTROLLER_UID}={uid}")

    async def _pods_by_job(self, namespace: str) -> dict[str, list[dict[str, Any]]]:
        """corral's pods in `namespace` (one list, in pages), by the uid of their Job."""
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in await self._pods_in(namespace, self.managed):
            by_job.setdefault(kube_client.labels_of(pod).get(CONTROLLER_UID, ""), []).append(pod)
        return by_job

    async def _events(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The Job's events (what its controller reports, FailedCreate among them); none
        when the Role does not let corral list events (then a pod never made says only
        that no pod was made)."""
        meta = job["metadata"]
        namespace = meta.get("namespace") or self.namespace
        result = await self.api.call(
            f"listing the events of Job {namespace}/{meta.get('name')}",
            lambda: self._core.list_namespaced_event_without_preload_content(
                namespace,
                field_selector=f"involvedObject.uid={meta.get('uid', '')}",
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_client.is_status(exc, 403, 404),
        )
        return kube_client.items(result)

    async def _observation(
        self, job: Mapping[str, Any], listed: list[dict[str, Any]] | None = None
    ) -> launching.Observation:
        """What the Job says; for one that waits to start, why, and past the pod start
        timeout its end (the Job is deleted, so that its pod cannot start later beside
        the next attempt's). `listed`: its pods, when a list of them was made (none there:
        they are read)."""
        if not _needs_pods(job):
            return job_observation(job, [])
        pods = listed or await self._pods(job)
        if _finished(job):
            obs = job_observation(job, pods)
            return dataclasses.replace(
                obs, output=await self.run_log(logged_pod(pods), obs.message)
            )
        if _decided(job):  # its pods ran and are ending, or gone: it is not waiting to start
            return job_observation(job, pods)
        why = startup.waiting(pods)
        if why is None:
            return job_observation(job, pods)
        if why.reason == startup.NO_POD:
            why = startup.refused(await self._events(job)) or why
        meta = job["metadata"]
        obs = startup.observation(
            str(meta.get("name", "")),
            kube_client.labels_of(job),
            why,
            since=startup.since(pods) or kube_client.timestamp(meta.get("creationTimestamp")),
            now=self._clock.now(),
            limit=startup.limit(
                self.start_timeout,
                (job.get("spec") or {}).get("activeDeadlineSeconds"),
                self.margin,
            ),
        )
        if obs.phase is launching.Phase.FAILED:
            log.info("%s: %s; deleting its Job", obs.name, obs.reason)
            await self._cancel(obs.name, timedelta(0))  # read again if it changed meanwhile
        return obs

    async def follow_log(self, name: str) -> AsyncGenerator[bytes, None]:
        """The log of the Job `name`'s pod as it is written (its last LOG_LINES lines
        first), until the pod's container ends: the pod is waited for while it has not
        started, and nothing comes of a Job that is gone or ended before one did."""
        name = self.platform_name(name)
        while (job := await self._get(name)) is not None and not self.foreign(job):
            pod = logged_pod([p for p in await self._pods(job) if _started(p)])
            if pod is not None:
                async for chunk in self._follow_pod(pod):
                    yield chunk
                return
            if _finished(job):
                return
            await self._clock.sleep(FOLLOW_PAUSE)

    async def _follow_pod(self, pod: Mapping[str, Any]) -> AsyncGenerator[bytes, None]:
        meta = pod.get("metadata") or {}
        name, namespace = str(meta.get("name")), meta.get("namespace") or self.namespace
        response = await self._core.read_namespaced_pod_log_without_preload_content(
            name,
            namespace,
            container=CONTAINER,
            follow=True,
            tail_lines=kube_client.LOG_LINES,
            _request_timeout=FOLLOW_SECONDS,
        )
        try:
            if response.status >= 400:  # gone, or not started after all: nothing to follow
                log.info("following the log of pod %s/%s: %s", namespace, name, response.status)
                return
            async for chunk in response.content.iter_any():
                yield chunk
        finally:
            response.release()


def job_observation(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> launching.Observation:
    """What a Job (and, when it finished, its pods) says of its attempt.

    Success is the `Complete` condition, from a pod that succeeded undisturbed: one with
    a DisruptionTarget condition (evicted, preempted, its node drained: it trapped
    SIGTERM and exited 0), or gone by then (deleted before its Job counted it), is not
    trusted, and fails transient. `Failed` reads the pod that failed last for the exit
    code, the termination reason (OOMKilled, Error...) and the last line of its
    termination message; DeadlineExceeded, pod disruptions (a node lost, an eviction)
    and a pod deleted under its Job (`kubectl delete pod`) are transient. Any number of
    pods is still one attempt. Until `Complete` or `Failed` the attempt has not ended, even
    once the Job's end is decided (SuccessCriteriaMet, FailureTarget): its pods may still
    run. It is RUNNING while a pod is ready, or Running though terminating (no longer
    counted ready, but running on in its grace)."""
    meta, status = job.get("metadata", {}), job.get("status") or {}
    name, labels = str(meta.get("name", "")), kube_client.labels_of(job)
    started = kube_client.timestamp(status.get("startTime"))
    complete, failed = _condition(job, "Complete"), _condition(job, "Failed")
    if complete is not None:
        completed = kube_client.timestamp(
            status.get("completionTime") or complete.get("lastTransitionTime")
        )
        if (doubt := _untrusted(job, pods)) is not None:
            return launching.Observation(
                name=name,
                phase=launching.Phase.FAILED,
                labels=labels,
                reason=f"success not trusted: {doubt}",
                started_at=started,
                finished_at=completed,
                failure_class=_TRANSIENT,
            )
        return launching.Observation(
            name=name,
            phase=launching.Phase.SUCCEEDED,
            labels=labels,
            exit_code=0,
            started_at=started,
            finished_at=completed,
        )
    if failed is None:
        running = int(status.get("ready") or 0) > 0 or any(
            (pod.get("status") or {}).get("phase") == "Running" for pod in pods
        )
        return launching.Observation(
            name=name,
            phase=launching.Phase.RUNNING if running else launching.Phase.PENDING,
            labels=labels,
            started_at=started,
        )
    why = str(failed.get("reason") or "Failed")
    pod = _last_failed(pods)
    terminated = _terminated(pod)
    exit_code = terminated.get("exitCode") if terminated else None
    message = kube_client.last_line(terminated.get("message")) if terminated else None
    verdict: model.FailureClass | None = None
    if why == "DeadlineExceeded":
        reason, verdict = "deadline exceeded: the Job ran past activeDeadlineSeconds", _TRANSIENT
    elif pod is not None and (disruption := _condition(pod, "DisruptionTarget")) is not None:
        reason = f"pod disrupted: {disruption.get('reason') or 'DisruptionTarget'}"
        verdict = _TRANSIENT
    elif pod is not None and pod.get("metadata", {}).get("deletionTimestamp"):
        reason = f"pod deleted: it ended {terminated.get('reason') or 'Error'} on SIGTERM"
        verdict = _TRANSIENT
    elif terminated:
        reason = str(terminated.get("reason") or "Error")
    elif pod is None:
        # A failed pod stays while its Job does: one gone was deleted (`kubectl delete
        # pod`, a drain), ended by that, and its own exit code is lost.
        reason, verdict = f"Job failed ({why}); its pod is gone, so no exit code", _TRANSIENT
    else:
        reason = f"Job failed ({why}): {pod.get('status', {}).get('reason') or 'pod failed'}"
    return launching.Observation(
        name=name,
        phase=launching.Phase.FAILED,
        labels=labels,
        exit_code=int(exit_code) if exit_code is not None else None,
        reason=reason,
        started_at=started,
        finished_at=kube_client.timestamp(failed.get("lastTransitionTime")),
        failure_class=verdict,
        message=message,
    )


_TRANSIENT = model.FailureClass.TRANSIENT


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cast(Mapping[str, Any], cond)
    return None


def _untrusted(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a Complete Job's success is not to be trusted, or None: its succeeded pod
    was disrupted, or is gone (a pod that ends on its own stays as long as its Job, so one
    gone was deleted, evicted or preempted, and its Job counted it as it went). The cost:
    a success read only after the pod garbage collector removed its pod (a cluster with a
    low terminated-pod-gc-threshold, read late by recovery) is run again."""
    phases = [(p, (p.get("status") or {}).get("phase")) for p in pods]
    for pod, phase in phases:
        if phase != "Succeeded":
            continue
        if (disruption := _condition(pod, "DisruptionTarget")) is not None:
            why = disruption.get("reason") or "DisruptionTarget"
            return f"its pod exited 0 after a disruption ({why})"
        if pod.get("metadata", {}).get("deletionTimestamp"):
            return "its pod exited 0 while being deleted"
    if all(phase == "Failed" for _, phase in phases) and not job.get("metadata", {}).get(
        "deletionTimestamp"
    ):
        return "its pod was deleted (evicted, preempted, drained) before its Job counted it"
    return None


def _started(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's main container has started (so it has a log to follow)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return bool(set(status.get("state") or {}) & {"running", "terminated"})
    return False


def logged_pod(found: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod whose log is the attempt's: the one that succeeded, else the last failed."""
    done = [p for p in found if (p.get("status") or {}).get("phase") == "Succeeded"]
    return done[-1] if done else _last_failed(found)


def _decided(job: Mapping[str, Any]) -> bool:
    """Whether the Job's end is decided (FailureTarget, SuccessCriteriaMet) while its pods
    end: Complete or Failed follows once none runs."""
    return any(_condition(job, kind) is not None for kind in _DECIDED)


_DECIDED = ("FailureTarget", "SuccessCriteriaMet")


def _needs_pods(job: Mapping[str, Any]) -> bool:
    """Whether what a Job says needs its pods read: it has finished (how its pod ended), or
    none of its pods is ready (why it waits to start)."""
    return _finished(job) or int((job.get("status") or {}).get("ready") or 0) == 0


def _may_need_pods(job: Mapping[str, Any]) -> bool:
    """`_needs_pods`, False for a malformed Job (its own observation says it is unknown)."""
    try:
        return _needs_pods(job)
    except (AttributeError, TypeError, ValueError):
        return False


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _finished(job: Mapping[str, Any]) -> bool:
    return any(_condition(job, kind) is not None for kind in _FINAL)


def _last_failed(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    failed.sort(key=lambda p: str(p.get("metadata", {}).get("creationTimestamp") or ""))
    return failed[-1] if failed else (pods[-1] if pods else None)


def _terminated(pod: Mapping[str, Any] | None) -> dict[str, Any]:
    if pod is None:
        return {}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return dict((status.get("state") or {}).get("terminated") or {})
    return {}
