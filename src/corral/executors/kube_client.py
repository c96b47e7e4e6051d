"""What the `kubernetes` and `argo` executors share: one connection to the cluster's API
server, its errors turned into corral's, bounded retries, and list-then-watch.

Only this module, kubernetes.py and argo.py import a Kubernetes client (the official
`kubernetes` package, its asyncio half: no call blocks the event loop).

- Every request carries a client-side timeout (`request_timeout`), so a cut connection
  fails instead of hanging; a watch's is its server-side `timeoutSeconds` plus that.
- 429, 5xx, timeouts and refused connections are retried a few times with full jitter
  (creates too: they are idempotent by name); anything else fails at once. A 429 or 503
  that carries Retry-After (an API server shedding load, its priority and fairness
  queues full) is tried again after what it asks, for as long as the call's deadline
  allows (`(RETRIES + 1) * request_timeout` from its start), not after a quick jitter.
- Client errors become ExecutorError (the platform could not be asked) or InvalidInput
  (422/400: the API server refused the object as invalid).
- `observe` is one label-selected list (in pages of LIST_PAGE) per namespace that may
  hold an observed name, not a read per name, and one object that cannot be read gives
  no observation for its name (unknown to the caller) instead of failing them all.
- `changes()` lists, then watches from the list's resourceVersion, resumes from the last
  one it saw when a stream ends or breaks, and lists again after 410 Gone.
- A launch may be more than one object: its Job or Workflow, then, owned by it, the
  ConfigMap of a payload too large for the environment and the Secret of its attempt
  token (`ClusterExecutor.create_owned`). Each create is idempotent by name, so launching
  a name again finishes a launch cut short in between.
- `list_workloads` reads a cluster's Deployments and StatefulSets for `corral lint
  --cluster`, on the same connection; a refusal names the permission to grant.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import dataclasses
import json
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

import aiohttp
import pydantic
from kubernetes.aio import client
from kubernetes.aio import config as kube_config
from kubernetes.aio import watch as kube_watch

from corral import clock, config, errors, launching, model
from corral.executors import base, kubernetes_settings, rbac, startup

log = logging.getLogger("corral.executors.kubernetes")

T = TypeVar("T")
Owned = TypeVar("Owned", client.V1ConfigMap, client.V1Secret)
MERGE_PATCH = "application/merge-patch+json"
RETRIES = 3
"""How many times a request that failed for a passing reason is tried again."""
BACKOFF_BASE = 0.2
BACKOFF_CAP = 5.0
WATCH_BACKOFF_CAP = 30.0
_PASSING = {408, 425, 429, 500, 502, 503, 504}
_THROTTLED = {429, 503}
"""The answers whose Retry-After corral waits for."""
MANAGED = f"{model.MANAGED_BY}={model.MANAGER}"
"""The label selector of everything corral launched."""
CONTAINER = "main"
"""The container whose log is an attempt's: the job's own (Argo names its user's `main` too)."""
LOG_LINES = 10_000
"""How many last lines of a finished pod's log the first read asks for (`tailLines`)."""
LOG_READ_BYTES = 4 * launching.STREAM_BYTES
"""The most one read of a pod's log takes (`limitBytes`). The kubelet counts it from the
start of the lines asked for, so a read that reaches it is made again for fewer lines
(as many as STREAM_BYTES holds at the first read's line length): the run log keeps a
log's end."""
LOG_STREAM = "log"
"""The run log's stream of a pod's log: its main container's stdout and stderr together."""
OBSERVE_CONCURRENCY = 16
"""How many reads one `observe` has in flight."""
LIST_PAGE = 500
"""Objects per list request; longer lists come in pages."""
OWNED_RULES = (
    rbac.Rule(
        "",
        "configmaps",
        ("create", "get", "patch"),
        "a payload over 32 KiB: a ConfigMap owned by its Job or Workflow (patch: one left by"
        " an earlier owner of the name is given the new one)",
    ),
    rbac.Rule(
        "",
        "secrets",
        ("create", "get", "patch"),
        "with api_url, an attempt's token: a Secret owned by its Job or Workflow (patch: as"
        " for the ConfigMap)",
    ),
)
"""What create_owned calls."""
NAMESPACES_NOTED = 10_000
"""How many launches in a namespace other than the configured one an executor remembers
the namespace of (it asks every allowed namespace for one it forgot)."""


@dataclass(frozen=True, slots=True)
class Listing:
    """One consistent list: its items and the resourceVersion to watch from."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Change:
    """What a list or a watch says about one object. `kind` is ADDED, MODIFIED or DELETED
    from a watch, or LISTED (`relisted` True after a 410: the stream missed changes)."""

    kind: str
    obj: dict[str, Any]
    relisted: bool = False


@dataclass(frozen=True, slots=True)
class Connection:
    """An API client, and the task that keeps its token fresh (for kubeconfig users whose
    tokens come from an exec plugin or a cloud provider and expire: EKS, GKE)."""

    client: client.ApiClient
    refresher: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
            await asyncio.gather(self.refresher, return_exceptions=True)
        await self.client.close()  # type: ignore[no-untyped-call]


async def connect(
    settings: kubernetes_settings.KubernetesExecutorSettings,
    configuration: client.Configuration | None = None,
) -> Connection:
    """An API client: on `configuration` if given, else the kubeconfig file of the
    settings, else the pod's service account (in-cluster), else ~/.kube/config."""
    loader = None
    if configuration is None:
        configuration = client.Configuration()
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and settings.kubeconfig is None:
                # corral runs in a pod: its service account token, refreshed by the client
                kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                loader = await kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                    context=settings.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (kube_config.ConfigException, OSError, ValueError) as exc:
            raise errors.ConfigError(
                f"executors.kubernetes: cannot load the cluster's connection settings: {exc}"
                " (set executors.kubernetes.kubeconfig, or run corral in a pod with a"
                " service account)"
            ) from None
    configuration.retries = None  # retries are ours: bounded, jittered, counted
    refresher = None
    if loader is not None:
        refresher = asyncio.get_running_loop().create_task(
            kube_config.refresh_token(loader, configuration)  # type: ignore[no-untyped-call]
        )
    return Connection(client.ApiClient(configuration), refresher)


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, client.ApiException) and exc.status in codes


