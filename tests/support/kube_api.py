"""A Kubernetes API server double, on a real HTTP port, driven by the real client.

It is kmock's KubernetesEmulator (HTTP server, URL parsing, discovery, Status errors, and
its DSL for injecting faults: `api["get /apis/batch/v1/..."][:2] << 503`) with the object
store replaced by one that keeps what corral relies on, each rule following the
Kubernetes API documentation (kubernetes.io/docs/reference/using-api/api-concepts/):

- every write stamps `metadata.uid` (create), `creationTimestamp`, `generation` and a
  cluster-wide increasing `resourceVersion`; lists carry the list's resourceVersion;
- a create answers 201; every created body is validated first (strict schema of the
  newest supported Kubernetes version, DNS-1123 names, label syntax) and refused with 422
  `Invalid`, then admission, and only then a taken name answers 409 with the
  `AlreadyExists` Status body; a Workflow is validated as Argo's minimal CRD does (kind,
  name, labels: its spec keeps any field), its controller refusing the rest;
- label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and the
  `metadata.name` / `metadata.namespace` field selectors;
- watch from a resourceVersion replays what changed after it; after `compact()`, a
  resourceVersion older than the history answers a 410 `Expired` ERROR event, a watch
  opened with `allowWatchBookmarks` gets a BOOKMARK (only a resourceVersion) after each
  `bookmark_every` seconds of quiet, and a watch ends after `timeoutSeconds`;
- every request it serves is kept in `calls` as RBAC authorises it (`Call`: API group,
  resource or subresource, verb, namespace), with the `update` of an owner's finalizers
  that an owner reference setting blockOwnerDeletion needs;
- delete honours preconditions (`uid`, `resourceVersion`: 409 `Conflict` when they
  differ), finalizers (sets `deletionTimestamp`, removes the object once they are
  gone) and `propagationPolicy` (Background and Foreground delete the object's dependents
  by ownerReferences, Orphan keeps them; a Job deleted with no policy orphans its pods,
  as batch/v1 does for compatibility);
- JSON merge patches (used for `spec.shutdown` and status injection);
- load shedding (`throttle`): 429 TooManyRequests (or 503) with a Retry-After header and
  `details.retryAfterSeconds`, as API Priority and Fairness answers;
- ConfigMaps and Secrets as core/v1 keeps them: no status, created, read, patched and
  garbage collected like any dependent (ownerReferences), their data at most 1 MiB (422
  beyond); a Secret's `stringData` is merged into its base64 `data` on every write (and
  never read back), a `data` value that is not base64 is 422; once `immutable`, their
  data cannot change (422), their metadata can;
- a pod's log (`pods/{name}/log`) as text/plain: the container's output so far (stdout and
  stderr together), `tailLines` its last lines, `limitBytes` at most that many bytes from
  the start of what is selected, `follow=true` a stream that goes on as the container
  writes and ends when it has ended (or its pod is gone); 400 for a container that has not
  started or is not the pod's, 404 for a pod that is not there.

`Kubelet`, `JobController` and `ArgoController` (below) move the objects as a cluster
would; the kubelet runs each pod's `main` container command as a local process, so an
executor's contract tests see real exit codes, logs and deadlines. A pod whose container
mounts a ConfigMap volume waits in ContainerCreating until the ConfigMap exists (unless
the volume is `optional`), as a kubelet does; the ConfigMap's keys then become files (of
the volume's `defaultMode`) in a folder of this machine, and, since a local process has no
container filesystem, an environment value naming a path under a `mountPath` is rewritten
to the same path under that folder. An environment variable read from a Secret
(`valueFrom.secretKeyRef`) gets the key's decoded value; until the Secret and its key
exist (unless `optional`) the pod stays Pending, its container waiting in
CreateContainerConfigError, as a kubelet keeps it. Other `valueFrom` sources read as "".
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import itertools
import json
import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import kmock
import kubernetes_validate
from aiohttp import web_request, web_runner, web_server
from kubernetes.aio import client

from corral import errors
from corral.executors import argo_manifest, kubernetes_manifest
from tests.support.wait import PATIENCE

JOBS = ("batch", "v1", "jobs")
PODS = ("", "v1", "pods")
WORKFLOWS = ("argoproj.io", "v1alpha1", "workflows")
CONFIGMAPS = ("", "v1", "configmaps")
SECRETS = ("", "v1", "secrets")
EVENTS = ("", "v1", "events")
DEPLOYMENTS = ("apps", "v1", "deployments")
STATEFULSETS = ("apps", "v1", "statefulsets")
KINDS = {
    JOBS: "Job",
    PODS: "Pod",
    WORKFLOWS: "Workflow",
    CONFIGMAPS: "ConfigMap",
    SECRETS: "Secret",
    EVENTS: "Event",
    DEPLOYMENTS: "Deployment",
    STATEFULSETS: "StatefulSet",
}
WITHOUT_STATUS = frozenset({CONFIGMAPS, SECRETS, EVENTS})
TRACKING = "batch.kubernetes.io/job-tracking"
"""The finalizer the Job controller puts on its pods: a pod stays (Terminating, when it is
deleted) until the controller has counted how it ended."""
DATA_BYTES = 1024 * 1024
"""The most a ConfigMap's or a Secret's data may hold."""
SCHEMA_VERSION = kubernetes_manifest.SUPPORTED_VERSIONS[-1]

Key = tuple[tuple[str, str, str], str, str]  # (resource, namespace, name)


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


BOOKMARK_SECONDS = 1.0
"""How long a watch opened with allowWatchBookmarks waits quiet before a BOOKMARK (an API
server sends one about once a minute; the double sooner, so a test sees one)."""
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
"""The RBAC verb of each HTTP method but GET (get, list or watch)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One API request as RBAC authorises it: the API group ("" for core), the resource
    (a subresource after a slash: `pods/log`), the verb and the namespace (None: all)."""

    group: str
    resource: str
    verb: str
    namespace: str | None

    @classmethod
    def of(cls, request: kmock.Request) -> Call | None:
        """The request's call; None for one that is no resource's (discovery, /version)."""
        res = request.resource
        if res is None or not res.plural:
            return None
        method = request.method.value
        if method != "GET":
            verb = VERBS.get(method, method.lower())
        elif request.params.get("watch") in ("true", "1"):
            verb = "watch"
        else:
            verb = "get" if request.name else "list"
        sub = f"/{request.subresource}" if request.subresource else ""
        return cls(res.group or "", f"{res.plural}{sub}", verb, request.namespace)


@dataclass(eq=False)
class _Watcher:
    resource: tuple[str, str, str]
    namespace: str | None
    matches: Callable[[Mapping[str, Any]], bool]
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class ApiError(kmock.KubernetesError):
    """A Status answer with Kubernetes' own reason and details."""


def status_error(code: int, reason: str, message: str, **details: Any) -> ApiError:
    return ApiError(status=code, reason=reason, message=message, details=details)


