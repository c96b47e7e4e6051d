"""The API double keeps the Kubernetes semantics corral relies on. Each test names the
part of the Kubernetes documentation it follows; all of them go through the real
`kubernetes` client over HTTP, as the executors do."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio import watch as kube_watch

from tests.support import kube_api
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(3 * PATIENCE)


@contextlib.asynccontextmanager
async def job_controllers(api: kube_api.KubeApi) -> AsyncIterator[kube_api.JobController]:
    """The double's kubelet and Job controller on `api` (the controller given), closed on
    the way out."""
    kubelet, controller = kube_api.Kubelet(api), kube_api.JobController(api)
    try:
        yield controller
    finally:
        await controller.close()
        await kubelet.close()


def job(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "command": ["sleep", "30"]}
                    ],
                },
            },
            **spec,
        },
    }


@pytest.fixture
async def k8s() -> AsyncIterator[tuple[kube_api.KubeApi, client.BatchV1Api, client.CoreV1Api]]:
    api = kube_api.KubeApi()
    async with api, kube_api.server(api) as server:
        cfg = client.Configuration(host=str(server.url).rstrip("/"))
        async with client.ApiClient(cfg) as c:
            yield api, client.BatchV1Api(c), client.CoreV1Api(c)
        api.end_watches()


Fixture = tuple[kube_api.KubeApi, client.BatchV1Api, client.CoreV1Api]


async def test_create_stamps_uid_resource_version_and_job_defaults(k8s: Fixture) -> None:
    # api-concepts "Resource versions"; Job "Specifying your own Pod selector" (the API
    # server adds controller-uid selector and labels).
    _, batch, _ = k8s
    a = await batch.create_namespaced_job("default", job("a"))
    b = await batch.create_namespaced_job("default", job("b"))
    assert a.metadata.uid
    assert a.metadata.uid != b.metadata.uid
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    assert a.metadata.creation_timestamp is not None
    assert a.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": a.metadata.uid}
    assert a.spec.template.metadata.labels["batch.kubernetes.io/job-name"] == "a"
    listing = await batch.list_namespaced_job("default")
    assert int(listing.metadata.resource_version) >= int(b.metadata.resource_version)


async def test_create_of_an_existing_name_is_409_already_exists(k8s: Fixture) -> None:
    # api-concepts: a create of an existing name fails with a Status, reason AlreadyExists.
    _, batch, _ = k8s
    await batch.create_namespaced_job("default", job("a"))
    with pytest.raises(client.ApiException) as caught:
        await batch.create_namespaced_job("default", job("a"))
    body = json.loads(caught.value.body)
    assert caught.value.status == 409
    assert body["kind"] == "Status"
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'jobs.batch "a" already exists'
    assert body["details"] == {"name": "a", "group": "batch", "kind": "jobs"}


async def test_an_invalid_body_is_refused_with_422(k8s: Fixture) -> None:
    # api-concepts "Field validation": unknown fields are errors under strict validation;
    # object names must be DNS-1123 labels for Jobs. (Sent as raw HTTP: the client itself
    # refuses unknown fields before sending.)
    api, batch, _ = k8s
    bad = job("a")
    bad["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
    for body in (bad, job("Not_A_Name")):
        async with api.post("/apis/batch/v1/namespaces/default/jobs", json=body) as answer:
            assert answer.status == 422
            assert (await answer.json())["reason"] == "Invalid"
    assert (await batch.list_namespaced_job("default")).items == []


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=x", ["a", "b"]),
        ("app==x", ["a", "b"]),
        ("app!=x", ["c", "d"]),
        ("tier in (web, db)", ["a", "c"]),
        ("tier notin (web)", ["b", "c", "d"]),
        ("tier", ["a", "b", "c"]),
        ("!tier", ["d"]),
        ("app=x,tier=web", ["a"]),
    ],
)
async def test_label_selectors(k8s: Fixture, selector: str, names: list[str]) -> None:
    # "Labels and Selectors": equality- and set-based requirements, comma means AND.
    _, batch, _ = k8s
    for name, labels in (
        ("a", {"app": "x", "tier": "web"}),
        ("b", {"app": "x", "tier": "batch"}),
        ("c", {"app": "y", "tier": "db"}),
        ("d", {"app": "y"}),
    ):
        await batch.create_namespaced_job("default", job(name, labels))
    found = await batch.list_namespaced_job("default", label_selector=selector)
    assert sorted(j.metadata.name for j in found.items) == names


async def test_field_selector_on_metadata_name(k8s: Fixture) -> None:
    # "Field Selectors": metadata.name and metadata.namespace on every resource.
    _, batch, _ = k8s
    for name in ("a", "b"):
        await batch.create_namespaced_job("default", job(name))
    found = await batch.list_namespaced_job("default", field_selector="metadata.name=b")
    assert [j.metadata.name for j in found.items] == ["b"]
    found = await batch.list_namespaced_job("default", field_selector="metadata.name!=b")
    assert [j.metadata.name for j in found.items] == ["a"]


async def test_watch_resumes_from_a_resource_version(k8s: Fixture) -> None:
    # api-concepts "Efficient detection of changes": a watch from resourceVersion N
    # replays every change after N, then streams.
    api, batch, _ = k8s
    listing = await batch.list_namespaced_job("default")
    await batch.create_namespaced_job("default", job("a"))
    api.patch(kube_api.JOBS, "default", "a", {"status": {"active": 1}})
    w = kube_watch.Watch()
    events = []
    async for event in w.stream(
        batch.list_namespaced_job,
        "default",
        resource_version=listing.metadata.resource_version,
        timeout_seconds=1,
    ):
        events.append((event["type"], event["raw_object"]["metadata"]["name"]))
    assert events == [("ADDED", "a"), ("MODIFIED", "a")]


async def test_watch_from_a_compacted_version_is_410_expired(k8s: Fixture) -> None:
    # api-concepts "410 Gone responses": the client must list again.
    api, batch, _ = k8s
    await batch.create_namespaced_job("default", job("a"))
    old = (await batch.list_namespaced_job("default")).metadata.resource_version
    api.patch(kube_api.JOBS, "default", "a", {"status": {"active": 1}})
    api.compact()
    with pytest.raises(client.ApiException) as caught:
        async for _ in kube_watch.Watch().stream(
            batch.list_namespaced_job, "default", resource_version=old, timeout_seconds=1
        ):
            pass
    assert caught.value.status == 410


async def test_watch_sees_live_changes_and_ends_after_its_timeout(k8s: Fixture) -> None:
    api, batch, _ = k8s
    seen: list[str] = []

    async def watch() -> None:
        async for event in kube_watch.Watch().stream(
            batch.list_namespaced_job, "default", label_selector="app=x", timeout_seconds=1
        ):
            seen.append(f"{event['type']} {event['raw_object']['metadata']['name']}")

    task = asyncio.create_task(watch())
    await api.watched()  # live changes: the watch is open before they happen
    await batch.create_namespaced_job("default", job("a", {"app": "x"}))
    await batch.create_namespaced_job("default", job("b", {"app": "y"}))
    await asyncio.wait_for(task, PATIENCE)
    assert seen == ["ADDED a"], "only what the selector matches"


async def test_delete_with_finalizers_waits_for_them(k8s: Fixture) -> None:
    # "Finalizers": delete sets deletionTimestamp; the object goes once they are removed.
    api, batch, _ = k8s
    body = job("a")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    await batch.create_namespaced_job("default", body)
    await batch.delete_namespaced_job("a", "default")
    held = await batch.read_namespaced_job("a", "default")
    assert held.metadata.deletion_timestamp is not None
    api.patch(kube_api.JOBS, "default", "a", {"metadata": {"finalizers": None}})
    with pytest.raises(client.ApiException) as caught:
        await batch.read_namespaced_job("a", "default")
    assert caught.value.status == 404


async def test_delete_with_a_stale_precondition_is_409_conflict(k8s: Fixture) -> None:
    # DeleteOptions "preconditions": must be fulfilled before a deletion is carried out,
    # else 409 Conflict; the object stays as it is.
    api, batch, _ = k8s
    made = await batch.create_namespaced_job("default", job("a"))
    api.patch(kube_api.JOBS, "default", "a", {"status": {"active": 1}})
    stale = client.V1Preconditions(resource_version=made.metadata.resource_version)
    with pytest.raises(client.ApiException) as caught:
        await batch.delete_namespaced_job(
            "a", "default", body=client.V1DeleteOptions(preconditions=stale)
        )
    assert (caught.value.status, json.loads(caught.value.body)["reason"]) == (409, "Conflict")
    assert (await batch.read_namespaced_job("a", "default")).metadata.deletion_timestamp is None
    now = await batch.read_namespaced_job("a", "default")
    fresh = client.V1Preconditions(
        uid=now.metadata.uid, resource_version=now.metadata.resource_version
    )
    await batch.delete_namespaced_job(
        "a", "default", body=client.V1DeleteOptions(preconditions=fresh)
    )
    with pytest.raises(client.ApiException) as gone:
        await batch.read_namespaced_job("a", "default")
    assert gone.value.status == 404


@pytest.mark.parametrize(
    ("policy", "pods_left"),
    [("Background", 0), ("Foreground", 0), ("Orphan", 1), (None, 1)],
)
async def test_propagation_policy(k8s: Fixture, policy: str | None, pods_left: int) -> None:
    # "Garbage Collection" / "Cascading deletion": Background and Foreground delete the
    # dependents; Orphan keeps them; batch/v1 Jobs default to orphaning (kubectl asks for
    # background explicitly).
    api, batch, core = k8s
    made = await batch.create_namespaced_job("default", job("a"))
    kube_api.JobController(api)._pod_for(api.get(kube_api.JOBS, "default", "a"))
    assert len((await core.list_namespaced_pod("default")).items) == 1
    options = client.V1DeleteOptions(propagation_policy=policy) if policy else None
    await batch.delete_namespaced_job("a", "default", body=options)
    pods = (await core.list_namespaced_pod("default")).items
    assert len(pods) == pods_left
    for pod in pods:
        assert not any(o.uid == made.metadata.uid for o in pod.metadata.owner_references or [])


async def test_injected_faults_come_before_the_store(k8s: Fixture) -> None:
    api, batch, _ = k8s
    api["get /apis/batch/v1/namespaces/default/jobs"][:1] << 429 << {"kind": "Status", "code": 429}
    with pytest.raises(client.ApiException) as caught:
        await batch.list_namespaced_job("default")
    assert caught.value.status == 429
    assert (await batch.list_namespaced_job("default")).items == []


def workflow(**template: Any) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": {
            "entrypoint": "main",
            "templates": [{"name": "main", "container": {"image": "busybox"}, **template}],
        },
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (workflow(bogus=1), "invalid spec: Workflow spec.templates.0.bogus: unknown field"),
        (
            {**workflow(), "spec": {**workflow()["spec"], "entrypoint": "nowhere"}},
            "invalid spec: spec.entrypoint template 'nowhere' undefined",
        ),
    ],
)
async def test_a_workflow_argo_would_refuse_is_created_then_failed_by_its_controller(
    k8s: Fixture, body: dict[str, Any], why: str
) -> None:
    # Argo's "minimal CRDs" (the ones it installs by default) keep any field of a spec, so
    # the API server takes such a Workflow (201); the controller's validation then fails it
    # (`invalid spec: ...`, phase Failed) and makes no pod.
    api, _, _ = k8s
    controller = kube_api.ArgoController(api)
    try:
        url = "/apis/argoproj.io/v1alpha1/namespaces/default/workflows"
        async with api.post(url, json=body) as answer:
            assert answer.status == 201
        failed = await eventually(
            lambda: api.get(kube_api.WORKFLOWS, "default", "w")["status"].get("message"),
            what="the controller's verdict",
        )
        assert failed.startswith(why), failed
        assert api.get(kube_api.WORKFLOWS, "default", "w")["status"]["phase"] == "Failed"
        assert api.objects(kube_api.PODS) == []
    finally:
        await controller.close()


async def test_an_invalid_body_whose_name_is_taken_is_422_not_409(k8s: Fixture) -> None:
    # The API server validates an object before it stores it: the name is only found taken
    # once the body is valid.
    api, batch, _ = k8s
    await batch.create_namespaced_job("default", job("a"))
    bad = job("a", {"app": "not a label value!"})
    async with api.post("/apis/batch/v1/namespaces/default/jobs", json=bad) as answer:
        assert answer.status == 422
        assert (await answer.json())["reason"] == "Invalid"
    async with api.post("/apis/batch/v1/namespaces/default/jobs", json=job("a")) as answer:
        assert answer.status == 409, "a valid body: the name is taken"


async def test_what_the_controllers_write_reads_back_through_the_typed_client(
    k8s: Fixture,
) -> None:
    # The client's own models are strict (required fields, no unknown ones): pods and Jobs
    # the double's controllers write must pass them, as a real cluster's do.
    api, batch, core = k8s
    async with job_controllers(api):
        body = job("a")
        body["spec"]["template"]["spec"]["containers"][0]["command"] = ["true"]
        await batch.create_namespaced_job("default", body)

        async def finished() -> Any:
            done = await batch.read_namespaced_job("a", "default")
            return done if done.status.conditions else None

        done = await eventually(finished, what="the Job finished")
        assert [c.type for c in done.status.conditions] == ["SuccessCriteriaMet", "Complete"]
        [pod] = (await core.list_namespaced_pod("default")).items
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0


# --- ConfigMaps -------------------------------------------------------------------------------


def config_map(name: str, owner: Any = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": owner.metadata.name,
                "uid": owner.metadata.uid,
                "controller": False,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


async def test_config_maps_are_created_read_and_refused_twice_with_409(k8s: Fixture) -> None:
    # ConfigMap (core/v1): no status; api-concepts: a second create is 409 AlreadyExists.
    _, _, core = k8s
    made = await core.create_namespaced_config_map("default", config_map("a", x="1"))
    assert made.metadata.uid
    assert (await core.read_namespaced_config_map("a", "default")).data == {"x": "1"}
    with pytest.raises(client.ApiException) as caught:
        await core.create_namespaced_config_map("default", config_map("a", x="2"))
    body = json.loads(caught.value.body)
    assert (caught.value.status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == 'configmaps "a" already exists'
    with pytest.raises(client.ApiException) as missing:
        await core.read_namespaced_config_map("b", "default")
    assert missing.value.status == 404


async def test_a_config_map_over_1_mib_is_refused_with_422(k8s: Fixture) -> None:
    # ConfigMap: "The data stored in a ConfigMap cannot exceed 1 MiB."
    api, _, _ = k8s
    url = "/api/v1/namespaces/default/configmaps"
    body = io.BytesIO(json.dumps(config_map("big", v="x" * (2**20 + 1))).encode())
    headers = {"Content-Type": "application/json"}  # a stream: aiohttp warns of large bytes
    async with api.post(url, data=body, headers=headers) as answer:
        assert answer.status == 422
        assert "1048577 bytes" in (await answer.json())["message"]
    assert api.objects(kube_api.CONFIGMAPS) == []


@pytest.mark.parametrize(("policy", "left"), [("Background", 0), ("Foreground", 0), (None, 1)])
async def test_a_config_map_owned_by_a_job_is_collected_with_it(
    k8s: Fixture, policy: str | None, left: int
) -> None:
    # "Garbage Collection": a dependent goes when its owner (by uid) is deleted, unless the
    # delete orphans it (a batch/v1 Job's default), which drops the ownerReference.
    _, batch, core = k8s
    owner = await batch.create_namespaced_job("default", job("a"))
    await core.create_namespaced_config_map("default", config_map("a", owner, x="1"))
    await core.create_namespaced_config_map("default", config_map("b", x="1"))  # owned by none
    options = client.V1DeleteOptions(propagation_policy=policy) if policy else None
    await batch.delete_namespaced_job("a", "default", body=options)
    names = sorted(
        c.metadata.name for c in (await core.list_namespaced_config_map("default")).items
    )
    assert names == ["a", "b"][1 - left :]
    if left:
        orphan = await core.read_namespaced_config_map("a", "default")
        assert not orphan.metadata.owner_references


async def test_a_pod_waits_in_container_creating_until_its_config_map_exists(
    k8s: Fixture, tmp_path: Any
) -> None:
    # "Configure a Pod to Use a ConfigMap": a pod that mounts a ConfigMap that does not exist
    # does not start (unless the volume is optional); the kubelet retries the mount.
    api, batch, core = k8s
    async with job_controllers(api):
        out = tmp_path / "out"
        body = job("a")
        pod = body["spec"]["template"]["spec"]
        pod["volumes"] = [{"name": "p", "configMap": {"name": "a", "defaultMode": 0o444}}]
        pod["containers"][0] |= {
            "command": ["sh", "-c", f'stat -c %a "$FILE" > {out}.mode; cat "$FILE" > {out}'],
            "env": [{"name": "FILE", "value": "/etc/p/data.json"}],
            "volumeMounts": [{"name": "p", "mountPath": "/etc/p", "readOnly": True}],
        }
        made = await batch.create_namespaced_job("default", body)

        async def waiting() -> Any:
            pods = (await core.list_namespaced_pod("default")).items
            statuses = pods[0].status.container_statuses if pods else None
            return statuses and statuses[0].state.waiting

        assert (await eventually(waiting, what="the pod waiting")).reason == "ContainerCreating"
        assert not out.exists(), "no container before its volume"
        await core.create_namespaced_config_map(
            "default", config_map("a", made, **{"data.json": "{}"})
        )

        async def finished() -> Any:
            done = await batch.read_namespaced_job("a", "default")
            return done if done.status.conditions else None

        done = await eventually(finished, what="the Job finished")
        assert [c.type for c in done.status.conditions] == ["SuccessCriteriaMet", "Complete"]
        assert out.read_text() == "{}"
        assert Path(f"{out}.mode").read_text() == "444\n", "the volume's defaultMode"


# --- Secrets ----------------------------------------------------------------------------------


def secret(name: str, owner: Any = None, **string_data: str) -> dict[str, Any]:
    doc = config_map(name, owner)
    del doc["data"]
    return {**doc, "kind": "Secret", "type": "Opaque", "stringData": string_data}


async def test_a_secrets_string_data_is_kept_as_base64_data(k8s: Fixture) -> None:
    # Secret (core/v1): "stringData ... is merged into the data field on write, overwriting
    # any existing values. The stringData field is never output when reading from the API."
    api, _, core = k8s
    await core.create_namespaced_secret("default", secret("a", token="s3cret"))
    read = await core.read_namespaced_secret("a", "default")
    assert read.data == {"token": base64.b64encode(b"s3cret").decode()}
    assert read.string_data is None
    assert "stringData" not in api.get(kube_api.SECRETS, "default", "a")
    with pytest.raises(client.ApiException) as caught:
        await core.create_namespaced_secret("default", secret("a", token="again"))
    body = json.loads(caught.value.body)
    assert (caught.value.status, body["message"]) == (409, 'secrets "a" already exists')


async def test_a_secret_whose_data_is_not_base64_is_refused_with_422(k8s: Fixture) -> None:
    api, _, _ = k8s
    body = {**secret("bad"), "data": {"token": "not base64!"}}
    async with api.post("/api/v1/namespaces/default/secrets", json=body) as answer:
        assert answer.status == 422
        assert "illegal base64 data" in (await answer.json())["message"]
    assert api.objects(kube_api.SECRETS) == []


async def test_an_immutable_secret_keeps_its_data_but_takes_a_new_owner(k8s: Fixture) -> None:
    # "Immutable Secrets": once immutable, its data cannot change; its metadata can.
    _, batch, core = k8s
    owner = await batch.create_namespaced_job("default", job("a"))
    await core.create_namespaced_secret("default", {**secret("a", token="1"), "immutable": True})
    with pytest.raises(client.ApiException) as caught:
        await core.patch_namespaced_secret("a", "default", {"stringData": {"token": "2"}})
    assert caught.value.status == 422
    assert "field is immutable" in json.loads(caught.value.body)["message"]
    owners = secret("a", owner)["metadata"]["ownerReferences"]
    await core.patch_namespaced_secret("a", "default", {"metadata": {"ownerReferences": owners}})
    read = await core.read_namespaced_secret("a", "default")
    assert read.metadata.owner_references[0].uid == owner.metadata.uid
    assert read.data == {"token": base64.b64encode(b"1").decode()}


@pytest.mark.parametrize(("policy", "left"), [("Background", 0), (None, 1)])
async def test_a_secret_owned_by_a_job_is_collected_with_it(
    k8s: Fixture, policy: str | None, left: int
) -> None:
    # "Garbage Collection", as for the ConfigMap above.
    _, batch, core = k8s
    owner = await batch.create_namespaced_job("default", job("a"))
    await core.create_namespaced_secret("default", secret("a", owner, token="1"))
    options = client.V1DeleteOptions(propagation_policy=policy) if policy else None
    await batch.delete_namespaced_job("a", "default", body=options)
    assert len((await core.list_namespaced_secret("default")).items) == left


async def test_a_pod_waits_in_create_container_config_error_until_its_secret_exists(
    k8s: Fixture, tmp_path: Any
) -> None:
    # "Distribute Credentials Securely Using Secrets": a container whose env reads a key of
    # a Secret that does not exist (and is not optional) does not start; the kubelet
    # reports CreateContainerConfigError and tries again.
    api, batch, core = k8s
    async with job_controllers(api):
        out = tmp_path / "out"
        body = job("a")
        body["spec"]["template"]["spec"]["containers"][0] |= {
            "command": ["sh", "-c", f'printf %s "$TOKEN" > {out}'],
            "env": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "a", "key": "token"}}}
            ],
        }
        made = await batch.create_namespaced_job("default", body)

        async def waiting() -> Any:
            pods = (await core.list_namespaced_pod("default")).items
            statuses = pods[0].status.container_statuses if pods else None
            return statuses and statuses[0].state.waiting

        held = await eventually(waiting, what="the pod waiting")
        assert (held.reason, held.message) == ("CreateContainerConfigError", 'secret "a" not found')
        assert not out.exists(), "no container before its Secret"
        await core.create_namespaced_secret("default", secret("a", made, token="s3cret"))

        async def finished() -> Any:
            done = await batch.read_namespaced_job("a", "default")
            return done if done.status.conditions else None

        done = await eventually(finished, what="the Job finished")
        assert [c.type for c in done.status.conditions] == ["SuccessCriteriaMet", "Complete"]
        assert out.read_text() == "s3cret", "the key's value, decoded"


async def test_throttled_requests_are_429_with_retry_after(k8s: Fixture) -> None:
    # API Priority and Fairness: a request shed for load is 429 TooManyRequests with a
    # Retry-After header and details.retryAfterSeconds.
    api, batch, _ = k8s
    api.throttle("get /apis/batch/v1/namespaces/default/jobs", seconds=3, times=1)
    with pytest.raises(client.ApiException) as caught:
        await batch.list_namespaced_job("default")
    assert caught.value.status == 429
    assert caught.value.headers["Retry-After"] == "3"
    body = json.loads(caught.value.body)
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["retryAfterSeconds"] == 3
    assert (await batch.list_namespaced_job("default")).items == []


# --- a Job's end --------------------------------------------------------------------------------


def gated(name: str, gate: Path, **spec: Any) -> dict[str, Any]:
    """A Job whose container runs until SIGTERM, then holds on until `gate` exists, then
    exits 3; 30 s of grace, so that only the gate ends it."""
    body = job(name, **spec)
    pod = body["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 30
    pod["containers"][0]["command"] = [
        "sh",
        "-c",
        f"trap 'while [ ! -e {gate} ]; do sleep 0.05; done; exit 3' TERM;"
        " while true; do sleep 0.05; done",
    ]
    return body


def conditions(api: kube_api.KubeApi, name: str) -> list[tuple[str, str]]:
    found = api.get(kube_api.JOBS, "default", name)["status"].get("conditions") or []
    return [(c["type"], c["reason"]) for c in found]


async def test_a_failing_job_is_failure_target_until_its_pods_have_ended(
    k8s: Fixture, tmp_path: Path
) -> None:
    # Job "Termination of Job pods" (1.31+): once a Job's failure is decided it gets
    # FailureTarget and its pods are terminated; Failed comes only once every pod is
    # terminal, so a client that waits for Failed never sees a pod still running.
    api, batch, _ = k8s
    async with job_controllers(api) as controller:
        gate = tmp_path / "gate"
        await batch.create_namespaced_job("default", gated("a", gate, activeDeadlineSeconds=1))
        await eventually(
            lambda: conditions(api, "a") == [("FailureTarget", "DeadlineExceeded")],
            what="FailureTarget",
        )
        (pod,) = controller.pods_of(api.get(kube_api.JOBS, "default", "a"))
        assert pod["metadata"].get("deletionTimestamp"), "its pod is being terminated"
        assert pod["status"]["phase"] == "Running", "and runs on, in its grace"
        gate.touch()
        await eventually(
            lambda: (
                conditions(api, "a")
                == [("FailureTarget", "DeadlineExceeded"), ("Failed", "DeadlineExceeded")]
            ),
            what="Failed, once the pod has ended",
        )


async def test_a_pod_failure_policy_fail_job_rule_fails_the_job_in_two_steps(
    k8s: Fixture,
) -> None:
    # Job "Pod failure policy": FailJob on a matching exit code, reason PodFailurePolicy.
    api, batch, _ = k8s
    async with job_controllers(api):
        body = job(
            "a",
            podFailurePolicy={
                "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]
            },
        )
        body["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", "exit 3"]
        seen: list[list[tuple[str, str]]] = []
        api.on_change.append(
            lambda kind, resource, obj: (
                seen.append(conditions(api, "a"))
                if resource == kube_api.JOBS and api.find(kube_api.JOBS, "default", "a")
                else None
            )
        )
        await batch.create_namespaced_job("default", body)
        final = [("FailureTarget", "PodFailurePolicy"), ("Failed", "PodFailurePolicy")]
        await eventually(lambda: conditions(api, "a") == final, what="Failed")
        assert [("FailureTarget", "PodFailurePolicy")] in seen, "FailureTarget came first"


async def test_a_disrupted_pod_is_replaced_only_once_it_has_failed(
    k8s: Fixture, tmp_path: Path
) -> None:
    # Job "Delayed creation of replacement pods" (podReplacementPolicy: Failed, the only
    # policy a podFailurePolicy allows): an evicted pod, Terminating in its grace, is
    # counted in status.terminating; its replacement is made once it has failed.
    api, batch, _ = k8s
    async with job_controllers(api) as controller:
        gate = tmp_path / "gate"
        rule = {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
        body = gated("a", gate, podFailurePolicy={"rules": [rule]}, podReplacementPolicy="Failed")
        await batch.create_namespaced_job("default", body)
        made = api.get(kube_api.JOBS, "default", "a")

        def running() -> bool:
            return [p["status"].get("phase") for p in controller.pods_of(made)] == ["Running"]

        await eventually(running, what="its pod running")
        (first,) = controller.pods_of(made)
        controller.evict("default", first["metadata"]["name"])
        await eventually(
            lambda: api.get(kube_api.JOBS, "default", "a")["status"].get("terminating") == 1,
            what="the Job counting its pod terminating",
        )
        assert len(controller.pods_of(made)) == 1, "no replacement while it terminates"
        assert api.get(kube_api.JOBS, "default", "a")["status"]["active"] == 0
        gate.touch()
        await eventually(
            lambda: (
                [p["metadata"]["name"] for p in controller.pods_of(made)]
                not in ([], [first["metadata"]["name"]])
            ),
            what="a replacement, once the evicted pod failed",
        )
        assert conditions(api, "a") == [], "the Job lives on"


async def test_a_pod_failure_policy_needs_pod_replacement_policy_failed(k8s: Fixture) -> None:
    # Job validation: podReplacementPolicy TerminatingOrFailed is refused beside a
    # podFailurePolicy.
    api, _, _ = k8s
    body = job("a", podFailurePolicy={"rules": []}, podReplacementPolicy="TerminatingOrFailed")
    async with api.post("/apis/batch/v1/namespaces/default/jobs", json=body) as answer:
        assert answer.status == 422
        assert "podReplacementPolicy" in (await answer.json())["message"]


# --- bookmarks and calls ---------------------------------------------------------------------


async def test_a_watch_that_allows_bookmarks_gets_them_while_quiet(k8s: Fixture) -> None:
    # api-concepts "Watch bookmarks": with allowWatchBookmarks the server sends BOOKMARK
    # events, the watched kind with only metadata.resourceVersion, to resume from; a
    # watch that does not ask gets none.
    api, batch, _ = k8s
    api.bookmark_every = 0.05
    await batch.create_namespaced_job("default", job("other"))  # moves resourceVersion on

    async def events(**bookmarks: Any) -> list[dict[str, Any]]:
        found = []
        async for event in kube_watch.Watch(return_type="object").stream(
            batch.list_namespaced_job,
            "default",
            label_selector="app=quiet",
            timeout_seconds=1,
            **bookmarks,
        ):
            found.append(event)
        return found

    marks = await events(allow_watch_bookmarks=True)
    assert marks, "bookmarks while nothing changed"
    assert {e["type"] for e in marks} == {"BOOKMARK"}
    assert marks[-1]["raw_object"] == {
        "kind": "Job",
        "apiVersion": "batch/v1",
        "metadata": {"resourceVersion": str(api.last_rv)},
    }
    assert await events() == []


async def test_every_request_is_recorded_as_rbac_reads_it(k8s: Fixture) -> None:
    # RBAC "Determine the request verb": get, list, watch, create, patch, update, delete;
    # a subresource after the resource (pods/log). An owner reference that sets
    # blockOwnerDeletion also needs update on the owner's finalizers (admission).
    api, batch, core = k8s
    made = await batch.create_namespaced_job("default", job("a"))
    await core.create_namespaced_config_map("default", config_map("a", made))
    await batch.read_namespaced_job("a", "default")
    await batch.list_namespaced_job("default")
    await batch.patch_namespaced_job_status("a", "default", {"status": {"active": 1}})
    async for _ in kube_watch.Watch().stream(
        core.list_namespaced_pod, "default", timeout_seconds=1
    ):
        pass
    with pytest.raises(client.ApiException):
        await core.read_namespaced_pod_log("p", "default")
    await batch.delete_namespaced_job("a", "default")
    C = kube_api.Call
    assert api.calls == [
        C("batch", "jobs", "create", "default"),
        C("", "configmaps", "create", "default"),
        C("batch", "jobs/finalizers", "update", "default"),
        C("batch", "jobs", "get", "default"),
        C("batch", "jobs", "list", "default"),
        C("batch", "jobs/status", "patch", "default"),
        C("", "pods", "watch", "default"),
        C("", "pods/log", "get", "default"),
        C("batch", "jobs", "delete", "default"),
    ]