def status_reason(exc: client.ApiException) -> str:
    """The Status message the API server sent, or the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "no reason given")


def translate(exc: BaseException, doing: str) -> errors.CorralError:
    """corral's error for a failed API call."""
    if isinstance(exc, client.ApiException):
        why = status_reason(exc)
        if exc.status in (400, 422):
            return errors.LaunchRefused(f"{doing}: the API server refused it as invalid: {why}")
        if exc.status == 403 and startup.denied(why):
            return errors.LaunchRefused(f"{doing}: refused by admission: {why}")
        if exc.status == 403 and "exceeded quota" in why:
            return errors.ExecutorError(f"{doing}: a ResourceQuota is full: {why}")
        if exc.status in (401, 403):
            return errors.ExecutorError(
                f"{doing}: forbidden ({exc.status}): {why}; check the service account's Role"
                " (deploy/ has the one corral needs)"
            )
        return errors.ExecutorError(f"{doing}: API server answered {exc.status}: {why}")
    if isinstance(exc, TimeoutError):
        return errors.ExecutorError(f"{doing}: no answer from the API server in time")
    return errors.ExecutorError(f"{doing}: cannot reach the API server: {exc}")


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 or 503 asks to wait (its Retry-After header, in seconds as the
    API server sends it); None without one, or for any other error."""
    if not isinstance(exc, client.ApiException) or exc.status not in _THROTTLED:
        return None
    value = (exc.headers or {}).get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from an API server; the usual backoff then


def passing(exc: BaseException) -> bool:
    """Whether trying again may help."""
    if isinstance(exc, client.ApiException):
        return exc.status in _PASSING or exc.status == 0
    return isinstance(exc, TimeoutError | aiohttp.ClientError | OSError)


class Api:
    """Calls to one API server, with timeouts, retries and error translation."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        settings: kubernetes_settings.KubernetesExecutorSettings,
        clock: clock.Clock,
        rng: random.Random | None = None,
    ) -> None:
        self.client = api_client
        self.settings = settings
        self.timeout = settings.request_timeout.total_seconds()
        self._clock = clock
        self._rng = rng or random.Random()

    async def call(
        self,
        doing: str,
        request: Callable[[], Awaitable[aiohttp.ClientResponse]],
        *,
        ok: Callable[[BaseException], bool] = lambda _: False,
        retries: int = RETRIES,
    ) -> dict[str, Any] | None:
        """The JSON answer of `request()` (a client call `..._without_preload_content`:
        the answer is read as plain JSON, so fields newer than this client never break
        it), tried again on passing failures. None when `ok(exc)` says the error is an
        answer (404 on a get, say); otherwise corral's error."""
        ends = self._clock.monotonic() + self.timeout * (retries + 1)
        failures = 0
        while True:
            try:
                return await _json(await request())
            except (client.ApiException, TimeoutError, aiohttp.ClientError, OSError) as exc:
                if ok(exc):
                    return None
                if not passing(exc):
                    raise translate(exc, doing) from None
                failures += 1
                delay = self._wait(exc, failures, retries, ends - self._clock.monotonic())
                if delay is None:
                    raise translate(exc, doing) from None
                log.info("%s: %s; trying again in %.2fs", doing, translate(exc, doing), delay)
                await self._clock.sleep(delay)

    def _wait(self, exc: BaseException, failures: int, retries: int, left: float) -> float | None:
        """How long to wait before trying again after a passing failure, None to give up:
        what a Retry-After asks (at least BACKOFF_BASE: a 0 is no reason to hammer), cut to
        the `left` of the call's deadline; else a full
        jitter that grows, for at most `retries` tries."""
        asked = retry_after(exc)
        if asked is not None:
            return min(max(asked, BACKOFF_BASE), left) if left > 0 else None
        if failures > retries:
            return None
        return self._rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (failures - 1)))

    async def changes(
        self,
        what: str,
        list_call: Callable[..., Awaitable[Any]],
        *,
        selector: str,
        closed: asyncio.Event,
        **scope: Any,
    ) -> AsyncIterator[Change]:
        """Forever, until `closed`: list the objects `selector` matches, then watch them.

        The first list is only yielded as LISTED; after a 410 Gone the list is yielded
        again with `relisted`, since the stream missed what happened in between. A stream
        that ends, breaks or stalls past its timeout is resumed from the last
        resourceVersion seen (bookmarks keep it fresh on a quiet selector). A stream that
        fails, or ends at once with nothing in it (an error page from a proxy reads that
        way), is resumed after a jittered pause that grows with each failure."""
        version: str | None = None
        failures = 0
        listed = False
        watch_seconds = max(1, int(self.settings.watch_timeout.total_seconds()))
        while not closed.is_set():
            began, heard = self._clock.monotonic(), 0
            try:
                if version is None:
                    listing = await self.list_all(what, list_call, selector=selector, **scope)
                    version = listing.resource_version
                    for item in listing.items:
                        yield Change("LISTED", item, relisted=listed)
                    listed = True
                # Events as plain JSON too ("object"), not the client's strict models;
                # `async with` closes the stream even when this generator is dropped.
                async with kube_watch.Watch(return_type="object") as stream:  # type: ignore[no-untyped-call]
                    async for event in stream.stream(
                        list_call,
                        **scope,
                        label_selector=selector,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=watch_seconds,
                        _request_timeout=watch_seconds + self.timeout,
                    ):
                        obj = event.get("raw_object") if isinstance(event, dict) else None
                        if not isinstance(obj, dict):
                            raise client.ApiException(status=0, reason=f"not an event: {event!r}")
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                        heard += 1
                        failures = 0
                        if event.get("type") == "BOOKMARK":
                            continue
                        yield Change(str(event.get("type")), obj)
                        if closed.is_set():
                            return
                if heard == 0 and self._clock.monotonic() - began < 1.0:
                    raise client.ApiException(status=0, reason="the watch ended at once, empty")
            except client.ApiException as exc:
                if exc.status == 410:
                    log.info("%s: watch expired (410 Gone); listing again", what)
                    version = None
                    continue
                failures += 1
                await self._pause(what, translate(exc, f"watching {what}"), failures, closed)
            except Exception as exc:  # a broken stream must never end the watching for good
                failures += 1
                await self._pause(what, exc, failures, closed)

    async def list_all(
        self, what: str, list_call: Callable[..., Awaitable[Any]], *, selector: str, **scope: Any
    ) -> Listing:
        """Every object `selector` matches, in pages of LIST_PAGE (`limit`/`continue`),
        and the resourceVersion of the list to watch from."""
        owner = list_call.__self__  # type: ignore[attr-defined]
        raw = getattr(owner, list_call.__name__ + "_without_preload_content")
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = {"_continue": token} if token else {}
            data = await self.call(
                f"listing {what}",
                lambda page=page: raw(  # type: ignore[misc]
                    **scope,
                    **page,
                    label_selector=selector,
                    limit=LIST_PAGE,
                    _request_timeout=self.timeout,
                ),
            )
            found += items(data)
            meta = (data or {}).get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                return Listing(found, str(meta.get("resourceVersion") or ""))

    async def _pause(
        self, what: str, exc: BaseException, failures: int, closed: asyncio.Event
    ) -> None:
        delay = self._rng.uniform(0, min(WATCH_BACKOFF_CAP, BACKOFF_BASE * 2**failures))
        log.warning("%s: watch broke (%r); resuming in %.1fs", what, exc, delay)
        if not closed.is_set():
            await self._clock.sleep(delay)