class KubeApi(kmock.KubernetesEmulator):  # type: ignore[misc]
    """The API double. Use as `async with KubeApi() as api, server(api) as served`."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for (group, version, plural), kind in KINDS.items():
            self.resources[f"{group}/{version}/{plural}"] = kmock.ResourceInfo(
                kind=kind,
                namespaced=True,
                verbs={"create", "get", "list", "watch", "delete", "patch"},
                subresources=set() if (group, version, plural) in WITHOUT_STATUS else {"status"},
            )
        self.store: dict[Key, dict[str, Any]] = {}
        self.rv = itertools.count(1000)
        self.last_rv = 999
        self.history: list[tuple[int, tuple[str, str, str], str, dict[str, Any]]] = []
        self.oldest_rv = 999  # watches from below this answer 410 Expired
        self.watchers: set[_Watcher] = set()
        self.frozen = False  # watches stay open but send nothing (a silently cut link)
        self.reply_lost: dict[tuple[str, str], int] = {}  # (verb, plural) -> count
        self.validators: dict[tuple[str, str, str], Callable[[dict[str, Any]], list[str]]] = {
            JOBS: _job_problems,
            PODS: _schema_problems,
            CONFIGMAPS: _schema_problems,
            SECRETS: _secret_problems,
            WORKFLOWS: _workflow_problems,
            DEPLOYMENTS: _schema_problems,
            STATEFULSETS: _schema_problems,
        }
        self.on_change: list[Callable[[str, tuple[str, str, str], dict[str, Any]], None]] = []
        self.admission: dict[tuple[str, str, str], tuple[str, str]] = {}  # resource -> denial
        self.logs: dict[tuple[str, str], bytearray] = {}  # (namespace, pod) -> its output
        self.calls: list[Call] = []  # every API request served, as RBAC reads it
        self.bookmark_every = BOOKMARK_SECONDS
        self.bookmarked: list[int] = []  # the resourceVersion of each BOOKMARK sent

    # kmock's emulator mutates its own store before routing; ours does it in the handlers.
    async def _handle(self, request: kmock.Request) -> Any:
        if (call := Call.of(request)) is not None:
            self.calls.append(call)
        return await kmock.KubernetesScaffold._handle(self, request)

    # --- direct access for tests and simulators ----------------------------------------

    def get(self, resource: tuple[str, str, str], namespace: str, name: str) -> dict[str, Any]:
        return self.store[(resource, namespace, name)]

    def find(
        self, resource: tuple[str, str, str], namespace: str, name: str
    ) -> dict[str, Any] | None:
        return self.store.get((resource, namespace, name))

    def objects(self, resource: tuple[str, str, str]) -> list[dict[str, Any]]:
        return [obj for (res, _, _), obj in self.store.items() if res == resource]

    def put(self, resource: tuple[str, str, str], obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object as the API server would (tests and controllers use this)."""
        return self._create(resource, obj["metadata"].get("namespace", "default"), obj)

    def patch(
        self, resource: tuple[str, str, str], namespace: str, name: str, change: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386), status included."""
        key = (resource, namespace, name)
        obj = self.store.get(key)
        if obj is None:
            raise _not_found(resource, name)
        merged = _merge(copy.deepcopy(obj), change)
        merged["metadata"]["uid"] = obj["metadata"]["uid"]
        if resource == SECRETS:
            _store_string_data(merged)
        _check_immutable(resource, obj, merged)
        return self._write(key, merged, "MODIFIED")

    def remove(
        self, resource: tuple[str, str, str], namespace: str, name: str, policy: str | None = None
    ) -> dict[str, Any]:
        return self._delete((resource, namespace, name), policy)

    def throttle(self, route: str, *, seconds: int, times: int, code: int = 429) -> None:
        """The next `times` requests of `route` (kmock's "verb /path") are refused as an API
        server shedding load refuses them (API Priority and Fairness): a 429 TooManyRequests
        Status (or a 503 ServiceUnavailable) with `Retry-After: seconds` and the same
        seconds in `details.retryAfterSeconds`."""
        reason = "TooManyRequests" if code == 429 else "ServiceUnavailable"
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Too many requests, please try again later.",
            "reason": reason,
            "details": {"retryAfterSeconds": seconds},
            "code": code,
        }
        self[route][:times] << code << kmock.headers({"Retry-After": str(seconds)}) << status

    def deny(self, resource: tuple[str, str, str], webhook: str, message: str) -> None:
        """A validating admission webhook that refuses every create of `resource` (403
        Forbidden, the API server's wording of a webhook's denial), until `allow`."""
        self.admission[resource] = (webhook, message)

    def allow(self, resource: tuple[str, str, str]) -> None:
        self.admission.pop(resource, None)

    def event(self, involved: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
        """A Warning event about `involved`, as a controller records one."""
        meta = involved["metadata"]
        return self._create(
            EVENTS,
            meta["namespace"],
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
                "involvedObject": {
                    "apiVersion": involved.get("apiVersion", "v1"),
                    "kind": involved.get("kind", ""),
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message,
                "type": "Warning",
                "count": 1,
                "firstTimestamp": now_text(),
                "lastTimestamp": now_text(),
                "source": {"component": "job-controller"},
            },
        )

    def compact(self) -> None:
        """Forget the change history, as etcd compaction does: older watches get 410."""
        self.history.clear()
        self.oldest_rv = self.last_rv + 1

    async def watched(self, within: float = PATIENCE) -> None:
        """Wait until some client has a watch open (it has listed and is listening)."""
        ends = asyncio.get_running_loop().time() + within
        while not self.watchers:
            assert asyncio.get_running_loop().time() < ends, "no watch was opened"
            await asyncio.sleep(0.02)

    def end_watches(self) -> None:
        """Close every open watch stream from the server side."""
        for watcher in list(self.watchers):
            watcher.queue.put_nowait(None)

    # --- the store ------------------------------------------------------------------------

    def _create(
        self, resource: tuple[str, str, str], namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
            meta["name"] = name
        meta["namespace"] = namespace
        key = (resource, namespace, name)
        # The API server's order: the object's validation, then validating admission, and
        # only then storage, where a taken name is 409.
        problems = self.validators.get(resource, lambda _: [])(obj)
        if problems:
            raise status_error(
                422,
                "Invalid",
                f'{KINDS[resource]}.{resource[0] or "core"} "{name}" is invalid: {problems[0]}',
                name=name,
                kind=KINDS[resource],
                causes=[{"reason": "FieldValueInvalid", "message": p} for p in problems],
            )
        if resource in self.admission:
            webhook, message = self.admission[resource]
            raise status_error(
                403,
                "Forbidden",
                f'admission webhook "{webhook}" denied the request: {message}',
                name=name,
                kind=resource[2],
            )
        if key in self.store:
            group = resource[0]
            raise status_error(
                409,
                "AlreadyExists",
                f'{resource[2]}{"." + group if group else ""} "{name}" already exists',
                name=name,
                group=group,
                kind=resource[2],
            )
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_text()
        meta["generation"] = 1
        if resource not in WITHOUT_STATUS:
            obj.setdefault("status", {})
        if resource == JOBS:
            _default_job(obj)
        if resource == SECRETS:
            _store_string_data(obj)
        return self._write(key, obj, "ADDED")

    def _write(self, key: Key, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        rv = next(self.rv)
        self.last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        if kind == "DELETED":
            self.store.pop(key, None)
        else:
            meta = obj["metadata"]
            if meta.get("deletionTimestamp") and not meta.get("finalizers") and not _running(obj):
                return self._write(key, obj, "DELETED")
            self.store[key] = obj
        snapshot = copy.deepcopy(obj)
        self.history.append((rv, key[0], kind, snapshot))
        for watcher in list(self.watchers):
            wanted = watcher.resource == key[0] and watcher.namespace in (None, key[1])
            if wanted and watcher.matches(snapshot):
                watcher.queue.put_nowait({"type": kind, "object": snapshot})
        for hook in list(self.on_change):
            hook(kind, key[0], snapshot)
        return obj

    def _delete(self, key: Key, policy: str | None) -> dict[str, Any]:
        obj = self.store.get(key)
        if obj is None:
            raise _not_found(key[0], key[2])
        if policy is None:
            policy = "Orphan" if key[0] == JOBS else "Background"
        uid = obj["metadata"]["uid"]
        meta = obj["metadata"]
        if policy == "Foreground":
            meta.setdefault("finalizers", [])
            if "foregroundDeletion" not in meta["finalizers"]:
                meta["finalizers"].append("foregroundDeletion")
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now_text()
        last = self._write(key, copy.deepcopy(obj), "MODIFIED")
        for dep_key, dep in list(self.store.items()):
            owners = dep["metadata"].get("ownerReferences") or []
            if not any(o.get("uid") == uid for o in owners):
                continue
            if policy == "Orphan":
                rest = [o for o in owners if o.get("uid") != uid]
                self.patch(
                    dep_key[0],
                    dep_key[1],
                    dep_key[2],
                    {"metadata": {"ownerReferences": rest or None}},
                )
            else:
                with contextlib.suppress(ApiError):
                    self._delete(dep_key, "Background")
        if policy == "Foreground" and key in self.store:
            finalizers = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
            last = self.patch(
                key[0], key[1], key[2], {"metadata": {"finalizers": finalizers or None}}
            )
        return last

    # --- HTTP handlers (kmock's fallbacks: injected reactions come first) --------------------

    def _resource(self, request: kmock.Request) -> tuple[str, str, str]:
        res = request.resource
        triple = (res.group or "", res.version or "", res.plural or "")
        if triple not in KINDS:
            raise kmock.KubernetesResourceNotFoundError()
        return triple

    def _lost(self, verb: str, resource: tuple[str, str, str]) -> None:
        left = self.reply_lost.get((verb, resource[2]), 0)
        if left:
            self.reply_lost[(verb, resource[2])] = left - 1
            raise status_error(
                504, "Timeout", "Timeout: request did not complete within requested timeout"
            )

    def _note_owner_checks(self, body: Mapping[str, Any], namespace: str) -> None:
        """The OwnerReferencesPermissionEnforcement admission plugin's checks: an owner
        reference that sets blockOwnerDeletion needs `update` on its owner's finalizers,
        kept in `calls` as the request's own."""
        for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
            owner = next((r for r, kind in KINDS.items() if kind == ref.get("kind")), None)
            if owner is not None and ref.get("blockOwnerDeletion"):
                self.calls.append(Call(owner[0], f"{owner[2]}/finalizers", "update", namespace))

    async def _serve_create(self, request: kmock.Request) -> Any:
        resource = self._resource(request)
        body = request.data if isinstance(request.data, dict) else {}
        namespace = request.namespace or body.get("metadata", {}).get("namespace") or "default"
        self._note_owner_checks(body, namespace)
        created = self._create(resource, namespace, body)
        self._lost("create", resource)  # stored, but the answer never arrives
        return kmock.Response(status=201, payload=created)

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        resource = self._resource(request)
        if resource == PODS and request.subresource == "log":
            return self._serve_log(request)
        obj = self.store.get((resource, request.namespace or "default", request.name or ""))
        if obj is None:
            raise _not_found(resource, request.name or "")
        return obj

    async def _serve_list(self, request: kmock.Request) -> Any:
        resource = self._resource(request)
        matches = _matcher(request.params)
        items = [
            obj
            for (res, ns, _), obj in sorted(self.store.items())
            if res == resource and request.namespace in (None, ns) and matches(obj)
        ]
        group, version, _ = resource
        meta: dict[str, Any] = {"resourceVersion": str(self.last_rv)}
        limit, start = (
            int(request.params.get("limit") or 0),
            int(request.params.get("continue") or 0),
        )
        if limit:  # pages: the continue token here is just the offset of the next one
            items, rest = items[start : start + limit], items[start + limit :]
            if rest:
                meta["continue"] = str(start + limit)
        return {
            "apiVersion": f"{group}/{version}" if group else version,
            "kind": KINDS[resource] + "List",
            "metadata": meta,
            "items": items,
        }

    def _serve_log(self, request: kmock.Request) -> kmock.Response:
        namespace, name = request.namespace or "default", request.name or ""
        pod = self.store.get((PODS, namespace, name))
        if pod is None:
            raise _not_found(PODS, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = request.params.get("container") or names[0]
        if container not in names:
            raise status_error(
                400, "BadRequest", f"container {container} is not valid for pod {name}"
            )
        if (namespace, name) not in self.logs:
            reason = _pending_reason(pod.get("status") or {}) or "ContainerCreating"
            raise status_error(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: {reason}',
            )
        tail = request.params.get("tailLines")
        limit = int(request.params.get("limitBytes") or 0)
        data = log_part(bytes(self.logs[(namespace, name)]), tail, limit)
        payload: Any = data
        if request.params.get("follow") == "true":
            at = len(self.logs[(namespace, name)])  # what `data` was selected from
            payload = self._follow_log(namespace, name, data, at, limit)
        return kmock.Response(payload=payload, headers={"Content-Type": "text/plain"})

    async def _follow_log(
        self, namespace: str, name: str, first: bytes, at: int, limit: int
    ) -> AsyncIterator[bytes]:
        """What a followed log sends: what was selected, then each new write, until the
        container has ended (or its pod is gone) and all of it is sent, or `limit` bytes."""
        sent = len(first)
        yield first
        while not limit or sent < limit:
            pod = self.store.get((PODS, namespace, name))
            ended = pod is None or _terminal(pod)
            log = self.logs[(namespace, name)]
            if len(log) > at:
                chunk = bytes(log[at : at + (limit - sent if limit else len(log))])
                at, sent = at + len(chunk), sent + len(chunk)
                yield chunk
            elif ended:
                return
            else:
                await asyncio.sleep(0.02)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        resource = self._resource(request)
        matches = _matcher(request.params)
        since = request.params.get("resourceVersion")
        timeout = float(request.params.get("timeoutSeconds") or 1800)
        watcher = _Watcher(resource, request.namespace, matches)
        yield b""
        while self.frozen:  # a silent link: the request is open, nothing comes back
            await asyncio.sleep(0.05)
        if since not in (None, "", "0") and int(since) < self.oldest_rv - 1:
            yield {"type": "ERROR", "object": _expired(since, self.oldest_rv)}
            return
        if since in (None, "", "0"):
            backlog = [
                {"type": "ADDED", "object": copy.deepcopy(obj)}
                for (res, ns, _), obj in sorted(self.store.items())
                if res == resource and request.namespace in (None, ns) and matches(obj)
            ]
        else:
            backlog = [
                {"type": kind, "object": copy.deepcopy(obj)}
                for rv, res, kind, obj in self.history
                if rv > int(since) and res == resource and matches(obj)
                if request.namespace in (None, obj["metadata"].get("namespace"))
            ]
        bookmarks = request.params.get("allowWatchBookmarks") == "true"
        self.watchers.add(watcher)
        try:
            for event in backlog:
                yield event
            loop = asyncio.get_running_loop()
            ends = loop.time() + timeout
            while (left := ends - loop.time()) > 0:
                quiet = min(left, self.bookmark_every) if bookmarks else left
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), quiet)
                except TimeoutError:
                    if bookmarks and not self.frozen and loop.time() < ends:
                        yield self._bookmark(resource)
                    continue
                if event is None:
                    return
                while self.frozen:  # a silent link: nothing arrives, nothing ends
                    await asyncio.sleep(0.05)
                yield event
        finally:
            self.watchers.discard(watcher)

    def _bookmark(self, resource: tuple[str, str, str]) -> dict[str, Any]:
        """A BOOKMARK: the watched kind with only a resourceVersion, the newest the server
        has sent this watch everything up to (its queue is empty when one is sent)."""
        group, version, _ = resource
        self.bookmarked.append(self.last_rv)
        obj = {
            "kind": KINDS[resource],
            "apiVersion": f"{group}/{version}" if group else version,
            "metadata": {"resourceVersion": str(self.last_rv)},
        }
        return {"type": "BOOKMARK", "object": obj}

    async def _serve_update(self, request: kmock.Request) -> Any:
        resource = self._resource(request)
        change = request.data if isinstance(request.data, dict) else {}
        self._note_owner_checks(change, request.namespace or "default")
        if request.method.value == "PUT":
            obj = self.get(resource, request.namespace or "default", request.name or "")
            change = {
                **change,
                "metadata": {**change.get("metadata", {}), "uid": obj["metadata"]["uid"]},
            }
        return self.patch(resource, request.namespace or "default", request.name or "", change)

    async def _serve_delete(self, request: kmock.Request) -> Any:
        resource = self._resource(request)
        options = request.data if isinstance(request.data, dict) else {}
        policy = options.get("propagationPolicy") or request.params.get("propagationPolicy")
        if options.get("orphanDependents") is True:
            policy = "Orphan"
        key = (resource, request.namespace or "default", request.name or "")
        _check_preconditions(key, self.store.get(key), options.get("preconditions") or {})
        self._delete(key, policy)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Success",
            "details": {"name": key[2]},
        }


