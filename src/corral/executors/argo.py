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

The payload reaches the container as on a Job (kubernetes.Payload): in CORRAL_PAYLOAD up
to 32 KiB, else in a ConfigMap named after the launch, owned by the Workflow (created
after it, made by a later launch of the name if a launch stopped in between), a volume of
the Workflow mounted read-only into the container, CORRAL_PAYLOAD_FILE naming its file.
The attempt token reaches it as on a Job too: from a Secret named after the launch, owned
by the Workflow, never in the Workflow in the clear.

A pod left running by a Workflow deleted without a propagation policy is found and
stopped by the reconciler's orphan sweep as a Job's is (`ClusterExecutor.list_strays`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import pydantic
from hera.workflows import models as argo
from kubernetes.aio import client as kube

from corral import config, errors, launching, model
from corral.executors import kube_client, kubernetes, kubernetes_settings, pods, rbac, startup

log = logging.getLogger("corral.executors.argo")

KIND = "argo"
API_VERSION = "argoproj.io/v1alpha1"
TEMPLATE = "main"
ARGO_LABEL_PREFIX = "workflows.argoproj.io/"
"""Argo's own labels on Workflows and their pods: a launch may not set them."""


class WorkflowTemplate:
    """Specs and Workflow manifests for the `argo` executor, under these settings."""

    kind = KIND

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self.k8s = settings.executors.kubernetes
        kubernetes.check_cluster_settings(self.k8s)

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec, normalised; InvalidInput names the field and the rule."""
        normal = kubernetes.normalise_spec(spec, self.k8s, kind=KIND)
        # The whole Workflow this spec makes must pass the checks: refuse it now, not at launch.
        check_workflow(self.manifest(kubernetes.placeholder_launch(normal, kind=KIND), normal))
        return normal

    def manifest(self, launch: launching.Launch, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The argoproj.io/v1alpha1 Workflow for `launch`."""
        k8s = self.k8s
        payload = kubernetes.Payload.of(launch)
        volumes = kubernetes.volumes_of(launch, spec, payload)
        pod = pods.pod_fields(spec, k8s, kubernetes.placement_class(spec, k8s, launch.name))
        pull_secrets = pod.get("imagePullSecrets")
        account = spec.get("service_account", k8s.service_account)
        # The job's own containers get no API token unless its account is one of
        # token_accounts; Argo's executor (its init and wait containers) still gets one, of
        # the same account, to record the step's result (corral-pods, `corral deploy rbac`).
        own_token = account in k8s.token_accounts
        workflow = argo.Workflow(
            api_version=API_VERSION,
            kind="Workflow",
            metadata=argo.ObjectMeta(
                name=launch.name,
                namespace=spec.get("namespace", k8s.namespace),
                labels=dict(launch.labels),
                annotations=dict(launch.annotations) or None,
            ),
            spec=argo.WorkflowSpec(
                entrypoint=TEMPLATE,
                templates=[self._template(launch, spec, payload, pod)],
                volumes=[argo.Volume.model_validate(v) for v in volumes] or None,
                pod_metadata=argo.Metadata(
                    labels=dict(launch.labels), annotations=spec.get("annotations") or None
                ),
                security_context=argo.PodSecurityContext.model_validate(pod["securityContext"]),
                image_pull_secrets=[
                    argo.LocalObjectReference.model_validate(s) for s in pull_secrets
                ]
                if pull_secrets
                else None,
                pod_gc=_pod_gc(k8s),
                active_deadline_seconds=kubernetes.active_deadline(launch, self.settings),
                ttl_strategy=argo.TTLStrategy(
                    seconds_after_completion=kubernetes.whole_seconds(
                        k8s.ttl_after_finished.total_seconds()
                    )
                ),
                service_account_name=account,
                automount_service_account_token=None if own_token else False,
                executor=None
                if own_token
                else argo.ExecutorConfig(service_account_name=account or "default"),
            ),
        )
        return workflow.model_dump(by_alias=True, exclude_none=True, mode="json")

    def _template(
        self,
        launch: launching.Launch,
        spec: Mapping[str, Any],
        payload: kubernetes.Payload,
        pod: Mapping[str, Any],
    ) -> argo.Template:
        k8s = self.k8s
        container = kubernetes.container(launch, spec, payload, self.settings)
        grace = kubernetes.whole_seconds(k8s.termination_grace.total_seconds())
        placement = (
            kubernetes.placement_class(spec, k8s, launch.name) or kubernetes_settings.Placement()
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
    delay = kubernetes.whole_seconds(k8s.argo_pod_gc_delay.total_seconds())
    return argo.PodGC(strategy=k8s.argo_pod_gc, delete_delay_duration=f"{delay}s")


def dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> dict[str, Any]:
    """The Workflow the first attempt of `job` (already validated) would create, without a
    store or a cluster: its job id and fence are placeholders (0) until it is stored."""
    return WorkflowTemplate(settings).manifest(
        kube_client.first_launch(job, settings, now), job.spec
    )


# --- checks ---------------------------------------------------------------------------------------


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
    problems = kubernetes.manifest_problems(doc)  # the name, and the Workflow's labels
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


# --- the executor -------------------------------------------------------------------------------

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "workflows"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
"""The label Argo's controller puts on a Workflow's pods: the Workflow's name."""
_PHASES = {
    "": launching.Phase.PENDING,
    "Pending": launching.Phase.PENDING,
    "Running": launching.Phase.RUNNING,
    "Succeeded": launching.Phase.SUCCEEDED,
    "Failed": launching.Phase.FAILED,
    "Error": launching.Phase.FAILED,
}


RULES = rbac.Rules(
    corral=(
        rbac.Rule(
            "argoproj.io",
            "workflows",
            ("create", "get", "list", "watch", "patch"),
            "a Workflow an attempt: created, read, listed and watched for finishes, patched"
            " with spec.shutdown to cancel, or with the installation's label when an earlier"
            " corral made it without",
        ),
        rbac.Rule(
            "",
            "pods",
            ("list", "delete", "patch"),
            "a Workflow's pods: delete one left running by a Workflow deleted without a"
            " propagation policy; patch: the installation's"
            " label, as for its Workflow; list: a finished Workflow's pod, for its log",
        ),
        rbac.Rule(
            "",
            "pods/log",
            ("get",),
            "a finished Workflow's pod's log, kept in the attempt's run log while podGC has"
            " not deleted the pod yet (argo_pod_gc_delay)",
        ),
        *kube_client.OWNED_RULES,
        rbac.Rule(
            "argoproj.io",
            "workflows/finalizers",
            ("update",),
            "blockOwnerDeletion on a Workflow's ConfigMap and Secret (as for a Job's)",
        ),
    ),
    pods=(
        rbac.Rule(
            "argoproj.io",
            "workflowtaskresults",
            ("create", "patch"),
            "Argo's executor in each Workflow pod records the step's outputs and exit code",
        ),
    ),
)
"""The API calls this executor and its Workflows' pods make (`corral deploy rbac`)."""


class ArgoExecutor(kube_client.ClusterExecutor):
    """Runs each attempt as one Argo Workflow, submitted through the Kubernetes API
    (custom objects), and reads its outcome from `status.phase` and its pod node."""

    kind = KIND
    objects = "Workflows"
    make_template = WorkflowTemplate
    pod_label = WORKFLOW_LABEL

    def _bind(self, api_client: kube.ApiClient) -> None:
        self._custom = kube.CustomObjectsApi(api_client)

    def _scope(self, namespace: str | None = None) -> dict[str, Any]:
        return {
            "group": GROUP,
            "version": VERSION,
            "namespace": namespace or self.namespace,
            "plural": PLURAL,
        }

    async def launch(self, launch: launching.Launch) -> None:
        """Create the Workflow `launch.name`, then, owned by it, the ConfigMap of a payload
        too large for the environment and the Secret of the attempt token; the same rules
        for an existing name as the kubernetes executor's (this attempt's and not being
        deleted: launched), and the same names and labels (`on_cluster`)."""
        launch = self.on_cluster(launch)
        payload = kubernetes.Payload.of(launch)
        namespace = self.namespace_of(launch)
        payload.check_size(f"creating Workflow {namespace}/{launch.name}")
        body = self.template.manifest(launch, launch.spec)  # the spec was checked at submit
        workflow = await self.create_once(
            launch,
            lambda: self._custom.create_namespaced_custom_object_without_preload_content(
                body=body, **self._scope(namespace), _request_timeout=self.api.timeout
            ),
        )
        # After the Workflow, whose uid owns them; its pod waits for them.
        owner = kubernetes.owner_reference(API_VERSION, "Workflow", workflow)
        made = kubernetes.owned_objects(launch, payload, namespace=namespace, owner=owner)
        for owned in made:
            await self.create_owned(launch, owned)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """A fresh list of corral's Workflows in each namespace that may hold one of
        `names` (one request a page), each read as `list_managed` reads it."""
        return await self.observe_listed(names, self._list_in, self._observation)

    async def _list_in(self, namespace: str, selector: str | None = None) -> kube_client.Listing:
        return await self.api.list_all(
            "Workflows",
            self._custom.list_namespaced_custom_object,
            selector=selector or self.managed,
            **self._scope(namespace),
        )

    async def _label(self, name: str, namespace: str, change: Any) -> dict[str, Any] | None:
        return await self.api.call(
            f"labelling Workflow {namespace}/{name}",
            lambda: self._custom.patch_namespaced_custom_object_without_preload_content(
                name=name,
                body=change,
                **self._scope(namespace),
                _content_type=kube_client.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_client.is_status(exc, 404),
        )

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Every Workflow in the namespace whose labels include all of `selector`."""
        listing = await self.api.list_all(
            "Workflows",
            self._custom.list_namespaced_custom_object,
            selector=self.selector(selector),
            **self._scope(),
        )
        return [self.named(workflow_observation(wf)) for wf in listing.items]

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Argo's own stop: `spec.shutdown: Terminate` (its pods get SIGTERM, then SIGKILL
        after their terminationGracePeriodSeconds). The Workflow stays, `Failed`, for the
        record and its TTL. A Workflow already gone is fine."""
        await self._cancel(self.platform_name(name))

    async def _cancel(self, name: str) -> None:
        """`cancel` of the Workflow `name` (its name on the cluster); one of another
        installation's that holds the name is left alone."""
        where = self.namespaces_for(name)
        if len(where) > 1 or self.installation is not None:
            found = await self._get(name)
            if found is None or self.foreign(found):
                return
            where = [found["metadata"].get("namespace") or self.namespace]
        namespace = where[0]
        await self.api.call(
            f"stopping Workflow {namespace}/{name}",
            lambda: self._custom.patch_namespaced_custom_object_without_preload_content(
                name=name,
                body={"spec": {"shutdown": "Terminate"}},
                **self._scope(namespace),
                _content_type=kube_client.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_client.is_status(exc, 404),
        )

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Each Workflow's finish, once, as the watch sees it (as the kubernetes
        executor's events: finishes from before the first list are recovery's)."""
        async for obs in kube_client.finishes(
            self.api.changes(
                "Workflows",
                self._custom.list_namespaced_custom_object,
                selector=self.managed,
                closed=self._closed,
                **self._scope(),
            ),
            finished=lambda wf: workflow_observation(wf).phase.finished,
        ):
            yield self.named(await self._observation(obs))

    async def _pods(self, wf: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The Workflow's pods (those podGC has not deleted yet)."""
        meta = wf["metadata"]
        return await self._pods_of(str(meta["name"]), meta.get("namespace") or self.namespace)

    async def _get(self, name: str) -> dict[str, Any] | None:
        for namespace in self.namespaces_for(name):
            if (found := await self._read(name, namespace)) is not None:
                return found
        return None

    async def _read(self, name: str, namespace: str) -> dict[str, Any] | None:
        return await self.api.call(
            f"reading Workflow {namespace}/{name}",
            lambda: self._custom.get_namespaced_custom_object_without_preload_content(
                name=name, **self._scope(namespace), _request_timeout=self.api.timeout
            ),
            ok=lambda exc: kube_client.is_status(exc, 404),
        )

    async def _observation(self, wf: dict[str, Any]) -> launching.Observation:
        """What the Workflow says; for one whose pod waits to start, why (Argo's node
        message), and past the pod start timeout its end (the Workflow is stopped, so
        that its pod cannot start later beside the next attempt's). For one that has
        finished, its run log: the end of its pod's log, while podGC has not deleted the pod
        (executors.kubernetes.argo_pod_gc_delay), and Argo's message."""
        obs = workflow_observation(wf)
        if obs.phase.finished:
            pods = await self._pods(wf)
            if running := [p for p in pods if not kube_client.pod_ended(p)]:
                # Stopped (spec.shutdown), Argo ends it at once; its pod runs on in its grace.
                ending = f"ending: {kube_client.describe_pod(running[0])} still runs"
                return dataclasses.replace(obs, phase=launching.Phase.RUNNING, reason=ending)
            pod = kubernetes.logged_pod(pods)
            return dataclasses.replace(obs, output=await self.run_log(pod, obs.message))
        why = pod_waiting(wf)
        if why is None:
            return obs
        meta = wf["metadata"]
        obs = startup.observation(
            obs.name,
            obs.labels,
            why,
            since=kube_client.timestamp(meta.get("creationTimestamp")),
            now=self._clock.now(),
            limit=startup.limit(
                self.start_timeout, (wf.get("spec") or {}).get("activeDeadlineSeconds"), self.margin
            ),
        )
        if obs.phase is launching.Phase.FAILED:
            log.info("%s: %s; stopping its Workflow", obs.name, obs.reason)
            await self._cancel(obs.name)
        return obs


_REASON = re.compile(r"^([A-Z][A-Za-z]+): (.*)$", re.DOTALL)
"""Argo's message on a pod node that waits: the kubelet's or scheduler's reason, then its
message ("ImagePullBackOff: Back-off pulling image ...", "Unschedulable: 0/3 nodes ...")."""


def pod_waiting(wf: Mapping[str, Any]) -> startup.Waiting | None:
    """Why the Workflow's pod waits to start, from its pod node (None: it started, or
    it is not known to wait): Argo copies the pod's reason and message onto the node."""
    status = wf.get("status") or {}
    node = _pod_node(status)
    if not node:  # no word of its pod yet: waiting only while the Workflow is
        pending = _PHASES.get(str(status.get("phase") or "")) is launching.Phase.PENDING
        return startup.Waiting.of("Pending") if pending else None
    if node.get("phase") != "Pending" or status.get("phase") not in ("Pending", "Running"):
        return None
    said = str(node.get("message") or "")
    if (found := _REASON.match(said)) is not None:
        return startup.Waiting.of(found.group(1), found.group(2))
    return startup.Waiting.of("Pending", said or None)


DEADLINE = "Step exceeded its deadline"
"""What Argo's controller writes on a node stopped at activeDeadlineSeconds."""
POD_DELETED = "pod deleted"
"""What it writes on a node whose pod went away under it (the node's phase: Error)."""
STOPPED = "Stopped with strategy"
"""The start of what it writes on a Workflow stopped by `spec.shutdown`."""
INVALID = "invalid spec:"
"""The start of what it writes on a Workflow its validation refuses (it fails it, and makes
no pod): Argo's CRDs are minimal, so the API server took it in."""


def workflow_observation(wf: Mapping[str, Any]) -> launching.Observation:
    """What a Workflow says of its attempt: `status.phase`, and its pod node's exit code
    and message.

    Only the controller's own words are read for a verdict, and only whole: a node's
    message may be the container's last log lines, which say whatever the job printed.
    A deadline and an `Error` node with no exit code (the pod deleted, a node lost) are
    transient; a stop by `spec.shutdown` is a cancel; a Workflow the controller refused as
    invalid is permanent (the same Workflow is refused again), its words the message."""
    meta, status = wf.get("metadata", {}), wf.get("status") or {}
    name, labels = str(meta.get("name", "")), kube_client.labels_of(wf)
    phase = _PHASES.get(str(status.get("phase") or ""), launching.Phase.PENDING)
    started = kube_client.timestamp(status.get("startedAt"))
    if not phase.finished:
        return launching.Observation(name=name, phase=phase, labels=labels, started_at=started)
    finished = kube_client.timestamp(status.get("finishedAt"))
    if phase is launching.Phase.SUCCEEDED:
        return launching.Observation(
            name=name,
            phase=phase,
            labels=labels,
            exit_code=0,
            started_at=started,
            finished_at=finished,
        )
    node = _pod_node(status)
    raw_code = str((node.get("outputs") or {}).get("exitCode") or "")
    code = int(raw_code) if raw_code.lstrip("-").isdigit() else None
    said = str(node.get("message") or "")
    told = str(status.get("message") or "")
    verdict: model.FailureClass | None = None
    message = kube_client.last_line(said) if code is not None else None
    if DEADLINE in (said, told):
        reason, verdict = f"deadline exceeded: {DEADLINE}", model.FailureClass.TRANSIENT
    elif told.startswith(STOPPED):
        reason = f"cancelled: {told}"
    elif told.startswith(INVALID):
        reason, verdict = f"Workflow refused by Argo: {told}", model.FailureClass.PERMANENT
        message = told
    elif node.get("phase") == "Error" and code is None and startup.denied(said or told):
        reason, verdict = f"pod refused by admission: {said or told}", model.FailureClass.PERMANENT
    elif node.get("phase") == "Error" and code is None:
        reason, verdict = f"{said or told or 'Argo error'}", model.FailureClass.TRANSIENT
    else:
        reason = f"workflow {status.get('phase')}" + (f" (exit code {code})" if code else "")
    return launching.Observation(
        name=name,
        phase=phase,
        labels=labels,
        exit_code=code,
        reason=reason,
        started_at=started,
        finished_at=finished,
        failure_class=verdict,
        message=message,
    )


def _pod_node(status: Mapping[str, Any]) -> Mapping[str, Any]:
    nodes = [n for n in (status.get("nodes") or {}).values() if n.get("type") == "Pod"]
    return cast(Mapping[str, Any], nodes[-1]) if nodes else {}