async def _json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """A raw answer as JSON; an error status raises the client's ApiException with the
    Status body, as the client's own calls do."""
    try:
        text = await response.text()
    finally:
        response.release()
    if response.status >= 400:
        exc = client.ApiException(status=response.status, reason=response.reason, body=text)
        exc.headers = response.headers  # Retry-After, as the client's own calls keep it
        raise exc
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        raise client.ApiException(status=0, reason=f"not JSON: {text[:200]!r}") from None
    return data if isinstance(data, dict) else {}


# --- the executors' common part ------------------------------------------------------------


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
        self._api: Api | None = None
        self._connection: Connection | None = None
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
        return selector_text(labels)

    def on_cluster(self, launch: launching.Launch) -> launching.Launch:
        """`launch` as this installation puts it on the cluster: its name with the name
        prefix (executors.kubernetes.name_prefix) and its labels with the installation's."""
        labels = dict(launch.labels)
        if self.installation is not None:
            labels[model.INSTALLATION] = self.installation
        return dataclasses.replace(launch, name=self.platform_name(launch.name), labels=labels)

    def platform_name(self, name: str) -> str:
        """A launch's name on the cluster: `corral-42-1` with the name prefix for `corral`."""
        return platform_name(name, self.name_prefix)

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
                        name=launch, phase=launching.Phase.PENDING, labels=labels_of(obj)
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
        theirs = labels_of(obj).get(model.INSTALLATION)
        return self.installation is not None and theirs not in (None, self.installation)

    async def _label_pod(self, pod: Mapping[str, Any], namespace: str, change: Any) -> None:
        name = str((pod.get("metadata") or {}).get("name"))
        await self.api.call(
            f"labelling pod {namespace}/{name}",
            lambda: self._core.patch_namespaced_pod_without_preload_content(
                name,
                namespace,
                change,
                _content_type=MERGE_PATCH,
                _request_timeout=self.api.timeout,
            ),
            ok=lambda exc: is_status(exc, 404),
        )

    @abc.abstractmethod
    async def _label(self, name: str, namespace: str, change: Any) -> dict[str, Any] | None:
        """Merge-patch the Job or Workflow `name` with `change`; None when it is not there."""

    async def start(self) -> None:
        """Load the connection settings; the cluster is first asked at the first call, so a
        cluster that is down at start-up delays work instead of stopping corral."""
        self._connection = await connect(self.k8s, self._configuration)
        api_client = self._connection.client
        self._api = Api(api_client, settings=self.k8s, clock=self._clock, rng=self._rng)
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
        made = await self.api.call(f"creating {what}", request, ok=lambda exc: is_status(exc, 409))
        if made is None:
            return check_existing(what, await self._get(launch.name), launch)
        return made

    async def create_owned(self, launch: launching.Launch, body: Mapping[str, Any]) -> None:
        """Create `body`, a ConfigMap or Secret of `launch` owned by its Job or Workflow (its
        payload, its attempt token), idempotent by name: on 409 the one there counts as
        made when it carries this attempt's identity. One owned by another object (an
        earlier owner of this name, deleted, whose garbage is not collected yet, or
        orphaned) is given `body`'s owner instead, so that it stays while the pod that
        waits for it needs it; one being deleted is ExecutorError (a later launch makes it
        again), one of another attempt LaunchConflict."""
        calls = self._owned_calls(launch.name, body)
        what = f"{calls.kind} {body['metadata']['namespace']}/{launch.name}"
        made = await self.api.call(
            f"creating {what}", calls.create, ok=lambda exc: is_status(exc, 409)
        )
        if made is not None:
            return
        found = await self.api.call(
            f"reading {what}", calls.read, ok=lambda exc: is_status(exc, 404)
        )
        owners = list(body["metadata"]["ownerReferences"])
        if owned_by(what, found, launch, owners):
            return
        log.info("%s: held by another owner; taking it over for the launch", what)
        await self.api.call(
            f"giving {what} its owner",
            lambda: calls.patch({"metadata": {"ownerReferences": owners}}),
        )

    def _owned_calls(self, name: str, body: Mapping[str, Any]) -> _OwnedCalls:
        """The create, read and merge-patch of `body` (a ConfigMap or a Secret) by name."""
        core, namespace, timeout = self._core, body["metadata"]["namespace"], self.api.timeout
        kind = str(body.get("kind"))
        what = f"{kind} {namespace}/{name}"
        if kind == "ConfigMap":
            config_map = _typed(client.V1ConfigMap, body, what)
            return _OwnedCalls(
                kind,
                create=lambda: core.create_namespaced_config_map_without_preload_content(
                    namespace, config_map, _request_timeout=timeout
                ),
                read=lambda: core.read_namespaced_config_map_without_preload_content(
                    name, namespace, _request_timeout=timeout
                ),
                patch=lambda change: core.patch_namespaced_config_map_without_preload_content(
                    name, namespace, change, _content_type=MERGE_PATCH, _request_timeout=timeout
                ),
            )
        if kind == "Secret":
            secret = _typed(client.V1Secret, body, what)
            return _OwnedCalls(
                kind,
                create=lambda: core.create_namespaced_secret_without_preload_content(
                    namespace, secret, _request_timeout=timeout
                ),
                read=lambda: core.read_namespaced_secret_without_preload_content(
                    name, namespace, _request_timeout=timeout
                ),
                patch=lambda change: core.patch_namespaced_secret_without_preload_content(
                    name, namespace, change, _content_type=MERGE_PATCH, _request_timeout=timeout
                ),
            )
        raise errors.LaunchRefused(f"creating {what}: a launch owns only ConfigMaps and Secrets")

    async def close(self) -> None:
        """Stop `events` and close the connection. What runs on the cluster keeps running."""
        self._closed.set()
        if self._connection is not None:
            await self._connection.close()

    @property
    def api(self) -> Api:
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
                name = labels_of(pod).get(self.pod_label, "")
                if namespace in wanted.get(name, ()) and not pod_ended(pod):
                    running.setdefault(launches[name], describe_pod(pod))
        return running

    async def run_log(self, pod: Mapping[str, Any] | None, message: str | None) -> launching.RunLog:
        """A finished attempt's run log: the end of its pod's log (None: no pod is left)
        and the last line of its termination message. A log that cannot be read (the pod
        gone, a Role without `pods/log`) is a note in its place, never an error: the
        attempt's outcome does not wait on its log."""
        if pod is None:
            stream = log_note("its pod was gone before its log was read")
        else:
            stream = await self._pod_log(pod)
        streams = [stream]
        if message:
            streams.append(launching.Stream("message", message, len(message.encode())))
        return launching.RunLog(streams=tuple(streams))

    async def _pod_log(self, pod: Mapping[str, Any]) -> launching.Stream:
        """The end of `pod`'s main container's log (LOG_READ_BYTES), or a note of why not."""
        data, why = await self._read_log(pod, LOG_LINES)
        if data is not None and len(data) >= LOG_READ_BYTES:
            lines = max(1, data.count(b"\n"))
            fewer = max(1, launching.STREAM_BYTES * lines // len(data))
            data, why = await self._read_log(pod, fewer)
        if data is None:
            return log_note(why or "it could not be read")
        return log_stream(data)

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
                limit_bytes=LOG_READ_BYTES,
                _request_timeout=self.api.timeout,
            )
            try:
                data = await response.read()
            finally:
                response.release()
        except (client.ApiException, TimeoutError, aiohttp.ClientError, OSError) as exc:
            return None, str(translate(exc, doing))
        if response.status == 404:
            return None, "its pod was gone before its log was read"
        if response.status >= 400:
            text = data.decode(errors="replace")
            refused = client.ApiException(status=response.status, reason=response.reason, body=text)
            return None, str(translate(refused, doing))
        return data, None

    async def observe_listed(
        self,
        names: Sequence[str],
        list_in: Callable[[str], Awaitable[Listing]],
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
    async def _list_in(self, namespace: str, selector: str | None = None) -> Listing:
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
            live = [pod for pod in await self._pods_in(namespace, selected) if live_pod(pod)]
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
        labels = labels_of(pod)
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
            ok=lambda exc: is_status(exc, 404, 409),
        )