# --- rules -----------------------------------------------------------------------------------


def _running(obj: Mapping[str, Any]) -> bool:
    """A pod whose container runs: deleted, it stays (Terminating) until the kubelet has
    stopped it, SIGTERM then SIGKILL after its grace, as the API server's graceful deletion
    keeps it; then its terminal status removes it."""
    return obj.get("kind") == "Pod" and (obj.get("status") or {}).get("phase") == "Running"


def _not_found(resource: tuple[str, str, str], name: str) -> ApiError:
    group = resource[0]
    return status_error(
        404,
        "NotFound",
        f'{resource[2]}{"." + group if group else ""} "{name}" not found',
        name=name,
        group=group,
        kind=resource[2],
    )


def log_part(data: bytes, tail: str | None, limit: int) -> bytes:
    """The part of a log a read selects: its last `tail` lines, then at most `limit`
    bytes from their start (0: all), as the kubelet cuts it."""
    if tail is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[len(lines) - int(tail) :]) if int(tail) > 0 else b""
    return data[:limit] if limit else data


def _check_preconditions(key: Key, obj: dict[str, Any] | None, wanted: Mapping[str, Any]) -> None:
    """A delete's preconditions (uid, resourceVersion): 409 Conflict when the object differs."""
    if obj is None:
        raise _not_found(key[0], key[2])
    for field_name, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        want, have = wanted.get(field_name), obj["metadata"].get(field_name)
        if want is not None and want != have:
            raise status_error(
                409,
                "Conflict",
                f"Precondition failed: {label} in precondition: {want}, {label} in object meta:"
                f" {have}",
                name=key[2],
                kind=key[0][2],
            )


