"""What the `kubernetes` and `argo` executors share: `ClusterExecutor`, the life of an
executor whose attempts are objects on a cluster (its connection, its installation's
labels and names, its launches' namespaces, its reads of pods and their logs, its
strays).

- `observe` is one label-selected list (in pages of kube_calls.LIST_PAGE) per namespace
  that may hold an observed name, not a read per name, and one object that cannot be
  read gives no observation for its name (unknown to the caller) instead of failing
  them all.
- A launch may be more than one object: its Job or Workflow, then, owned by it, the
  ConfigMap of a payload too large for the environment and the Secret of its attempt
  token (`ClusterExecutor.create_owned`, kube_owned.py). Each create is idempotent by
  name, so launching a name again finishes a launch cut short in between.

The rest lives beside it: the calls to the API server, their timeouts, retries and
errors in kube_calls.py; list-then-watch in kube_changes.py; reading the objects found
in kube_objects.py; a cluster's workloads for `corral lint --cluster` in
kube_workloads.py. Only these modules, the executors' and their templates' import a
Kubernetes client (the official `kubernetes` package, its asyncio half: no call blocks
the event loop).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import aiohttp
from kubernetes.aio import client

from corral import clock, config, errors, launching, model
from corral.executors import base, kube_calls, kube_objects, kube_owned

log = logging.getLogger("corral.executors.kubernetes")

T = TypeVar("T")
MANAGED = f"{model.MANAGED_BY}={model.MANAGER}"
"""The label selector of everything corral launched."""
CONTAINER = "main"
"""The container whose log is an attempt's: the job's own (Argo names its user's `main` too)."""
OBSERVE_CONCURRENCY = 16
"""How many reads one `observe` has in flight."""
NAMESPACES_NOTED = 10_000
"""How many launches in a namespace other than the configured one an executor remembers
the namespace of (it asks every allowed namespace for one it forgot)."""


class Template(Protocol):
    """What turns a spec into the object an attempt creates (JobTemplate, WorkflowTemplate)."""

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]: ...

    def manifest(self, launch: launching.Launch, spec: Mapping[str, Any]) -> dict[str, Any]: ...