@dataclass(frozen=True, slots=True)
class _OwnedCalls:
    """The API calls that make and mend one object a launch owns (ConfigMap, Secret)."""

    kind: str
    create: Callable[[], Awaitable[aiohttp.ClientResponse]]
    read: Callable[[], Awaitable[aiohttp.ClientResponse]]
    patch: Callable[[dict[str, Any]], Awaitable[aiohttp.ClientResponse]]


def _typed(model_class: type[Owned], body: Mapping[str, Any], what: str) -> Owned:
    """`body` as the client's model of it; LaunchRefused when it cannot be one."""
    try:
        typed = model_class.from_dict(dict(body))
    except pydantic.ValidationError as exc:
        kind = body.get("kind")
        raise errors.LaunchRefused(f"creating {what}: not a valid {kind}: {exc}") from None
    if typed is None:
        raise errors.LaunchRefused(f"creating {what}: empty manifest")
    return typed


# --- reading objects ------------------------------------------------------------------------


def log_stream(data: bytes, *, limit: int = launching.STREAM_BYTES) -> launching.Stream:
    """A read of a pod's log as the run log keeps it: its last `limit` bytes, `cut` when
    that is not all of it (more than `limit`, or a read that reached LOG_LINES lines or
    LOG_READ_BYTES: the log went on before them)."""
    cut = len(data) > limit or len(data) >= LOG_READ_BYTES or data.count(b"\n") >= LOG_LINES
    text = launching.decoded(data[-limit:], cut_before=len(data) > limit)
    return launching.Stream(LOG_STREAM, text, len(data), cut)