def _expired(since: str, oldest: int) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {since} ({oldest})",
        "reason": "Expired",
        "code": 410,
    }


def _schema_problems(obj: dict[str, Any]) -> list[str]:
    doc = {k: v for k, v in obj.items() if k != "status"}
    try:
        kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "(top)"
        return [f"{where}: {exc.message}"]
    return kubernetes_manifest.manifest_problems(doc)


def _job_problems(obj: dict[str, Any]) -> list[str]:
    """A Job's schema, then batch/v1's rule that a podFailurePolicy needs
    podReplacementPolicy Failed (a pod is replaced only once it has ended)."""
    if problems := _schema_problems(obj):
        return problems
    spec = obj.get("spec") or {}
    policy = spec.get("podReplacementPolicy")
    if spec.get("podFailurePolicy") and policy not in (None, "Failed"):
        return [
            f'spec.podReplacementPolicy: Unsupported value: "{policy}": supported values: "Failed"'
        ]
    return []


def _secret_problems(obj: dict[str, Any]) -> list[str]:
    """A Secret's schema, then what the API server checks of its data: each `data` value
    base64, and the decoded values with `stringData`'s at most DATA_BYTES."""
    if problems := _schema_problems(obj):
        return problems
    size = 0
    for key, value in (obj.get("data") or {}).items():
        try:
            size += len(base64.b64decode(str(value), validate=True))
        except binascii.Error:
            return [f"data[{key}]: illegal base64 data"]
    size += sum(len(str(v).encode("utf-8")) for v in (obj.get("stringData") or {}).values())
    if size > DATA_BYTES:
        return [f"data: Too long: must have at most {DATA_BYTES} bytes ({size} given)"]
    return []


def _store_string_data(secret: dict[str, Any]) -> None:
    """As the API server writes a Secret: `stringData` merged into `data`, base64, and gone."""
    given = secret.pop("stringData", None) or {}
    if given:
        data = secret.setdefault("data", {})
        for key, value in given.items():
            data[key] = base64.b64encode(str(value).encode("utf-8")).decode("ascii")


def _check_immutable(
    resource: tuple[str, str, str], before: Mapping[str, Any], after: Mapping[str, Any]
) -> None:
    """An immutable ConfigMap's or Secret's data (and immutability) cannot change: 422."""
    if resource not in (CONFIGMAPS, SECRETS) or not before.get("immutable"):
        return
    for part in ("data", "binaryData", "immutable"):
        if before.get(part) != after.get(part):
            name = before["metadata"]["name"]
            raise status_error(
                422,
                "Invalid",
                f'{KINDS[resource]} "{name}" is invalid: {part}: Forbidden: field is'
                " immutable when `immutable` is set",
                name=name,
                kind=KINDS[resource],
            )


def _workflow_problems(obj: dict[str, Any]) -> list[str]:
    """What the API server refuses of a Workflow under Argo's minimal CRD, whose spec keeps
    any field (x-kubernetes-preserve-unknown-fields): the kind, and the name and label
    rules of every object. The rest is the controller's to find (`_spec_problems`)."""
    kind = (obj.get("apiVersion"), obj.get("kind"))
    if kind != (argo_manifest.API_VERSION, "Workflow"):
        return [
            f"apiVersion/kind: must be {argo_manifest.API_VERSION}/Workflow, not {kind[0]}/{kind[1]}"
        ]
    return kubernetes_manifest.manifest_problems(obj)


def _spec_problems(wf: Mapping[str, Any]) -> list[str]:
    """What Argo's controller finds wrong with a Workflow it takes up, as its validation
    words it: a field its schema has not (hera's models of it, strictly), a label of
    Argo's own, an entrypoint that names no template."""
    sent = ("name", "namespace", "labels", "annotations")  # not what the API server added
    meta = {k: v for k, v in wf["metadata"].items() if k in sent}
    try:
        argo_manifest.check_workflow(
            {k: v for k, v in wf.items() if k != "status"} | {"metadata": meta}
        )
    except errors.InvalidInput as exc:
        return [str(exc)]
    spec = wf["spec"]
    if spec.get("entrypoint") not in {t.get("name") for t in spec.get("templates") or []}:
        return [f"spec.entrypoint template '{spec.get('entrypoint')}' undefined"]
    return []


def _default_job(job: dict[str, Any]) -> None:
    """What the API server adds to a Job: a selector on its uid, and labels to match."""
    uid = job["metadata"]["uid"]
    name = job["metadata"]["name"]
    added = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    spec = job.setdefault("spec", {})
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **added}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: null removes a key, maps merge, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[A-Za-z0-9_.-]*))?\s*$"
)