class ClusterExecutor(abc.ABC):
    """The life of an executor that runs attempts as objects on a cluster: its settings
    (`executors.kubernetes`), its connection, and `events` stopping at `close`."""

    kind: str
    objects: str  # what it creates, for logs: "Jobs", "Workflows"
    make_template: Callable[[config.Settings], Template]
    pod_label: str  # the label its controller puts on each pod: the launch's name

    def __init__(
        self,
        *,
        settings: config.Settings,
        clock: clock.Clock,
        configuration: client.Configuration | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.template = type(self).make_template(settings)
        self.k8s = settings.executors.kubernetes
        self.namespace = self.k8s.namespace
        self.start_timeout = settings.pod_start_timeout
        self.stop_grace = self.k8s.termination_grace
        self.name_prefix = self.k8s.name_prefix
        self.installation: str | None = None  # use_installation's: the store's id
        self.margin = settings.timeouts.margin
        self._launched_in: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._clock = clock
        self._configuration = configuration
        self._rng = rng
        self._api: kube_calls.Api | None = None
        self._connection: kube_calls.Connection | None = None
        self._closed = asyncio.Event()

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self.template.validate_spec(spec)

    # --- this installation's objects (base.SharesPlatform) ----------------------------------

    def use_installation(self, installation: str) -> None:
        """Label what this executor makes with `installation` (corral.dev/installation), and
        list, watch and stop only what carries it."""
        self.installation = installation

    @property
    def managed(self) -> str:
        """The label selector of this installation's objects (every corral's, until
        `use_installation`)."""
        return self.selector({model.MANAGED_BY: model.MANAGER})

    def selector(self, labels: Mapping[str, str]) -> str:
        """A label selector for `labels`, within this installation's objects."""
        if self.installation is not None:
            labels = {**labels, model.INSTALLATION: self.installation}
        return kube_objects.selector_text(labels)

    def on_cluster(self, launch: launching.Launch) -> launching.Launch:
        """`launch` as this installation puts it on the cluster: its name with the name
        prefix (executors.kubernetes.name_prefix) and its labels with the installation's."""
        labels = dict(launch.labels)
        if self.installation is not None:
            labels[model.INSTALLATION] = self.installation
        return dataclasses.replace(launch, name=self.platform_name(launch.name), labels=labels)

    def platform_name(self, name: str) -> str:
        """A launch's name on the cluster: `corral-42-1` with the name prefix for `corral`."""
        return kube_objects.platform_name(name, self.name_prefix)

    def launch_name(self, platform_name: str) -> str:
        """The launch name of an object's name on the cluster (`platform_name` undone)."""
        rest = platform_name.removeprefix(f"{self.name_prefix}-")
        return f"{model.LAUNCH_NAME_PREFIX}{rest}" if rest != platform_name else platform_name

    def named(self, obs: launching.Observation) -> launching.Observation:
        """An observation of an object on the cluster, under its launch name."""
        return dataclasses.replace(obs, name=self.launch_name(obs.name))

    async def list_unlabelled(self) -> list[launching.Observation]:
        """corral's Jobs or Workflows with no installation label (made before corral
        labelled them), in every allowed namespace, under their launch names (none before
        `use_installation`: then every object is read as this installation's)."""
        if self.installation is None:
            return []
        unlabelled = f"{MANAGED},!{model.INSTALLATION}"
        found = []
        for namespace in self.k8s.namespaces_allowed:
            for obj in (await self._list_in(namespace, unlabelled)).items:
                name = str((obj.get("metadata") or {}).get("name", ""))
                launch = self.launch_name(name)
                if self.platform_name(launch) != name:
                    log.warning(
                        "%s/%s: made without the installation label under another name prefix"
                        " than %r; left alone (set executors.kubernetes.name_prefix back to"
                        " adopt what it runs)",
                        namespace,
                        name,
                        self.name_prefix,
                    )
                    continue
                found.append(
                    launching.Observation(
                        name=launch,
                        phase=launching.Phase.PENDING,
                        labels=kube_objects.labels_of(obj),
                    )
                )
                self._note_namespace(name, namespace)
        return found

    async def label(self, names: Sequence[str]) -> list[str]:
        """Give these launches' Jobs or Workflows, and their pods, this installation's label
        (a merge patch: nothing else changes): the pods first, so that a failure leaves
        the launch unlabelled, to be found again. The names of those labelled."""
        if self.installation is None:
            return []
        change = {"metadata": {"labels": {model.INSTALLATION: self.installation}}}
        done = []
        for name in names:
            platform = self.platform_name(name)
            for namespace in self.namespaces_for(platform):
                for pod in await self._pods_of(platform, namespace, MANAGED):
                    await self._label_pod(pod, namespace, change)
                if await self._label(platform, namespace, change) is not None:
                    done.append(name)
                    break
        return done

    async def _pods_of(
        self, name: str, namespace: str, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods of the Job or Workflow `name` (its name on the cluster) in `namespace`
        that `selector` (by default this installation's) matches, by its controller's label."""
        return await self._pods_in(namespace, f"{selector or self.managed},{self.pod_label}={name}")

    async def _pods_in(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods in `namespace` that the label selector `selector` matches (in pages)."""
        found = await self.api.list_all(
            "pods", self._core.list_namespaced_pod, selector=selector, namespace=namespace
        )
        return found.items

    def foreign(self, obj: Mapping[str, Any]) -> bool:
        """Whether `obj` is another installation's (its installation label is not ours):
        never read as ours, stopped or followed, though it holds a name we want."""
        theirs = kube_objects.labels_of(obj).get(model.INSTALLATION)
        return self.installation is not None and theirs not in (None, self.installation)

    async def _label_pod(self, pod: Mapping[str, Any], namespace: str, change: Any) -> None:
        name = str((pod.get("metadata") or {}).get("name"))
        await self.api.call(
            f"labelling pod {namespace}/{name}",
            lambda: self._core.patch_namespaced_pod_without_preload_content(
                name,
                namespace,
                change,
                _content_type=kube_calls.MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: kube_calls.is_status(exc, 404),
        )

    @abc.abstractmethod
    async def _label(self, name: str, namespace: str, change: Any) -> dict[str, Any] | None:
        """Merge-patch the Job or Workflow `name` with `change`; None when it is not there."""

    async def start(self) -> None:
        """Load the connection settings; the cluster is first asked at the first call, so a
        cluster that is down at start-up delays work instead of stopping corral."""
        self._connection = await kube_calls.connect(self.k8s, self._configuration)
        api_client = self._connection.client
        self._api = kube_calls.Api(api_client, settings=self.k8s, clock=self._clock, rng=self._rng)
        self._core = client.CoreV1Api(api_client)
        self._bind(api_client)
        log.info(
            "%s executor: %s in namespace %s at %s",
            self.kind,
            self.objects,
            self.namespace,
            api_client.configuration.host,
        )

    @abc.abstractmethod
    def _bind(self, api_client: client.ApiClient) -> None:
        """Make the client's API groups this executor calls."""

    @abc.abstractmethod
    async def _get(self, name: str) -> dict[str, Any] | None:
        """A fresh read of the object `name`; None when there is none."""

    def namespace_of(self, launch: launching.Launch) -> str:
        """Where `launch` runs: its spec's namespace (one of executors.kubernetes.namespaces,
        checked at submit), else the configured one. Noted, so that reads of the name ask
        there first."""
        namespace = str(launch.spec.get("namespace") or self.namespace)
        if namespace != self.namespace:
            self._note_namespace(launch.name, namespace)
        return namespace

    def _note_namespace(self, name: str, namespace: str) -> None:
        self._launched_in[name] = namespace
        self._launched_in.move_to_end(name)
        while len(self._launched_in) > NAMESPACES_NOTED:
            self._launched_in.popitem(last=False)

    def namespaces_for(self, name: str) -> list[str]:
        """Where the object `name` may be, in the order to ask: the namespace this process
        launched it in, when it did; else every allowed namespace, the configured one first
        (a name is corral's alone, so it is in one of them at most)."""
        if known := self._launched_in.get(name):
            return [known]
        return list(self.k8s.namespaces_allowed)

    async def create_once(
        self,
        launch: launching.Launch,
        request: Callable[[], Awaitable[aiohttp.ClientResponse]],
    ) -> dict[str, Any]:
        """Create `launch`'s object with `request`, idempotent by name: on 409 the object
        is read back, and counts as launched only with this attempt's identity and no
        deletionTimestamp (a create whose answer was lost); otherwise LaunchConflict.
        The object as the API server holds it (its uid owns the launch's ConfigMap)."""
        what = f"{self.objects[:-1]} {self.namespace_of(launch)}/{launch.name}"
        made = await self.api.call(
            f"creating {what}", request, ok=lambda exc: kube_calls.is_status(exc, 409)
        )
        if made is None:
            return kube_objects.check_existing(what, await self._get(launch.name), launch)
        return made

    async def create_owned(self, launch: launching.Launch, body: Mapping[str, Any]) -> None:
        """Create `body`, a ConfigMap or Secret of `launch` owned by its Job or Workflow (its
        payload, its attempt token), idempotent by name: on 409 the one there counts as
        made when it carries this attempt's identity. One owned by another object (an
        earlier owner of this name, deleted, whose garbage is not collected yet, or
        orphaned) is given `body`'s owner instead, so that it stays while the pod that
        waits for it needs it; one being deleted is ExecutorError (a later launch makes it
        again), one of another attempt LaunchConflict."""
        await kube_owned.create(self.api, self._core, launch, body)

    async def close(self) -> None:
        """Stop `events` and close the connection. What runs on the cluster keeps running."""
        self._closed.set()
        if self._connection is not None:
            await self._connection.close()

    @property
    def api(self) -> kube_calls.Api:
        if self._api is None:
            raise errors.ExecutorError(f"{self.kind} executor: used before start()")
        return self._api

    async def last_output(self, name: str) -> launching.RunLog | None:
        """The end of the log of launch `name`'s pod that started last (one list of its
        pods, one read of its log); None when none has started."""
        platform = self.platform_name(name)
        for namespace in self.namespaces_for(platform):
            pods = await self._pods_of(platform, namespace)
            started = [p for p in pods if (p.get("status") or {}).get("phase") != "Pending"]
            if started:
                started.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp")))
                return await self.run_log(started[-1], None)
        return None

    async def still_running(self, names: Sequence[str]) -> dict[str, str]:
        """Of these launches, those with a pod that has not ended (running, or being
        deleted and still in its termination grace), whether their Job or Workflow is
        there or not: one label-selected list of corral's pods in each namespace that may
        hold one of them."""
        launches = {self.platform_name(name): name for name in names}
        wanted = {name: set(self.namespaces_for(name)) for name in launches}
        running: dict[str, str] = {}
        for namespace in dict.fromkeys(ns for where in wanted.values() for ns in where):
            for pod in await self._pods_in(namespace, self.managed):
                name = kube_objects.labels_of(pod).get(self.pod_label, "")
                if namespace in wanted.get(name, ()) and not kube_objects.pod_ended(pod):
                    running.setdefault(launches[name], kube_objects.describe_pod(pod))
        return running

    async def run_log(self, pod: Mapping[str, Any] | None, message: str | None) -> launching.RunLog:
        """A finished attempt's run log: the end of its pod's log (None: no pod is left)
        and the last line of its termination message. A log that cannot be read (the pod
        gone, a Role without `pods/log`) is a note in its place, never an error: the
        attempt's outcome does not wait on its log."""
        if pod is None:
            stream = kube_objects.log_note("its pod was gone before its log was read")
        else:
            stream = await self._pod_log(pod)
        streams = [stream]
        if message:
            streams.append(launching.Stream("message", message, len(message.encode())))
        return launching.RunLog(streams=tuple(streams))

    async def _pod_log(self, pod: Mapping[str, Any]) -> launching.Stream:
        """The end of `pod`'s main container's log (LOG_READ_BYTES), or a note of why not."""
        data, why = await self._read_log(pod, kube_objects.LOG_LINES)
        if data is not None and len(data) >= kube_objects.LOG_READ_BYTES:
            lines = max(1, data.count(b"\n"))
            fewer = max(1, launching.STREAM_BYTES * lines // len(data))
            data, why = await self._read_log(pod, fewer)
        if data is None:
            return kube_objects.log_note(why or "it could not be read")
        return kube_objects.log_stream(data)

    async def _read_log(
        self, pod: Mapping[str, Any], lines: int
    ) -> tuple[bytes | None, str | None]:
        """One read of a pod's log: its bytes, or None and why not (one try: a log is
        worth no retry that holds up an attempt's end)."""
        meta = pod.get("metadata") or {}
        name, namespace = str(meta.get("name")), meta.get("namespace") or self.namespace
        doing = f"reading the log of pod {namespace}/{name}"
        try:
            response = await self._core.read_namespaced_pod_log_without_preload_content(
                name,
                namespace,
                container=CONTAINER,
                tail_lines=lines,
                limit_bytes=kube_objects.LOG_READ_BYTES,
                _request_timeout=self.api.timeout,
            )
            try:
                data = await response.read()
            finally:
                response.release()
        except (client.ApiException, TimeoutError, aiohttp.ClientError, OSError) as exc:
            return None, str(kube_calls.translate(exc, doing))
        if response.status == 404:
            return None, "its pod was gone before its log was read"
        if response.status >= 400:
            text = data.decode(errors="replace")
            refused = client.ApiException(status=response.status, reason=response.reason, body=text)
            return None, str(kube_calls.translate(refused, doing))
        return data, None

    async def observe_listed(
        self,
        names: Sequence[str],
        list_in: Callable[[str], Awaitable[kube_calls.Listing]],
        observation: Callable[[dict[str, Any]], Awaitable[launching.Observation]],
    ) -> dict[str, launching.Observation]:
        """What the platform holds of each name, from one label-selected list (in pages)
        in each namespace that may hold one of them, never a read per name: `absent` for a
        name no list holds. An object that cannot be made an observation (malformed, or a
        read it needs fails) gives none for its name, so the caller takes it as unknown,
        and the others are still observed. `names` are launch names, as are the answer's."""
        launches = {self.platform_name(name): name for name in names}
        wanted = {name: set(self.namespaces_for(name)) for name in launches}
        found: dict[str, dict[str, Any]] = {}
        for namespace in dict.fromkeys(ns for where in wanted.values() for ns in where):
            for obj in (await list_in(namespace)).items:
                name = (obj.get("metadata") or {}).get("name")
                if namespace in wanted.get(name, ()):  # type: ignore[arg-type]
                    found.setdefault(str(name), obj)
        seen = {
            name: launching.Observation(name=name, phase=launching.Phase.ABSENT)
            for name in wanted
            if name not in found
        }
        slots = asyncio.Semaphore(OBSERVE_CONCURRENCY)

        async def one(name: str, obj: dict[str, Any]) -> None:
            async with slots:
                try:
                    seen[name] = await observation(obj)
                except (errors.ExecutorError, LookupError, TypeError, ValueError) as exc:
                    log.warning("%s: cannot read its %s (%s); unknown", name, self.objects, exc)
                except AttributeError as exc:  # a field of the wrong shape, a list for a map
                    log.warning("%s: malformed %s (%s); unknown", name, self.objects, exc)

        await asyncio.gather(*(one(name, obj) for name, obj in found.items()))
        return {launches[name]: self.named(obs) for name, obs in seen.items()}

    @abc.abstractmethod
    async def _list_in(self, namespace: str, selector: str | None = None) -> kube_calls.Listing:
        """Every Job or Workflow in `namespace` that `selector` matches (in pages); by
        default, this installation's (`managed`)."""

    # --- pods left running (base.LeavesStrays) ---------------------------------------------

    async def list_strays(self, selector: Mapping[str, str]) -> list[base.Stray]:
        """corral's live pods in each allowed namespace (not those already terminating),
        each with whether its Job or Workflow is gone: one deleted without a propagation
        policy (`kubectl delete --cascade=orphan`, an old client's default for Jobs) leaves
        its pods running. Only pods with `pod_label` are this executor's: the other cluster
        executor's carry corral's labels too. The pods are listed before the Jobs or
        Workflows, so one made in between is never missing from the second list."""
        labels = self.selector(selector)
        strays: list[base.Stray] = []
        for namespace in self.k8s.namespaces_allowed:
            selected = f"{labels},{self.pod_label}" if labels else self.pod_label
            live = [
                pod
                for pod in await self._pods_in(namespace, selected)
                if kube_objects.live_pod(pod)
            ]
            if not live:
                continue
            launches = await self._list_in(namespace, labels)
            uids = {str((obj.get("metadata") or {}).get("uid")) for obj in launches.items}
            strays += [self._stray(pod, namespace, uids) for pod in live]
        return strays

    def _stray(self, pod: Mapping[str, Any], namespace: str, launches: set[str]) -> base.Stray:
        """A live pod of corral's as a stray: its launch gone when none of the uids of
        `launches` (the Jobs or Workflows listed) is one of its owners'."""
        meta = pod.get("metadata") or {}
        labels = kube_objects.labels_of(pod)
        return base.Stray(
            name=str(meta.get("name", "")),
            namespace=namespace,
            uid=str(meta.get("uid", "")),
            launch_name=self.launch_name(labels.get(self.pod_label, "")),
            identity=model.identity_from_labels(labels),
            launch_gone=not self._owner_uids(pod) & launches,
        )

    def _owner_uids(self, pod: Mapping[str, Any]) -> set[str]:
        """The uids of what owns the pod: its owner references'. The garbage collector
        removes the reference of an owner deleted with `--cascade=orphan`, so a pod left so
        has none: a namesake Job or Workflow made since (the launch made again) never
        passes for the one that made it."""
        refs = (pod.get("metadata") or {}).get("ownerReferences") or []
        return {str(ref["uid"]) for ref in refs if ref.get("uid")}

    async def stop_stray(self, stray: base.Stray) -> None:
        """Delete the pod (its uid the precondition: never a namesake made since), with its
        own terminationGracePeriodSeconds; one already gone is fine."""
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=stray.uid))
        await self.api.call(
            f"deleting pod {stray.namespace}/{stray.name}",
            lambda: self._core.delete_namespaced_pod_without_preload_content(
                stray.name, stray.namespace, body=options, _request_timeout=self.api.timeout
            ),
            ok=lambda exc: kube_calls.is_status(exc, 404, 409),
        )
