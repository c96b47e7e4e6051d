"""The `argo` executor: each attempt is one Argo Workflow that runs one container, which it
launches, observes (by polling and by a watch of Workflows), and stops by its
`spec.shutdown`. Its only truth is the API server.

The Workflow it creates is argo_manifest.py's (from the `kubernetes` executor's spec,
kubernetes_spec.py, and the same container, kubernetes_manifest.py); what a Workflow says
of its attempt is argo_observation.py's; what it shares with the `kubernetes` executor
is kube_client.py's (ClusterExecutor).

A pod left running by a Workflow deleted without a propagation policy is found and
stopped by the reconciler's orphan sweep as a Job's is (`ClusterExecutor.list_strays`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from kubernetes.aio import client as kube

from corral import config, launching, model
from corral.executors import (
    argo_manifest,
    argo_observation,
    kube_calls,
    kube_changes,
    kube_client,
    kube_objects,
    kube_owned,
    kubernetes_manifest,
    kubernetes_observation,
    kubernetes_owned,
    kubernetes_spec,
    rbac,
    startup,
)

log = logging.getLogger("corral.executors.argo")

KIND = "argo"


class WorkflowTemplate:
    """Specs and Workflow manifests for the `argo` executor, under these settings."""

    kind = KIND

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self.k8s = settings.executors.kubernetes
        kubernetes_spec.check_cluster_settings(self.k8s)

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec, normalised; InvalidInput names the field and the rule."""
        normal = kubernetes_spec.normalise_spec(spec, self.k8s, kind=KIND)
        # The whole Workflow this spec makes must pass the checks: refuse it now, not at launch.
        argo_manifest.check_workflow(
            self.manifest(kubernetes_manifest.placeholder_launch(normal, kind=KIND), normal)
        )
        return normal

    def manifest(self, launch: launching.Launch, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The argoproj.io/v1alpha1 Workflow for `launch`."""
        return argo_manifest.workflow(launch, spec, self.settings)


def dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> dict[str, Any]:
    """The Workflow the first attempt of `job` (already validated) would create, without a
    store or a cluster: its job id and fence are placeholders (0) until it is stored."""
    return WorkflowTemplate(settings).manifest(
        kube_objects.first_launch(job, settings, now), job.spec
    )


# --- the executor -------------------------------------------------------------------------------

GROUP, VERSION = argo_manifest.API_VERSION.split("/")
PLURAL = "workflows"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
"""The label Argo's controller puts on a Workflow's pods: the Workflow's name."""


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
        *kube_owned.OWNED_RULES,
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
        payload = kubernetes_owned.Payload.of(launch)
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
        owner = kubernetes_owned.owner_reference(argo_manifest.API_VERSION, "Workflow", workflow)
        made = kubernetes_owned.owned_objects(launch, payload, namespace=namespace, owner=owner)
        for owned in made:
            await self.create_owned(launch, owned)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """A fresh list of corral's Workflows in each namespace that may hold one of
        `names` (one request a page), each read as `list_managed` reads it."""
        return await self.observe_listed(names, self._list_in, self._observation)

    async def _list_in(self, namespace: str, selector: str | None = None) -> kube_calls.Listing:
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
                _content_type=kube_calls.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_calls.is_status(exc, 404),
        )

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Every Workflow in the namespace whose labels include all of `selector`."""
        listing = await self.api.list_all(
            "Workflows",
            self._custom.list_namespaced_custom_object,
            selector=self.selector(selector),
            **self._scope(),
        )
        return [self.named(argo_observation.workflow_observation(wf)) for wf in listing.items]

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
                _content_type=kube_calls.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_calls.is_status(exc, 404),
        )

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Each Workflow's finish, once, as the watch sees it (as the kubernetes
        executor's events: finishes from before the first list are recovery's)."""
        async for obs in kube_changes.finishes(
            kube_changes.changes(
                self.api,
                "Workflows",
                self._custom.list_namespaced_custom_object,
                selector=self.managed,
                closed=self._closed,
                **self._scope(),
            ),
            finished=lambda wf: argo_observation.workflow_observation(wf).phase.finished,
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
            ok=lambda exc: kube_calls.is_status(exc, 404),
        )

    async def _observation(self, wf: dict[str, Any]) -> launching.Observation:
        """What the Workflow says; for one whose pod waits to start, why (Argo's node
        message), and past the pod start timeout its end (the Workflow is stopped, so
        that its pod cannot start later beside the next attempt's). For one that has
        finished, its run log: the end of its pod's log, while podGC has not deleted the pod
        (executors.kubernetes.argo_pod_gc_delay), and Argo's message."""
        obs = argo_observation.workflow_observation(wf)
        if obs.phase.finished:
            pods = await self._pods(wf)
            if running := [p for p in pods if not kube_objects.pod_ended(p)]:
                # Stopped (spec.shutdown), Argo ends it at once; its pod runs on in its grace.
                ending = f"ending: {kube_objects.describe_pod(running[0])} still runs"
                return dataclasses.replace(obs, phase=launching.Phase.RUNNING, reason=ending)
            pod = kubernetes_observation.logged_pod(pods)
            return dataclasses.replace(obs, output=await self.run_log(pod, obs.message))
        why = argo_observation.pod_waiting(wf)
        if why is None:
            return obs
        meta = wf["metadata"]
        obs = startup.observation(
            obs.name,
            obs.labels,
            why,
            since=kube_objects.timestamp(meta.get("creationTimestamp")),
            now=self._clock.now(),
            limit=startup.limit(
                self.start_timeout, (wf.get("spec") or {}).get("activeDeadlineSeconds"), self.margin
            ),
        )
        if obs.phase is launching.Phase.FAILED:
            log.info("%s: %s; stopping its Workflow", obs.name, obs.reason)
            await self._cancel(obs.name)
        return obs