def parse_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A label selector as the API server reads it: requirements joined by commas."""
    parts = [p for p in _split_selector(text) if p.strip()]
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for part in parts:
        m = _REQUIREMENT.match(part)
        if not m:
            raise status_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
        key, op, value, neg = m["key"], (m["op"] or "").strip(), m["value"], m["neg"]
        if neg:
            tests.append(lambda labels, k=key: k not in labels)
        elif not op:
            tests.append(lambda labels, k=key: k in labels)
        elif op in ("=", "=="):
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        else:
            values = {v.strip() for v in value.strip("()").split(",")}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
    return lambda labels: all(t(labels) for t in tests)


def _split_selector(text: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def _matcher(params: Mapping[str, str]) -> Callable[[Mapping[str, Any]], bool]:
    labels = parse_selector(params.get("labelSelector", ""))
    fields: list[tuple[str, str, str]] = []
    for part in filter(None, params.get("fieldSelector", "").split(",")):
        m = re.match(
            r"^(metadata\.name|metadata\.namespace|involvedObject\.uid|involvedObject\.name)"
            r"\s*(==|=|!=)\s*(.*)$",
            part,
        )
        if not m:
            raise status_error(400, "BadRequest", f'field label not supported: "{part}"')
        fields.append((m[1], m[2], m[3]))

    def matches(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        if not labels(meta.get("labels") or {}):
            return False
        return all((_field(obj, name) == value) == (op != "!=") for name, op, value in fields)

    return matches


def _field(obj: Mapping[str, Any], dotted: str) -> Any:
    top, _, name = dotted.partition(".")
    return (obj.get(top) or {}).get(name)


# --- the cluster ----------------------------------------------------------------------------


def container_status(state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    """A core/v1 ContainerStatus of the `main` container, with every required field."""
    return {
        "name": "main",
        "image": "busybox:1.36",
        "imageID": "docker.io/library/busybox@sha256:0",
        "restartCount": 0,
        "ready": ready,
        "state": state,
    }


class _Controller:
    """Something that works in the background of the cluster: its tasks end at close."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class Kubelet(_Controller):
    """Runs each pod's `main` container command as a local process and reports it in the
    pod's status. Deleting a pod stops its process: SIGTERM, then SIGKILL after the grace;
    the pod stays Terminating meanwhile when a finalizer holds it (a Job's pods), and ends
    Failed with the exit code (143 for SIGTERM). A pod deleted before it started ends
    Failed at once.

    A pod can be kept from starting, as a cluster keeps it, Pending with the reason:
    `no_nodes` (a scheduler's message: PodScheduled False, Unschedulable) for every pod,
    `bad_images` (image -> (reason, message): ErrImagePull, InvalidImageName...) for the
    pods of those images. Clearing them lets the waiting pods start."""

    def __init__(self, api: KubeApi, *, start_delay: float = 0.0) -> None:
        super().__init__(api)
        self.start_delay = start_delay
        self.hold = False  # pods stay Pending (no node)
        self.closing = False  # every pod reads as gone: nothing more starts
        self.no_nodes: str | None = None
        self.bad_images: dict[str, tuple[str, str]] = {}
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.oom: set[str] = set()  # pods the "kernel" killed: their status is set already
        self.volumes: dict[str, Path] = {}  # by pod: the folder its volumes are mounted in
        api.on_change.append(self._changed)

    def _changed(self, kind: str, resource: tuple[str, str, str], obj: dict[str, Any]) -> None:
        if resource != PODS:
            return
        name = obj["metadata"]["name"]
        proc = self.procs.get(name)
        going = obj["metadata"].get("deletionTimestamp") or kind == "DELETED"
        if kind == "ADDED":
            self._spawn(self._run(obj))
        elif going and proc is not None and proc.returncode is None:
            grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
            self._spawn(_stop(proc, grace))
        elif going and proc is None and kind != "DELETED":
            self._spawn(self._never_started(obj))
        elif _terminal(obj) and proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # failed under it: a node lost
                os.killpg(proc.pid, signal.SIGKILL)

    async def _never_started(self, pod: dict[str, Any]) -> None:
        """A pod deleted before its container started: Failed, nothing to stop."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        found = self.api.find(PODS, ns, name)
        if found is None or name in self.procs:
            return
        if found.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self.api.patch(PODS, ns, name, {"status": {"phase": "Failed"}})

    def _gone(self, ns: str, name: str) -> bool:
        """Whether the pod is gone or going (deleted: a finalizer may keep it a while), or
        the kubelet is closing."""
        found = self.api.find(PODS, ns, name)
        return self.closing or found is None or bool(found["metadata"].get("deletionTimestamp"))

    def _held_status(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Pending status that keeps the pod from starting now, or None."""
        if self.no_nodes is not None:
            unscheduled = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": self.no_nodes,
            }
            return {"phase": "Pending", "conditions": [unscheduled]}
        image = pod["spec"]["containers"][0].get("image", "")
        if image in self.bad_images:
            reason, message = self.bad_images[image]
            waiting = container_status({"waiting": {"reason": reason, "message": message}})
            return {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [waiting],
            }
        return None

    async def _held(self, pod: dict[str, Any]) -> None:
        """Keep the pod Pending, saying why, while something keeps it from starting."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        told = None
        while not self._gone(ns, name) and (status := self._held_status(pod)) is not None:
            if status != told:
                told = status
                self.api.patch(PODS, ns, name, {"status": status})
            await asyncio.sleep(0.05)
        if told is not None and not self._gone(ns, name):
            scheduled = [{"type": "PodScheduled", "status": "True"}]
            self.api.patch(PODS, ns, name, {"status": {"conditions": scheduled}})

    async def _run(self, pod: dict[str, Any]) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        await asyncio.sleep(self.start_delay)
        while self.hold and not self.closing:
            await asyncio.sleep(0.05)
        await self._held(pod)
        if self._gone(ns, name):
            return
        mounts = await self._mount(pod)
        if mounts is None:  # the pod went while it waited for its volumes
            return
        try:
            env = await self._environment(pod, mounts)
            if env is not None:  # else the pod went while it waited for its Secrets
                await self._start(pod, env)
        finally:
            if (folder := self.volumes.pop(name, None)) is not None:
                shutil.rmtree(folder, ignore_errors=True)

    async def _mount(self, pod: dict[str, Any]) -> dict[str, Path] | None:
        """The `main` container's ConfigMap volumes, each as a folder of this machine by
        its mountPath, once every ConfigMap they need exists: until then the pod is
        Pending, its container waiting in ContainerCreating. None if the pod went first."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        wanted = [
            (mount["mountPath"], volumes[mount["name"]]["configMap"])
            for mount in pod["spec"]["containers"][0].get("volumeMounts") or []
            if "configMap" in volumes.get(mount["name"], {})
        ]
        waiting = False
        while True:
            if self._gone(ns, name):
                return None
            found = [self.api.find(CONFIGMAPS, ns, source["name"]) for _, source in wanted]
            missing = [
                src["name"]
                for cm, (_, src) in zip(found, wanted, strict=True)
                if cm is None and not src.get("optional")
            ]
            if not missing:
                break
            if not waiting:
                waiting = True
                self._waiting(ns, name, "ContainerCreating")
            await asyncio.sleep(0.05)
        return self._materialise(name, wanted, found)

    async def _environment(
        self, pod: dict[str, Any], mounts: Mapping[str, Path]
    ) -> dict[str, str] | None:
        """The `main` container's environment, once every Secret (and key) it reads
        exists: until then the pod is Pending, its container waiting in
        CreateContainerConfigError with what is missing. None if the pod went first."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        entries = pod["spec"]["containers"][0].get("env") or []
        told = None
        while not self._gone(ns, name):
            env, missing = _resolve_env(entries, lambda n: self.api.find(SECRETS, ns, n), mounts)
            if missing is None:
                return env
            if missing != told:
                told = missing
                self._waiting(ns, name, "CreateContainerConfigError", missing)
            await asyncio.sleep(0.05)
        return None

    def _waiting(self, ns: str, name: str, reason: str, message: str | None = None) -> None:
        """The pod Pending, its container waiting for `reason`."""
        waiting = {"reason": reason, **({"message": message} if message else {})}
        status = container_status({"waiting": waiting})
        self.api.patch(
            PODS, ns, name, {"status": {"phase": "Pending", "containerStatuses": [status]}}
        )

    def _materialise(
        self,
        pod: str,
        wanted: list[tuple[str, dict[str, Any]]],
        found: list[dict[str, Any] | None],
    ) -> dict[str, Path]:
        if not wanted:
            return {}
        root = Path(tempfile.mkdtemp(prefix=f"{pod}-volumes-"))
        self.volumes[pod] = root
        mounts = {}
        for n, ((path, source), config_map) in enumerate(zip(wanted, found, strict=True)):
            folder = root / str(n)
            folder.mkdir()
            for key, value in ((config_map or {}).get("data") or {}).items():
                (folder / key).write_text(value, encoding="utf-8")
                (folder / key).chmod(source.get("defaultMode", 0o644))
            mounts[path] = folder
        return mounts

    async def _start(self, pod: dict[str, Any], given: Mapping[str, str]) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        env = {**os.environ, **given}
        command = container.get("command", []) + container.get("args", [])
        started = now_text()
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._terminated(ns, name, 128, "StartError", str(exc), started)
            return
        self.procs[name] = proc
        if self.closing:  # started as the kubelet closed: it ends now, with the others
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.api.patch(
            PODS,
            ns,
            name,
            {
                "status": {
                    "phase": "Running",
                    "startTime": started,
                    "containerStatuses": [
                        container_status({"running": {"startedAt": started}}, ready=True)
                    ],
                }
            },
        )
        out = self.api.logs.setdefault((ns, name), bytearray())
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65_536):
            out += chunk
        await proc.wait()
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        log = bytes(out).decode(errors="replace")
        policy = container.get("terminationMessagePolicy")
        message = log[-2048:] if code and policy == "FallbackToLogsOnError" else ""
        reason = "Completed" if code == 0 else "Error"
        self._terminated(ns, name, code, reason, message, started)

    def _terminated(
        self, ns: str, name: str, code: int, reason: str, message: str, started: str
    ) -> None:
        found = self.api.find(PODS, ns, name)
        if found is None or name in self.oom or _terminal(found):  # a phase ends once
            return
        state = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now_text()}
        if message:
            state["message"] = message
        self.api.patch(
            PODS,
            ns,
            name,
            {
                "status": {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [container_status({"terminated": state})],
                }
            },
        )

    def end(self, ns: str, name: str, code: int) -> None:
        """The container ends now with `code`, as if it had exited: its status says so at
        once (its process, if any, is killed under it)."""
        reason = "Completed" if code == 0 else "Error"
        self._terminated(ns, name, code, reason, "", now_text())

    def oom_kill(self, ns: str, name: str) -> None:
        """The kernel kills the container for memory: exit 137, reason OOMKilled."""
        self.oom.add(name)
        proc = self.procs.get(name)
        if proc and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.api.patch(
            PODS,
            ns,
            name,
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        container_status({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
                    ],
                }
            },
        )

    async def close(self) -> None:
        """Kill what still runs and let each `_run` see its process end (or its pod read as
        gone), so every pipe and transport is closed before the event loop goes."""
        self.closing = True
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        waits = [asyncio.wait_for(p.wait(), 5) for p in self.procs.values()]
        await asyncio.gather(*waits, return_exceptions=True)
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=PATIENCE)
        await super().close()


def _resolve_env(
    entries: list[dict[str, Any]],
    secret: Callable[[str], dict[str, Any] | None],
    mounts: Mapping[str, Path],
) -> tuple[dict[str, str], str | None]:
    """A container's `env` as its process gets it, and what keeps it from starting (a
    Secret or a key that is missing and not optional), as the kubelet words it; None when
    nothing does."""
    env = {}
    for entry in entries:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            env[entry["name"]] = _in_mounts(entry.get("value", ""), mounts)
            continue
        found = secret(ref["name"])
        data = (found or {}).get("data") or {}
        if ref["key"] in data:
            env[entry["name"]] = base64.b64decode(data[ref["key"]]).decode("utf-8")
        elif ref.get("optional"):
            continue
        elif found is None:
            return env, f'secret "{ref["name"]}" not found'
        else:
            return env, f"couldn't find key {ref['key']} in Secret {ref['name']}"
    return env, None


def _in_mounts(value: str, mounts: Mapping[str, Path]) -> str:
    """`value`, a path under a mountPath made the same path under its local folder."""
    for path, folder in mounts.items():
        base = path.rstrip("/")
        if value == base or value.startswith(base + "/"):
            return str(folder) + value[len(base) :]
    return value


async def _stop(proc: asyncio.subprocess.Process, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class JobController(_Controller):
    """The Job controller as batch/v1 documents it, for one-pod Jobs with backoffLimit 0:
    a pod per Job; `Complete` when it succeeds; `Failed` (BackoffLimitExceeded) when it
    fails, unless a podFailurePolicy rule matches: `Ignore` (then a new pod, the Job
    lives), `FailJob` (Failed, PodFailurePolicy); `Failed` (DeadlineExceeded) once
    activeDeadlineSeconds pass; and the TTL-after-finished controller's delete once
    `ttlSecondsAfterFinished` pass.

    A Job's end comes in two steps, as since Kubernetes 1.31: once it is decided the Job
    gets `SuccessCriteriaMet` or `FailureTarget`, its pods that still run are deleted (each
    Terminating for its grace), and only once every pod has ended does it get `Complete`
    or `Failed`, the conditions that say it finished. A pod replaced under an `Ignore`
    rule is replaced once it has ended (Failed), never while it is Terminating
    (podReplacementPolicy: Failed, the only policy a podFailurePolicy allows); meanwhile
    the Job counts it in `status.terminating`.

    Its pods carry the job-tracking finalizer (TRACKING), removed once the controller has
    counted how a pod ended: a pod deleted under a running Job (`kubectl delete pod`) is
    Terminating until its container ends (143 on SIGTERM), then fails the Job, then goes.
    A pod the API server refuses (admission) is a FailedCreate event on the Job with the
    refusal's message, and the controller tries again until it is made or the Job ends."""

    def __init__(self, api: KubeApi, *, ttl_enabled: bool = True) -> None:
        super().__init__(api)
        self.ttl_enabled = ttl_enabled
        api.on_change.append(self._changed)

    def _changed(self, kind: str, resource: tuple[str, str, str], obj: dict[str, Any]) -> None:
        if resource == JOBS and kind == "ADDED":
            self._pod_for(obj)
            self._spawn(self._deadline(obj))
        elif resource == PODS and kind == "MODIFIED":
            owner = _owner(obj, "Job")
            if owner is not None:
                self._pod_changed(obj, owner)
        elif resource == PODS and kind == "DELETED":
            owner = _owner(obj, "Job")
            job = self._job(obj["metadata"]["namespace"], owner) if owner else None
            if job is not None:
                self._settle(job)

    def _pod_for(self, job: dict[str, Any]) -> dict[str, Any] | None:
        meta, template = job["metadata"], job["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": meta["name"] + "-",
                "namespace": meta["namespace"],
                "labels": dict(template["metadata"].get("labels", {})),
                "finalizers": [TRACKING],
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]),
        }
        try:
            made = self.api.put(PODS, pod)
        except ApiError as exc:
            self.api.event(job, "FailedCreate", f"Error creating: {exc.message}")
            self._spawn(self._create_again(job))
            return None
        self._job_status(
            job, {"active": 1, "startTime": job["status"].get("startTime") or now_text()}
        )
        return made

    async def _create_again(self, job: dict[str, Any], pause: float = 0.2) -> None:
        await asyncio.sleep(pause)
        meta = job["metadata"]
        now = self._job(meta["namespace"], meta["name"])
        if now is None or now["metadata"]["uid"] != meta["uid"] or _decided(now):
            return
        if not now["metadata"].get("deletionTimestamp") and not self.pods_of(now):
            self._pod_for(now)

    def _job(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.api.find(JOBS, ns, name)

    def _job_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        meta = job["metadata"]
        if self._job(meta["namespace"], meta["name"]) is not None:
            self.api.patch(JOBS, meta["namespace"], meta["name"], {"status": status})

    def _pod_changed(self, pod: dict[str, Any], owner: str) -> None:
        if TRACKING not in (pod["metadata"].get("finalizers") or []):
            return  # counted already
        phase = pod.get("status", {}).get("phase")
        if pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
            self._count_terminating(pod, owner)
        self._count(pod, owner, phase)
        job = self._job(pod["metadata"]["namespace"], owner)
        orphan = job is None or _finished(job) or bool(job["metadata"].get("deletionTimestamp"))
        if phase in ("Succeeded", "Failed") or (
            orphan and pod["metadata"].get("deletionTimestamp")
        ):
            # counted, or its Job is gone or ended: the pod may go
            meta = pod["metadata"]
            rest = [f for f in meta.get("finalizers") or [] if f != TRACKING]
            with contextlib.suppress(ApiError):
                self.api.patch(
                    PODS,
                    meta["namespace"],
                    meta["name"],
                    {"metadata": {"finalizers": rest or None}},
                )

    def _count_terminating(self, pod: dict[str, Any], owner: str) -> None:
        """A pod being deleted that still runs: the Job counts it as terminating, not
        active, until it has ended."""
        job = self._job(pod["metadata"]["namespace"], owner)
        if job is not None and not _decided(job) and job["status"].get("terminating") != 1:
            self._job_status(job, {"active": 0, "ready": 0, "terminating": 1})

    def _count(self, pod: dict[str, Any], owner: str, phase: str | None) -> None:
        job = self._job(pod["metadata"]["namespace"], owner)
        if job is None or _finished(job):
            return
        if _decided(job):
            self._settle(job)
            return
        if phase == "Running" and not pod["metadata"].get("deletionTimestamp"):
            self._job_status(job, {"ready": 1})
        elif phase == "Succeeded":
            self._finish(job, "Complete", None, succeeded=1)
        elif phase == "Failed":
            action = _policy_action(job, pod)
            if action == "Ignore":  # replaced only now it has ended (podReplacementPolicy)
                self._job_status(job, {"active": 0, "ready": 0, "terminating": 0})
                self._pod_for(job)
            elif action == "FailJob":
                self._finish(job, "Failed", "PodFailurePolicy", failed=1)
            else:
                self._finish(job, "Failed", "BackoffLimitExceeded", failed=1)

    def _finish(self, job: dict[str, Any], kind: str, reason: str | None, **counts: int) -> None:
        """The Job's end is decided (`kind`, Complete or Failed): its interim condition now,
        its pods that still run deleted, and `kind` once every pod has ended (`_settle`)."""
        interim = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
        condition = {
            "type": interim,
            "status": "True",
            "lastTransitionTime": now_text(),
            "reason": reason or interim,
        }
        self._job_status(job, {"conditions": [condition], "active": 0, "ready": 0, **counts})
        for pod in self.pods_of(job):
            if not _terminal(pod) and not pod["metadata"].get("deletionTimestamp"):
                with contextlib.suppress(ApiError):
                    self.api.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._settle(job)

    def _settle(self, job: dict[str, Any]) -> None:
        """A Job whose end is decided gets its final condition once none of its pods runs."""
        meta = job["metadata"]
        now = self._job(meta["namespace"], meta["name"])
        if now is None or now["metadata"]["uid"] != meta["uid"] or _finished(now):
            return
        interim = _decided(now)
        if interim is None or not all(_terminal(pod) for pod in self.pods_of(now)):
            return
        stamp = now_text()
        kind = "Complete" if interim["type"] == "SuccessCriteriaMet" else "Failed"
        final = {**interim, "type": kind, "lastTransitionTime": stamp}
        if interim["reason"] == interim["type"]:
            final["reason"] = kind
        status: dict[str, Any] = {"conditions": [interim, final], "terminating": 0}
        if kind == "Complete":
            status["completionTime"] = stamp
        self._job_status(now, status)
        ttl = now["spec"].get("ttlSecondsAfterFinished")
        if self.ttl_enabled and ttl is not None:
            self._spawn(self._ttl(now, ttl))

    async def _deadline(self, job: dict[str, Any]) -> None:
        seconds = job["spec"].get("activeDeadlineSeconds")
        if seconds is None:
            return
        await asyncio.sleep(seconds)
        meta = job["metadata"]
        now = self._job(meta["namespace"], meta["name"])
        if now is None or now["metadata"]["uid"] != meta["uid"] or _decided(now):
            return
        self._finish(now, "Failed", "DeadlineExceeded", failed=1)

    async def _ttl(self, job: dict[str, Any], seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.ttl_expire(job["metadata"]["namespace"], job["metadata"]["name"])

    def ttl_expire(self, ns: str, name: str) -> None:
        """The TTL-after-finished controller deletes a finished Job, its pods with it."""
        with contextlib.suppress(ApiError):
            self.api.remove(JOBS, ns, name, "Background")

    def pods_of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return [
            pod
            for pod in self.api.objects(PODS)
            if any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or [])
        ]

    def evict(self, ns: str, pod_name: str, reason: str = "EvictionByEvictionAPI") -> None:
        """The Eviction API (or a preemption, a drain): the pod gets the DisruptionTarget
        condition, then is deleted with its grace; how it ends is up to its container (one
        that traps SIGTERM and exits 0 succeeds)."""
        condition = {"type": "DisruptionTarget", "status": "True", "reason": reason}
        self.api.patch(PODS, ns, pod_name, {"status": {"conditions": [condition]}})
        self.api.remove(PODS, ns, pod_name)

    def disrupt(self, ns: str, pod_name: str, reason: str = "DeletionByTaintManager") -> None:
        """A node goes away: the pod gets the DisruptionTarget condition and fails."""
        self.api.patch(
            PODS,
            ns,
            pod_name,
            {
                "status": {
                    "phase": "Failed",
                    "reason": "Evicted" if reason == "EvictionByEvictionAPI" else "NodeLost",
                    "conditions": [
                        {"type": "DisruptionTarget", "status": "True", "reason": reason}
                    ],
                    "containerStatuses": [
                        container_status({"terminated": {"exitCode": 137, "reason": "Error"}})
                    ],
                }
            },
        )


def _owner(obj: Mapping[str, Any], kind: str) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref["name"])
    return None


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in job.get("status", {}).get("conditions") or []
    )