def log_note(why: str) -> launching.Stream:
    """The run log's stream in place of a pod log that could not be read: why not."""
    text = f"(no pod log: {why})"
    return launching.Stream(LOG_STREAM, text, 0)


def first_launch(job: model.NewJob, settings: config.Settings, now: datetime) -> launching.Launch:
    """The Launch of the first attempt of `job` (validated, not stored: its job id and fence
    are placeholders, 0) as a cluster executor names it: for a dry run's manifest."""
    launch = base.launch_for(model.first_claim(job, now), settings, now)
    name = platform_name(launch.name, settings.executors.kubernetes.name_prefix)
    return dataclasses.replace(launch, name=name)


def platform_name(name: str, prefix: str) -> str:
    """A launch's name on a cluster: `corral-42-1` with `prefix` in place of `corral`."""
    rest = name.removeprefix(model.LAUNCH_NAME_PREFIX)
    return f"{prefix}-{rest}" if rest != name else name


def pod_ended(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers have all ended (Succeeded or Failed): a pod being
    deleted runs on until then, for as long as its termination grace."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def describe_pod(pod: Mapping[str, Any]) -> str:
    """A pod in words, for the run log: `pod corral-5-1-x7kq2 (Terminating)`."""
    meta = pod.get("metadata") or {}
    phase = (
        "Terminating"
        if meta.get("deletionTimestamp")
        else (pod.get("status") or {}).get("phase", "Pending")
    )
    return f"pod {meta.get('name')} ({phase})"


def selector_text(selector: Mapping[str, str]) -> str:
    """A label selector (`k=v,...`) for these labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def items(listing: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [i for i in (listing or {}).get("items") or [] if isinstance(i, dict)]


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (obj.get("metadata", {}).get("labels") or {}).items()}


def timestamp(value: Any) -> datetime | None:
    """An API timestamp (RFC 3339) as an aware datetime."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def live_pod(pod: Mapping[str, Any]) -> bool:
    """A pod that runs or may still run, and that no one is deleting yet."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


def last_line(text: Any) -> str | None:
    """The last non-empty line of a termination message or log tail."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[-1][:500] if lines else None


def check_existing(
    what: str, found: dict[str, Any] | None, launch: launching.Launch
) -> dict[str, Any]:
    """After a 409 on create: `found` if it is this attempt's and not being deleted (the
    create got through before, its answer was lost); else raise."""
    if found is None:
        raise errors.ExecutorError(
            f"creating {what}: 409 AlreadyExists, but it was gone when read back (deleted"
            " meanwhile); it will be tried again"
        )
    foreign(what, found, launch)
    theirs = model.identity_from_labels(labels_of(found))
    deleting = found.get("metadata", {}).get("deletionTimestamp")
    if theirs == launch.identity and not deleting:
        log.info("%s: already exists with this attempt's labels: launched", what)
        return found
    state = (
        f"is being deleted (since {deleting})"
        if theirs == launch.identity
        else f"belongs to {model.describe_identity(theirs, labels_of(found))}"
    )
    raise errors.LaunchConflict(
        f"{what} exists and {state}; this launch is"
        f" {model.describe_identity(launch.identity, launch.labels)}"
    )


def foreign(what: str, found: Mapping[str, Any], launch: launching.Launch) -> None:
    """LaunchConflict when `found`, holding the name `launch` wants, is another corral
    installation's (its installation label is not the launch's). One with no such label is
    an earlier corral's, this installation's or not: its identity labels decide."""
    theirs = labels_of(found).get(model.INSTALLATION)
    mine = launch.labels.get(model.INSTALLATION)
    if theirs is not None and mine is not None and theirs != mine:
        raise errors.LaunchConflict(
            f"{what} exists and belongs to another corral installation ({theirs}; this one is"
            f" {mine}) in the same namespace: give each installation its own"
            " executors.kubernetes.name_prefix"
        )


def owned_by(
    what: str,
    found: Mapping[str, Any] | None,
    launch: launching.Launch,
    owners: Sequence[Mapping[str, Any]],
) -> bool:
    """After a 409 on a launch's ConfigMap or Secret: whether `found` is this attempt's and has the
    owner(s) `owners` already (False: this attempt's, but another owner's). ExecutorError
    when it is gone or being deleted, LaunchConflict when another attempt's."""
    if found is None:
        raise errors.ExecutorError(
            f"creating {what}: 409 AlreadyExists, but it was gone when read back (deleted"
            " meanwhile); it will be tried again"
        )
    foreign(what, found, launch)
    theirs = model.identity_from_labels(labels_of(found))
    if theirs != launch.identity:
        raise errors.LaunchConflict(
            f"{what} exists and belongs to {model.describe_identity(theirs, labels_of(found))};"
            f" this launch is {model.describe_identity(launch.identity, launch.labels)}"
        )
    meta = found.get("metadata") or {}
    if deleting := meta.get("deletionTimestamp"):
        raise errors.ExecutorError(
            f"creating {what}: it is being deleted (since {deleting}); it will be made again"
            " by a later launch"
        )
    held = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
    return {ref.get("uid") for ref in owners} <= held


async def finishes(
    changes: AsyncIterator[Change], finished: Callable[[Mapping[str, Any]], bool]
) -> AsyncIterator[dict[str, Any]]:
    """Each object's finish, once. Objects already finished at the first list are left
    out (recovery settles what finished while no one watched); after a relist, finishes
    the stream missed come out."""
    told: set[str] = set()
    async for change in changes:
        name = str(change.obj.get("metadata", {}).get("name", ""))
        if change.kind == "DELETED":
            told.discard(name)
            continue
        if name in told or not finished(change.obj):
            continue
        told.add(name)
        if change.kind == "LISTED" and not change.relisted:
            continue
        yield change.obj


# --- reading a cluster's workloads (`corral lint --cluster`) -------------------------------

WORKLOADS = (("Deployment", "deployment"), ("StatefulSet", "stateful_set"))
"""The kinds `list_workloads` reads (group apps/v1), and their name in the client's calls."""


@dataclass(frozen=True, slots=True)
class Workloads:
    """What `list_workloads` read, and from where: the kubeconfig context, or `in-cluster`."""

    context: str
    items: list[dict[str, Any]]


async def list_workloads(
    settings: kubernetes_settings.KubernetesExecutorSettings,
    *,
    namespace: str | None,
    clock: clock.Clock,
) -> Workloads:
    """Every Deployment and StatefulSet in `namespace` (None: in all), as plain JSON with its
    `kind` set (a list's items carry none). The connection is the executors' (`connect`);
    a 401/403 is ExecutorError naming the verb the identity lacks."""
    connection = await connect(settings)
    try:
        api = Api(connection.client, settings=settings, clock=clock)
        apps = client.AppsV1Api(connection.client)
        context = _context_name(settings)
        source = f"context {context}, {connection.client.configuration.host}"
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        found: list[dict[str, Any]] = []
        for kind, noun in WORKLOADS:
            if namespace is None:
                list_call, scope = getattr(apps, f"list_{noun}_for_all_namespaces"), {}
            else:
                list_call = getattr(apps, f"list_namespaced_{noun}")
                scope = {"namespace": namespace}
            listed = await _list_or_say_why(api, f"{kind}s", where, source, list_call, scope)
            found += [{**item, "kind": kind} for item in listed]
        return Workloads(context, found)
    finally:
        await connection.close()


async def _list_or_say_why(
    api: Api,
    what: str,
    where: str,
    source: str,
    list_call: Callable[..., Awaitable[Any]],
    scope: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Every object of `list_call`, in pages as `Api.list_all` reads them; a refusal (401,
    403) says which permission to grant, rather than pointing at corral's own Role."""
    doing = f"listing {what} {where} ({source})"
    raw = getattr(list_call.__self__, list_call.__name__ + "_without_preload_content")  # type: ignore[attr-defined]

    def refused(exc: BaseException) -> bool:
        if isinstance(exc, client.ApiException) and exc.status in (401, 403):
            raise errors.ExecutorError(
                f"{doing}: forbidden ({exc.status}): {status_reason(exc)}; the identity needs"
                f" the verb list on {what.lower()} (API group apps) {where}"
            ) from None
        return False

    found: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = {"_continue": token} if token else {}
        data = await api.call(
            doing,
            lambda page=page: raw(**scope, **page, limit=LIST_PAGE, _request_timeout=api.timeout),  # type: ignore[misc]
            ok=refused,
        )
        found += items(data)
        token = ((data or {}).get("metadata") or {}).get("continue") or None
        if token is None:
            return found


def _context_name(settings: kubernetes_settings.KubernetesExecutorSettings) -> str:
    """The kubeconfig context `connect` used, or `in-cluster` for the pod's service account."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and settings.kubeconfig is None:
        return "in-cluster"
    if settings.context:
        return settings.context
    file = str(settings.kubeconfig) if settings.kubeconfig else None
    _, current = kube_config.list_kube_config_contexts(file)  # type: ignore[no-untyped-call]
    return str((current or {}).get("name") or "current")
