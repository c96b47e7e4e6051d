"""The `kubernetes` executor: each attempt is one batch/v1 Job, which it launches, observes
(by polling and by a watch of Jobs), cancels, and whose pod's log it follows. Its only
truth is the API server.

What it creates is kubernetes_manifest.py's (the Job), kubernetes_spec.py's (the spec
it is made from) and kubernetes_owned.py's (the payload's ConfigMap and the attempt
token's Secret); what a Job and its pods say of an attempt is kubernetes_observation.py's;
the calls, retries, lists and watches it shares with the `argo` executor are kube_client.py's.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import pydantic
from kubernetes.aio import client as kube

from corral import config, errors, launching, model
from corral.executors import (
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

log = logging.getLogger("corral.executors.kubernetes")

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


class JobTemplate:
    """Specs and Job manifests for the `kubernetes` executor, under these settings."""

    kind = kubernetes_manifest.KIND

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self.k8s = settings.executors.kubernetes
        kubernetes_spec.check_cluster_settings(self.k8s)

    # --- spec ------------------------------------------------------------------------------

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec, normalised; InvalidInput names the field and the rule."""
        normal = kubernetes_spec.normalise_spec(spec, self.k8s, kind=kubernetes_manifest.KIND)
        # The whole Job this spec makes must pass the schemas: refuse it now, not at launch.
        kubernetes_manifest.check_manifest(
            self.manifest(kubernetes_manifest.placeholder_launch(normal), normal)
        )
        return normal

    # --- the Job ---------------------------------------------------------------------------

    def manifest(self, launch: launching.Launch, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The batch/v1 Job for `launch`."""
        return kubernetes_manifest.job(launch, spec, self.settings)


def dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> dict[str, Any]:
    """The Job the first attempt of `job` (already validated) would create, without a store
    or a cluster: its job id and fence are placeholders (0) until it is stored."""
    return JobTemplate(settings).manifest(kube_objects.first_launch(job, settings, now), job.spec)


# --- the executor -------------------------------------------------------------------------------


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
        *kube_owned.OWNED_RULES,
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

    kind = kubernetes_manifest.KIND
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
        payload = kubernetes_owned.Payload.of(launch)
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
        owner = kubernetes_owned.owner_reference("batch/v1", "Job", job)
        for owned in kubernetes_owned.owned_objects(
            launch, payload, namespace=namespace, owner=owner
        ):
            await self.create_owned(launch, owned)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """A fresh list of corral's Jobs in each namespace that may hold one of `names`
        (one request a page, not a read per Job), and, for a Job that has finished or
        waits to start, its pods: from one list of corral's pods in its namespace, made
        only when one of the Jobs asked for needs them (a Job none of whose pods that list
        holds, one made since, say, has its own read)."""
        wanted = {self.platform_name(name) for name in names}
        pods: dict[str, list[dict[str, Any]]] = {}

        async def list_in(namespace: str) -> kube_calls.Listing:
            listing = await self._list_in(namespace)
            if any(
                kubernetes_observation.may_need_pods(job)
                for job in listing.items
                if kubernetes_observation.name_of(job) in wanted
            ):
                pods.update(await self._pods_by_job(namespace))
            return listing

        async def observation(job: dict[str, Any]) -> launching.Observation:
            return await self._observation(job, pods.get(job["metadata"].get("uid", "")))

        return await self.observe_listed(names, list_in, observation)

    async def _list_in(self, namespace: str, selector: str | None = None) -> kube_calls.Listing:
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
                _content_type=kube_calls.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_calls.is_status(exc, 404),
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
        finished = any(kubernetes_observation.job_finished(job) for job in listing.items)
        pods = await self._pods_by_job(self.namespace) if finished else {}
        return [
            self.named(
                kubernetes_observation.job_observation(
                    job, pods.get(job.get("metadata", {}).get("uid", ""), [])
                )
            )
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
            if job is None or kubernetes_observation.job_finished(job) or self.foreign(job):
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
            ok=lambda exc: kube_calls.is_status(exc, 404, 409),
        )
        return answer is not None

    def _owner_uids(self, pod: Mapping[str, Any]) -> set[str]:
        """Its owner references' uids and its controller-uid label's, which stays on a pod
        whose Job was deleted with `--cascade=orphan`."""
        uids = super()._owner_uids(pod)
        if uid := kube_objects.labels_of(pod).get(CONTROLLER_UID):
            uids.add(uid)
        return uids

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Each Job's finish, once, as the watch sees it. Jobs that had finished before the
        first list are left to recovery; a relist after 410 Gone yields the finishes the
        stream missed. Polling (`observe`) covers whatever a broken watch still misses."""
        async for job in kube_changes.finishes(
            kube_changes.changes(
                self.api,
                "Jobs",
                self._batch.list_namespaced_job,
                selector=self.managed,
                closed=self._closed,
                namespace=self.namespace,
            ),
            finished=kubernetes_observation.job_finished,
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
            ok=lambda exc: kube_calls.is_status(exc, 404),
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
            by_job.setdefault(kube_objects.labels_of(pod).get(CONTROLLER_UID, ""), []).append(pod)
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
            ok=lambda exc: kube_calls.is_status(exc, 403, 404),
        )
        return kube_objects.items(result)

    async def _observation(
        self, job: Mapping[str, Any], listed: list[dict[str, Any]] | None = None
    ) -> launching.Observation:
        """What the Job says; for one that waits to start, why, and past the pod start
        timeout its end (the Job is deleted, so that its pod cannot start later beside
        the next attempt's). `listed`: its pods, when a list of them was made (none there:
        they are read)."""
        if not kubernetes_observation.needs_pods(job):
            return kubernetes_observation.job_observation(job, [])
        pods = listed or await self._pods(job)
        if kubernetes_observation.job_finished(job):
            obs = kubernetes_observation.job_observation(job, pods)
            output = await self.run_log(kubernetes_observation.logged_pod(pods), obs.message)
            return dataclasses.replace(obs, output=output)
        # Pods that ran and are ending, or gone, on a decided Job: it is not waiting to start.
        decided = kubernetes_observation.job_decided(job)
        if decided or (why := startup.waiting(pods)) is None:
            return kubernetes_observation.job_observation(job, pods)
        return await self._waiting(job, pods, why)

    async def _waiting(
        self, job: Mapping[str, Any], pods: list[dict[str, Any]], why: startup.Waiting
    ) -> launching.Observation:
        """A Job whose pod waits to start (`why`): pending, or past the pod start timeout
        failed, and then its Job is deleted."""
        if why.reason == startup.NO_POD:
            why = startup.refused(await self._events(job)) or why
        meta = job["metadata"]
        obs = startup.observation(
            str(meta.get("name", "")),
            kube_objects.labels_of(job),
            why,
            since=startup.since(pods) or kube_objects.timestamp(meta.get("creationTimestamp")),
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
            pod = kubernetes_observation.logged_pod(
                [p for p in await self._pods(job) if kubernetes_observation.container_started(p)]
            )
            if pod is not None:
                async for chunk in self._follow_pod(pod):
                    yield chunk
                return
            if kubernetes_observation.job_finished(job):
                return
            await self._clock.sleep(FOLLOW_PAUSE)

    async def _follow_pod(self, pod: Mapping[str, Any]) -> AsyncGenerator[bytes, None]:
        meta = pod.get("metadata") or {}
        name, namespace = str(meta.get("name")), meta.get("namespace") or self.namespace
        response = await self._core.read_namespaced_pod_log_without_preload_content(
            name,
            namespace,
            container=kube_client.CONTAINER,
            follow=True,
            tail_lines=kube_objects.LOG_LINES,
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
