"""Attempts on a cluster as a cluster really fails them: pods that never start (an image
that cannot be pulled, a missing Secret, no node, admission refusing the pod or the Job),
a pod evicted that exits 0, a pod deleted under its running Job. The real client, against
the API double on loopback, with a short pod start timeout."""

from __future__ import annotations

import time
from typing import Any

import pytest

from corral import errors, launching, model
from corral.executors import argo, kubernetes
from tests.support import kube_api
from tests.support.cluster import NS, executor_fixture, launch, observe, until
from tests.support.launches import make_launch, sh
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(6 * PATIENCE)

START = 1.5
"""The pod start timeout of these tests, in seconds."""
PULL_ERROR = 'rpc error: code = NotFound desc = failed to pull image "ghcr.io/acme/etl:9.9"'
NO_NODES = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available"
DENIAL = "[no-root] containers must set runAsNonRoot"


# The executors on the double, their pod start timeout START.
ex = executor_fixture(kubernetes.KubernetesExecutor, pod_start_timeout=START)
wf = executor_fixture(argo.ArgoExecutor, pod_start_timeout=START)


async def waits_then_fails(
    ex: Any, name: str, reason: str, *, began: float
) -> launching.Observation:
    """The attempt reads as waiting, saying `reason`, then fails with it at the timeout:
    not sooner than START after `began` (taken before the launch: on a loaded machine the
    launch itself may take longer than START, its pod made early in it)."""
    said = f"waiting to start: {reason}"
    seen = await until(ex, name, lambda o: o.reason == said or o.phase.finished)
    assert seen.phase is launching.Phase.PENDING, "said while it waits, before it fails"
    ended = await until(ex, name, lambda o: o.phase.finished)
    assert time.monotonic() - began >= START - 1, "not before the timeout (1s timestamps)"
    assert ended.phase is launching.Phase.FAILED
    assert ended.reason is not None
    assert ended.reason.startswith("pod did not start in ")
    assert ended.reason.endswith(f": {reason}")
    return ended


# --- pods that never start -----------------------------------------------------------------