def _decided(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The condition that says a Job's end is decided (FailureTarget, SuccessCriteriaMet),
    or None."""
    for c in job.get("status", {}).get("conditions") or []:
        if c.get("type") in ("FailureTarget", "SuccessCriteriaMet") and c.get("status") == "True":
            return dict(c)
    return None


def _policy_action(job: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """The action of the first podFailurePolicy rule that matches this failed pod (on its
    conditions, or its main container's exit code), or None."""
    conditions = {
        c["type"]
        for c in pod.get("status", {}).get("conditions") or []
        if c.get("status") == "True"
    }
    state = (pod.get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {}
    code = (state.get("terminated") or {}).get("exitCode")
    for rule in (job["spec"].get("podFailurePolicy") or {}).get("rules", []):
        wanted = {c["type"] for c in rule.get("onPodConditions", [])}
        codes = rule.get("onExitCodes")
        if wanted & conditions or (codes and code is not None and _exit_matches(codes, code)):
            return str(rule["action"])
    return None


def _exit_matches(rule: Mapping[str, Any], code: int) -> bool:
    listed = code in rule.get("values", [])
    return listed if rule.get("operator") == "In" else not listed


POD_GC_ON_SUCCESS = ("OnPodSuccess", "OnWorkflowSuccess")
POD_GC_ON_COMPLETION = ("OnPodCompletion", "OnWorkflowCompletion")


class ArgoController(_Controller):
    """Argo's workflow controller for one-step workflows: a pod for the entrypoint's
    container, `status.phase` Pending → Running → Succeeded / Failed / Error, a node status
    with the exit code, `spec.shutdown: Terminate` stops it, activeDeadlineSeconds fails
    it, and a pod deleted under a running workflow makes it Error ("pod deleted"). While
    its pod waits to start for a reason, the pod node is Pending with Argo's message
    ("Reason: message"); a pod the API server refuses (admission) ends it in Error with
    the refusal as the node's message. A Workflow its validation refuses (`_spec_problems`:
    the minimal CRD let it in) is Failed at once, "invalid spec: ...", with no pod."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__(api)
        api.on_change.append(self._changed)

    def _changed(self, kind: str, resource: tuple[str, str, str], obj: dict[str, Any]) -> None:
        if resource == WORKFLOWS and kind == "ADDED":
            self._start(obj)
        elif resource == WORKFLOWS and kind == "MODIFIED":
            if obj["spec"].get("shutdown") and obj.get("status", {}).get("phase") in (
                "Pending",
                "Running",
            ):
                self._end(obj, "Failed", "Stopped with strategy 'Terminate'", None)
                for pod in self._pods(obj):
                    with contextlib.suppress(ApiError):
                        self.api.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        elif resource == PODS:
            owner = _owner(obj, "Workflow")
            if owner is not None:
                self._pod_changed(kind, obj, owner)

    def _start(self, wf: dict[str, Any]) -> None:
        meta, spec = wf["metadata"], wf["spec"]
        if problems := _spec_problems(wf):
            self._set(wf, {"phase": "Running", "startedAt": now_text()})
            message = f"invalid spec: {problems[0]}"
            self._set(wf, {"phase": "Failed", "message": message, "finishedAt": now_text()})
            return
        entry = next(t for t in spec["templates"] if t["name"] == spec["entrypoint"])
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [{**copy.deepcopy(entry["container"]), "name": "main"}],
        }
        for src, dst in (
            ("serviceAccountName", "serviceAccountName"),
            ("nodeSelector", "nodeSelector"),
            ("tolerations", "tolerations"),
            ("priorityClassName", "priorityClassName"),
            ("volumes", "volumes"),
        ):
            if src in spec:
                pod_spec[dst] = copy.deepcopy(spec[src])
        pod_name = f"{meta['name']}-{entry['name']}-{abs(hash(meta['uid'])) % 10**10}"
        try:
            self._make_pod(wf, pod_name, pod_spec)
        except ApiError as exc:
            self._set(wf, {"phase": "Running", "startedAt": now_text()})
            self._end(wf, "Error", f'pods "{pod_name}" is forbidden: {exc.message}', None)
            return
        self._set(wf, {"phase": "Pending", "startedAt": now_text()})
        if (seconds := spec.get("activeDeadlineSeconds")) is not None:
            self._spawn(self._deadline(wf, seconds))

    def _make_pod(self, wf: dict[str, Any], pod_name: str, pod_spec: dict[str, Any]) -> None:
        meta, pod_meta = wf["metadata"], wf["spec"].get("podMetadata", {})
        self.api.put(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": meta["namespace"],
                    "labels": {
                        **pod_meta.get("labels", {}),
                        "workflows.argoproj.io/workflow": meta["name"],
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "argoproj.io/v1alpha1",
                            "kind": "Workflow",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": pod_spec,
            },
        )

    def _set(self, wf: dict[str, Any], status: dict[str, Any]) -> None:
        meta = wf["metadata"]
        if self.api.find(WORKFLOWS, meta["namespace"], meta["name"]) is not None:
            self.api.patch(WORKFLOWS, meta["namespace"], meta["name"], {"status": status})

    def _end(
        self,
        wf: dict[str, Any],
        phase: str,
        message: str,
        exit_code: int | None,
        *,
        node_phase: str | None = None,
    ) -> None:
        node: dict[str, Any] = {
            "id": wf["metadata"]["name"],
            "name": wf["metadata"]["name"],
            "type": "Pod",
            "phase": node_phase or phase,
            "message": message,
        }
        if exit_code is not None:
            node["outputs"] = {"exitCode": str(exit_code)}
        self._set(
            wf,
            {
                "phase": phase,
                "message": message,
                "finishedAt": now_text(),
                "nodes": {wf["metadata"]["name"]: node},
            },
        )

    def _pod_changed(self, kind: str, pod: dict[str, Any], owner: str) -> None:
        wf = self.api.find(WORKFLOWS, pod["metadata"]["namespace"], owner)
        if wf is None or wf.get("status", {}).get("phase") not in ("Pending", "Running"):
            return
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            self._end(wf, "Error", "pod deleted", None, node_phase="Error")
            return
        status = pod.get("status", {})
        phase = status.get("phase")
        terminated = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("terminated")
        if phase == "Pending" and (why := _pending_reason(status)):
            node = {"id": owner, "name": owner, "type": "Pod", "phase": "Pending", "message": why}
            self._set(wf, {"phase": "Running", "nodes": {owner: node}})
        elif phase == "Running":
            self._set(wf, {"phase": "Running", "nodes": None})
        elif phase == "Succeeded":
            self._end(wf, "Succeeded", "", 0)
            self._collect(wf, pod, phase)
        elif phase == "Failed":
            code = terminated.get("exitCode") if terminated else None
            reason = terminated.get("reason") if terminated else None
            text = (terminated or {}).get("message") or ""
            message = (
                f"{reason}: {text}".strip()
                if reason == "OOMKilled"
                else (text.strip() or f"Error (exit code {code})")
            )
            self._end(wf, "Failed", message, code)
            self._collect(wf, pod, phase)

    def _collect(self, wf: dict[str, Any], pod: dict[str, Any], phase: str) -> None:
        """The Workflow's podGC: its ended pod deleted (after `deleteDelayDuration`, in
        seconds; at once, as its Workflow ends, without one) when its strategy says so.
        A one-step Workflow ends with its pod, so the workflow strategies act as the pod's."""
        gc = (wf.get("spec") or {}).get("podGC") or {}
        strategy = gc.get("strategy")
        if strategy not in POD_GC_ON_SUCCESS + POD_GC_ON_COMPLETION:
            return
        if strategy in POD_GC_ON_SUCCESS and phase != "Succeeded":
            return
        delay = float(str(gc.get("deleteDelayDuration") or "0s").removesuffix("s") or 0)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if delay <= 0:
            with contextlib.suppress(ApiError):
                self.api.remove(PODS, ns, name)
            return

        async def later() -> None:
            await asyncio.sleep(delay)
            with contextlib.suppress(ApiError):
                self.api.remove(PODS, ns, name)

        self._spawn(later())

    async def _deadline(self, wf: dict[str, Any], seconds: float) -> None:
        await asyncio.sleep(seconds)
        meta = wf["metadata"]
        now = self.api.find(WORKFLOWS, meta["namespace"], meta["name"])
        if now is None or now["metadata"]["uid"] != meta["uid"]:
            return
        if now.get("status", {}).get("phase") not in ("Pending", "Running"):
            return
        self._end(now, "Failed", "Step exceeded its deadline", None)
        for pod in self._pods(now):
            with contextlib.suppress(ApiError):
                self.api.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _pods(self, wf: dict[str, Any]) -> list[dict[str, Any]]:
        uid = wf["metadata"]["uid"]
        return [
            pod
            for pod in self.api.objects(PODS)
            if any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or [])
        ]


def _terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _pending_reason(status: Mapping[str, Any]) -> str | None:
    """Argo's message for a pod that waits to start: "Reason: message", or None."""
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in (None, "ContainerCreating"):
            return f"{waiting['reason']}: {waiting.get('message', '')}"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason')}: {condition.get('message', '')}"
    return None


@dataclass
class Cluster:
    """The double, its server and its controllers, as one fixture value."""

    api: KubeApi
    server: Any
    kubelet: Kubelet
    jobs: JobController
    argo: ArgoController

    @property
    def url(self) -> str:
        return str(self.server.url).rstrip("/")


@contextlib.asynccontextmanager
async def cluster(*, start_delay: float = 0.0) -> AsyncIterator[Cluster]:
    api = KubeApi()
    async with api, server(api) as served:
        kubelet = Kubelet(api, start_delay=start_delay)
        jobs = JobController(api)
        argo = ArgoController(api)
        try:
            yield Cluster(api, served, kubelet, jobs, argo)
        finally:
            api.end_watches()
            await jobs.close()
            await argo.close()
            await kubelet.close()


MAX_REQUEST_BYTES = 3 * 1024 * 1024
"""The largest request body the API server reads (kube-apiserver's own limit; aiohttp's
default, 1 MiB, would refuse the create of a ConfigMap that holds 1 MiB)."""


class _ApiServer(aiohttp.test_utils.RawTestServer):
    """kmock's HTTP server, reading request bodies up to MAX_REQUEST_BYTES."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> web_runner.ServerRunner:
        def request(*parts: Any) -> web_request.BaseRequest:
            loop = asyncio.get_running_loop()
            return web_request.BaseRequest(*parts, loop, client_max_size=MAX_REQUEST_BYTES)

        served = web_server.Server(
            self._handler, loop=self._loop, debug=debug, request_factory=request, **kwargs
        )
        return web_runner.ServerRunner(served, debug=debug, **kwargs)


def server(api: KubeApi) -> kmock.Server:
    """The double's HTTP server on loopback (an async context manager; `.url` once in)."""
    return kmock.Server(api, server_cls=_ApiServer)


def configuration(c: Cluster) -> client.Configuration:
    """The real client's connection settings for the double."""
    return client.Configuration(host=c.url)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
