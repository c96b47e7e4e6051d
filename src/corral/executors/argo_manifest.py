"""The `argo` executor's Workflows: each attempt is one Argo Workflow that runs one container.

This module turns a job's spec and an attempt's Launch into the exact Workflow corral
creates, and checks it before anything is sent: it must read back unchanged through
hera's models of the Argo Workflow (strict: an unknown field, or a value of the wrong
type, is an error) and keep the name and label rules the API server enforces (DNS-1123
names, the 63-character limit, label syntax).

The spec is the `kubernetes` executor's, with the same rules, and the Workflow runs on
the same cluster settings (`executors.kubernetes`: namespace, placement classes, service
account, TTL, termination grace, database Secret):

    spec = {
        "image": "ghcr.io/acme/etl:1.4",          # required
        "command": ["python", "-m", "etl"],        # required
        "env": {"LOG_LEVEL": "info"},              # optional
        "placement": "batch",                      # optional: a class from settings
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
        "service_account": "etl",                  # optional, default from settings
    }

The Workflow: one container template, `main`, as its entrypoint, running the same
container as a Job would (the CORRAL_* environment, the database URL and the attempt
token from Secrets);
`retryStrategy.limit: 0` on it (corral owns retries, whatever defaults the Argo
controller adds); `activeDeadlineSeconds` what is left of the attempt's deadline;
`ttlStrategy.secondsAfterCompletion` long enough to outlive a corral outage; `podGC` as
`executors.kubernetes.argo_pod_gc` says (OnPodCompletion by default: the outcome is read
from the Workflow, which stays, not from its pod); the attempt's labels on the Workflow
and its pod (full values of hashed ones in annotations); the placement class's node
selector, tolerations and priority class on the template; the pod's termination grace
through `podSpecPatch`, the one field Argo has for it; and the spec's pod fields
(pods.py: the restricted securityContext and default resources, volumes, pull secrets,
affinity, annotations, native sidecars as the template's init containers), in the
namespace the spec names.

The payload reaches the container as on a Job (kubernetes_owned.Payload): in CORRAL_PAYLOAD up
to 32 KiB, else in a ConfigMap named after the launch, owned by the Workflow (created
after it, made by a later launch of the name if a launch stopped in between), a volume of
the Workflow mounted read-only into the container, CORRAL_PAYLOAD_FILE naming its file.
The attempt token reaches it as on a Job too: from a Secret named after the launch, owned
by the Workflow, never in the Workflow in the clear.

A pod left running by a Workflow deleted without a propagation policy is found and
stopped by the reconciler's orphan sweep as a Job's is (`ClusterExecutor.list_strays`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pydantic
from hera.workflows import models as argo

from corral import config, errors, launching, model
from corral.executors import kubernetes_manifest, kubernetes_owned, kubernetes_settings, pods

API_VERSION = "argoproj.io/v1alpha1"
TEMPLATE = "main"
ARGO_LABEL_PREFIX = "workflows.argoproj.io/"
"""Argo's own labels on Workflows and their pods: a launch may not set them."""


def workflow(
    launch: launching.Launch, spec: Mapping[str, Any], settings: config.Settings
) -> dict[str, Any]:
    """The argoproj.io/v1alpha1 Workflow for `launch`, from its normalised spec."""
    k8s = settings.executors.kubernetes
    payload = kubernetes_owned.Payload.of(launch)
    pod = pods.pod_fields(spec, k8s, kubernetes_manifest.placement_class(spec, k8s, launch.name))
    made = argo.Workflow(
        api_version=API_VERSION,
        kind="Workflow",
        metadata=argo.ObjectMeta(
            name=launch.name,
            namespace=spec.get("namespace", k8s.namespace),
            labels=dict(launch.labels),
            annotations=dict(launch.annotations) or None,
        ),
        spec=_workflow_spec(launch, spec, settings, payload, pod),
    )
    return made.model_dump(by_alias=True, exclude_none=True, mode="json")


def _workflow_spec(
    launch: launching.Launch,
    spec: Mapping[str, Any],
    settings: config.Settings,
    payload: kubernetes_owned.Payload,
    pod: Mapping[str, Any],
) -> argo.WorkflowSpec:
    """The Workflow's spec: its one template, its pod's fields, its deadline and TTL, and
    the service account of its job's containers and of Argo's executor."""
    k8s = settings.executors.kubernetes
    volumes = kubernetes_manifest.volumes_of(launch, spec, payload)
    pull_secrets = pod.get("imagePullSecrets")
    account = spec.get("service_account", k8s.service_account)
    # The job's own containers get no API token unless its account is one of
    # token_accounts; Argo's executor (its init and wait containers) still gets one, of
    # the same account, to record the step's result (corral-pods, `corral deploy rbac`).
    own_token = account in k8s.token_accounts
    ttl = kubernetes_manifest.whole_seconds(k8s.ttl_after_finished.total_seconds())
    return argo.WorkflowSpec(
        entrypoint=TEMPLATE,
        templates=[_template(launch, spec, settings, payload, pod)],
        volumes=[argo.Volume.model_validate(v) for v in volumes] or None,
        pod_metadata=argo.Metadata(
            labels=dict(launch.labels), annotations=spec.get("annotations") or None
        ),
        security_context=argo.PodSecurityContext.model_validate(pod["securityContext"]),
        image_pull_secrets=[argo.LocalObjectReference.model_validate(s) for s in pull_secrets]
        if pull_secrets
        else None,
        pod_gc=_pod_gc(k8s),
        active_deadline_seconds=kubernetes_manifest.active_deadline(launch, settings),
        ttl_strategy=argo.TTLStrategy(seconds_after_completion=ttl),
        service_account_name=account,
        automount_service_account_token=None if own_token else False,
        executor=None
        if own_token
        else argo.ExecutorConfig(service_account_name=account or "default"),
    )