async def test_an_image_that_cannot_be_pulled_is_said_then_quarantines(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    bad = "ghcr.io/acme/etl:9.9"
    cluster.kubelet.bad_images[bad] = ("ErrImagePull", PULL_ERROR)
    began = time.monotonic()
    await ex.launch(make_launch("kubernetes", "pull-1", {"image": bad, "command": ["true"]}))
    ended = await waits_then_fails(ex, "pull-1", "ErrImagePull", began=began)
    assert ended.failure_class is model.FailureClass.PERMANENT
    assert ended.message == PULL_ERROR
    await eventually(
        lambda: cluster.api.find(kube_api.JOBS, NS, "pull-1") is None,
        what="the Job deleted, so its pod cannot start beside the retry",
    )


async def test_a_job_that_changes_as_it_is_deleted_is_deleted_still(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    bad = "ghcr.io/acme/etl:9.9"
    cluster.kubelet.bad_images[bad] = ("ErrImagePull", PULL_ERROR)
    conflict = {"kind": "Status", "code": 409, "reason": "Conflict"}
    cluster.api[f"delete /apis/batch/v1/namespaces/{NS}/jobs/pull-2"][:1] << 409 << conflict
    await ex.launch(make_launch("kubernetes", "pull-2", {"image": bad, "command": ["true"]}))
    ended = await until(ex, "pull-2", lambda o: o.phase.finished)
    assert ended.phase is launching.Phase.FAILED
    assert cluster.api.find(kube_api.JOBS, NS, "pull-2") is None, "read again, then deleted"


async def test_an_invalid_image_name_fails_at_once(
    cluster: kube_api.Cluster, cluster_k8s: kubernetes.KubernetesExecutor
) -> None:
    bad = "ghcr.io/acme/etl:9.9"
    cluster.kubelet.bad_images[bad] = ("InvalidImageName", "couldn't parse image reference")
    await cluster_k8s.launch(
        make_launch("kubernetes", "name-1", {"image": bad, "command": ["true"]})
    )
    ended = await until(cluster_k8s, "name-1", lambda o: o.phase.finished)
    assert (ended.phase, ended.failure_class) == (
        launching.Phase.FAILED,
        model.FailureClass.PERMANENT,
    )
    assert ended.reason is not None
    assert ended.reason.endswith(": InvalidImageName"), "no waiting: the kubelet will not retry"


# An executor whose pods may wait a minute to start.
cluster_k8s = executor_fixture(kubernetes.KubernetesExecutor, pod_start_timeout=60)


async def test_a_missing_secret_is_said_then_quarantines(
    ex: kubernetes.KubernetesExecutor,
) -> None:
    env = {"PASSWORD": {"secret": "etl-db", "key": "password"}}
    began = time.monotonic()
    await ex.launch(launch("secret-1", ["true"], spec={"env": env}))
    ended = await waits_then_fails(ex, "secret-1", "CreateContainerConfigError", began=began)
    assert ended.failure_class is model.FailureClass.PERMANENT
    assert ended.message is not None
    assert "etl-db" in ended.message


async def test_no_node_for_the_pod_is_said_then_fails_transient(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.kubelet.no_nodes = NO_NODES
    began = time.monotonic()
    await ex.launch(launch("nodes-1", ["true"]))
    ended = await waits_then_fails(ex, "nodes-1", "Unschedulable", began=began)
    assert ended.failure_class is model.FailureClass.TRANSIENT, "nodes come: retried"
    assert ended.message == NO_NODES


async def test_a_pod_that_starts_before_the_timeout_runs_on(
    cluster: kube_api.Cluster, cluster_k8s: kubernetes.KubernetesExecutor
) -> None:
    cluster.kubelet.no_nodes = NO_NODES
    await cluster_k8s.launch(launch("late-1", ["true"]))
    said = "waiting to start: Unschedulable"
    seen = await until(cluster_k8s, "late-1", lambda o: o.reason == said or o.phase.finished)
    assert (seen.phase, seen.message) == (launching.Phase.PENDING, NO_NODES)
    cluster.kubelet.no_nodes = None
    ended = await until(cluster_k8s, "late-1", lambda o: o.phase.finished)
    assert ended.phase is launching.Phase.SUCCEEDED


async def test_a_pod_refused_by_admission_is_said_then_quarantines(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api.deny(kube_api.PODS, "validation.gatekeeper.sh", DENIAL)
    began = time.monotonic()
    await ex.launch(launch("admit-1", ["true"]))
    assert cluster.api.find(kube_api.JOBS, NS, "admit-1") is not None, "the Job was made"
    ended = await waits_then_fails(ex, "admit-1", "FailedCreate", began=began)
    assert ended.failure_class is model.FailureClass.PERMANENT
    assert ended.message is not None
    assert 'admission webhook "validation.gatekeeper.sh" denied the request' in ended.message
    assert DENIAL in ended.message


async def test_a_job_refused_by_admission_is_launch_refused_with_its_message(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api.deny(kube_api.JOBS, "validation.gatekeeper.sh", DENIAL)
    with pytest.raises(errors.LaunchRefused, match="no-root") as caught:
        await ex.launch(launch("admit-2", ["true"]))
    assert "Role" not in str(caught.value), "not a permission corral lacks"


# --- pods that end under their Job ---------------------------------------------------------


async def test_an_evicted_pod_that_exits_0_is_not_a_success(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("trap-1", sh("trap 'exit 0' TERM; while true; do sleep 0.05; done")))
    await until(ex, "trap-1", lambda o: o.phase is launching.Phase.RUNNING)
    (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "trap-1"))
    cluster.jobs.evict(NS, pod["metadata"]["name"])
    ended = await until(ex, "trap-1", lambda o: o.phase.finished)
    assert _complete(cluster, "trap-1"), "the Job itself says Complete"
    assert (ended.phase, ended.failure_class) == (
        launching.Phase.FAILED,
        model.FailureClass.TRANSIENT,
    )
    assert ended.reason is not None
    assert ended.reason.startswith("success not trusted")


def _complete(cluster: kube_api.Cluster, name: str) -> bool:
    job = cluster.api.get(kube_api.JOBS, NS, name)
    return any(c["type"] == "Complete" for c in job["status"].get("conditions") or [])


async def test_a_pod_deleted_under_its_running_job_fails_the_attempt(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("kill-1", ["sleep", "30"]))
    await until(ex, "kill-1", lambda o: o.phase is launching.Phase.RUNNING)
    (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "kill-1"))
    cluster.api.remove(kube_api.PODS, NS, pod["metadata"]["name"])  # kubectl delete pod
    ended = await until(ex, "kill-1", lambda o: o.phase.finished)
    assert (ended.phase, ended.failure_class) == (
        launching.Phase.FAILED,
        model.FailureClass.TRANSIENT,
    )
    assert cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "kill-1")) == []


async def test_a_deleted_pod_stays_terminating_until_it_ends_with_143(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(
        launch("term-1", sh("trap 'sleep 0.5; exit 143' TERM; while :; do sleep 0.05; done"))
    )
    await until(ex, "term-1", lambda o: o.phase is launching.Phase.RUNNING)
    (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "term-1"))
    name = pod["metadata"]["name"]
    cluster.api.remove(kube_api.PODS, NS, name)
    held = cluster.api.get(kube_api.PODS, NS, name)
    assert held["metadata"]["deletionTimestamp"], "Terminating, held by the job-tracking finalizer"
    assert (await observe(ex, "term-1")).phase is launching.Phase.RUNNING, "it still runs"
    await until(ex, "term-1", lambda o: o.phase.finished)
    assert cluster.api.find(kube_api.PODS, NS, name) is None, "counted, then gone"


# --- Argo ---------------------------------------------------------------------------------------


async def test_a_workflow_whose_pod_cannot_pull_is_said_then_stopped(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    bad = "ghcr.io/acme/etl:9.9"
    cluster.kubelet.bad_images[bad] = ("ImagePullBackOff", PULL_ERROR)
    began = time.monotonic()
    await wf.launch(make_launch("argo", "wpull-1", {"image": bad, "command": ["true"]}))
    ended = await waits_then_fails(wf, "wpull-1", "ImagePullBackOff", began=began)
    assert ended.failure_class is model.FailureClass.PERMANENT
    assert ended.message == PULL_ERROR
    stopped = cluster.api.get(kube_api.WORKFLOWS, NS, "wpull-1")
    assert stopped["spec"].get("shutdown") == "Terminate", "its pod cannot start later"


async def test_a_workflow_whose_pod_admission_refuses_quarantines(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    cluster.api.deny(kube_api.PODS, "validation.gatekeeper.sh", DENIAL)
    await wf.launch(launch("wadmit-1", ["true"], kind="argo"))
    ended = await until(wf, "wadmit-1", lambda o: o.phase.finished)
    assert (ended.phase, ended.failure_class) == (
        launching.Phase.FAILED,
        model.FailureClass.PERMANENT,
    )
    assert ended.reason is not None
    assert DENIAL in ended.reason