def _template(
    launch: launching.Launch,
    spec: Mapping[str, Any],
    settings: config.Settings,
    payload: kubernetes_owned.Payload,
    pod: Mapping[str, Any],
) -> argo.Template:
    """The Workflow's one template, `main`: the job's container as a Job runs it, its
    sidecars, and its placement class's node selector, tolerations and priority class."""
    k8s = settings.executors.kubernetes
    container = kubernetes_manifest.container(launch, spec, payload, settings)
    grace = kubernetes_manifest.whole_seconds(k8s.termination_grace.total_seconds())
    placement = (
        kubernetes_manifest.placement_class(spec, k8s, launch.name)
        or kubernetes_settings.Placement()
    )
    sidecars = [argo.UserContainer.model_validate(c) for c in pod.get("initContainers", [])]
    return argo.Template(
        name=TEMPLATE,
        container=argo.Container.model_validate(container),
        init_containers=sidecars or None,
        affinity=argo.Affinity.model_validate(pod["affinity"]) if "affinity" in pod else None,
        retry_strategy=argo.RetryStrategy(limit=argo.IntOrString(0)),
        pod_spec_patch=json.dumps({"terminationGracePeriodSeconds": grace}),
        node_selector=dict(placement.node_selector) or None,
        tolerations=[argo.Toleration(**t.manifest()) for t in placement.tolerations] or None,
        priority_class_name=placement.priority_class,
    )


def _pod_gc(k8s: kubernetes_settings.KubernetesExecutorSettings) -> argo.PodGC | None:
    """The Workflow's podGC: `argo_pod_gc`, each pod kept `argo_pod_gc_delay` after it ends
    so that corral reads its log into the run log first."""
    if k8s.argo_pod_gc == "Never":
        return None
    delay = kubernetes_manifest.whole_seconds(k8s.argo_pod_gc_delay.total_seconds())
    return argo.PodGC(strategy=k8s.argo_pod_gc, delete_delay_duration=f"{delay}s")


def check_workflow(doc: Mapping[str, Any]) -> None:
    """Raise InvalidInput unless `doc` is an Argo Workflow that hera's models read back
    unchanged (no unknown field, no value of another type) and that keeps the name and
    label rules of the API server."""
    given = dict(doc)
    if (given.get("apiVersion"), given.get("kind")) != (API_VERSION, "Workflow"):
        raise errors.InvalidInput(
            f"Workflow apiVersion/kind: must be {API_VERSION}/Workflow, not"
            f" {given.get('apiVersion')}/{given.get('kind')}"
        )
    try:
        read = argo.Workflow.model_validate(given, strict=True)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise errors.InvalidInput(
            f"Workflow {where}: {first['msg']} (Argo Workflow schema)"
        ) from None
    back = read.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if difference := _first_difference(given, back):
        where, problem = difference
        raise errors.InvalidInput(f"Workflow {where}: {problem} (Argo Workflow schema)")
    for problem in workflow_problems(doc):
        raise errors.InvalidInput(problem)


def workflow_problems(doc: Mapping[str, Any]) -> list[str]:
    """The name and label rules the API server and Argo enforce but the schema does not:
    the name is a DNS-1123 label (Argo puts it in a label on every pod), and the labels of
    the Workflow and of its pod are valid and none of Argo's own."""
    problems = kubernetes_manifest.manifest_problems(doc)  # the name, and the Workflow's labels
    places = {
        "metadata.labels": doc.get("metadata", {}).get("labels") or {},
        "spec.podMetadata.labels": doc.get("spec", {}).get("podMetadata", {}).get("labels") or {},
    }
    for key, value in places["spec.podMetadata.labels"].items():
        if problem := model.label_problem(str(key), str(value)):
            problems.append(f"Workflow spec.podMetadata.labels: {problem}")
    for where, labels in places.items():
        problems.extend(
            f"Workflow {where}: label key {key!r}: the prefix {ARGO_LABEL_PREFIX!r} is Argo's own"
            for key in labels
            if str(key).startswith(ARGO_LABEL_PREFIX)
        )
    return problems


def _first_difference(given: Any, back: Any, where: str = "") -> tuple[str, str] | None:
    """Where `given` and what the models read back from it first differ, and how."""
    if isinstance(given, Mapping) and isinstance(back, Mapping):
        for key, value in given.items():
            path = f"{where}.{key}" if where else str(key)
            if key not in back:
                return path, "unknown field"
            if found := _first_difference(value, back[key], path):
                return found
        return None
    if isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        for n, (value, again) in enumerate(zip(given, back, strict=True)):
            if found := _first_difference(value, again, f"{where}.{n}"):
                return found
        return None
    if given != back:
        return where, f"{given!r} reads back as {back!r}"
    return None
