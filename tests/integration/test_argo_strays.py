"""Pods an Argo Workflow left running: a Workflow deleted without a propagation policy
(`kubectl delete workflow --cascade=orphan`) keeps its pod running, and the reconciler's
orphan sweep finds and stops it, as it does a Job's. The real client, against the API
double and its Argo controller (which labels and owns each pod as Argo's does)."""

from __future__ import annotations

from typing import Any

import pytest

from corral import clock, launching, model, reconciler, store
from corral.executors import argo, base, kubernetes
from corral.testing import FrozenClock
from tests.support import kube_api
from tests.support.cluster import IMAGE, NS, executor_fixture, launch, settings, started
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(6 * PATIENCE)

MANAGED = {model.MANAGED_BY: model.MANAGER}
SLEEP = ["sleep", "30"]


wf = executor_fixture(argo.ArgoExecutor)


def pods_of(cluster: kube_api.Cluster, workflow: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.api.objects(kube_api.PODS)
        if p["metadata"]["labels"].get(argo.WORKFLOW_LABEL) == workflow
    ]


async def running(cluster: kube_api.Cluster, *workflows: str) -> None:
    def all_running() -> bool:
        phases = [
            p.get("status", {}).get("phase") for name in workflows for p in pods_of(cluster, name)
        ]
        return len(phases) == len(workflows) and set(phases) == {"Running"}

    await eventually(all_running, what=f"the pods of {', '.join(workflows)} running")


def test_the_executor_leaves_strays_and_its_role_may_list_and_delete_pods() -> None:
    assert issubclass(argo.ArgoExecutor, base.LeavesStrays)
    verbs = {v for r in argo.RULES.corral if (r.group, r.resource) == ("", "pods") for v in r.verbs}
    assert verbs >= {"list", "delete"}


async def test_a_pod_whose_workflow_was_deleted_without_propagation_is_a_stray(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    # Fails on the code before: the argo executor listed no pods, and this one ran on.
    await wf.launch(launch("stray-1", SLEEP, kind="argo"))
    await wf.launch(launch("kept-1", SLEEP, kind="argo", job_id=2, fence=2))
    await running(cluster, "stray-1", "kept-1")
    cluster.api.remove(kube_api.WORKFLOWS, NS, "stray-1", "Orphan")  # --cascade=orphan
    by_launch = {s.launch_name: s for s in await wf.list_strays(MANAGED)}
    assert by_launch["stray-1"].launch_gone
    assert not by_launch["kept-1"].launch_gone
    assert by_launch["stray-1"].identity == launch("stray-1", SLEEP, kind="argo").identity
    assert by_launch["stray-1"].namespace == NS
    await wf.stop_stray(by_launch["stray-1"])

    async def stopped() -> bool:
        left = await wf.list_strays(MANAGED)
        return [s.launch_name for s in left] == ["kept-1"]

    await eventually(stopped, what="the stray pod stopping, the other left alone")
    await wf.stop_stray(by_launch["stray-1"])  # again, gone or going: fine
    assert cluster.api.find(kube_api.WORKFLOWS, NS, "kept-1") is not None


async def test_a_namesake_workflow_made_since_does_not_hide_the_orphan(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    # The label names the Workflow; only its uid says which one made the pod.
    await wf.launch(launch("again-1", SLEEP, kind="argo"))
    await running(cluster, "again-1")
    [old] = pods_of(cluster, "again-1")
    cluster.api.remove(kube_api.WORKFLOWS, NS, "again-1", "Orphan")
    await wf.launch(launch("again-1", SLEEP, kind="argo"))  # the launch made again under its name
    await eventually(lambda: len(pods_of(cluster, "again-1")) == 2, what="a second pod")
    gone = {s.uid: s.launch_gone for s in await wf.list_strays(MANAGED)}
    assert gone.pop(old["metadata"]["uid"]) is True
    assert list(gone.values()) == [False], "the new Workflow's pod is its own"


async def test_each_cluster_executor_sweeps_only_its_own_pods(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    # Fails on the code before: both read every pod with corral's labels as theirs, so
    # each took the other's pods for strays whose launch was gone, and deleted them.
    job = launch("job-1", SLEEP)
    async with started(kubernetes.KubernetesExecutor, cluster) as ex:
        await ex.launch(job)
        await wf.launch(launch("flow-1", SLEEP, kind="argo", job_id=2, fence=2))

        def both_running() -> bool:
            pods = cluster.api.objects(kube_api.PODS)
            return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

        await eventually(both_running, what="a Job's pod and a Workflow's running")
        jobs, flows = await ex.list_strays(MANAGED), await wf.list_strays(MANAGED)
    assert [(s.launch_name, s.launch_gone) for s in jobs] == [("job-1", False)]
    assert [(s.launch_name, s.launch_gone) for s in flows] == [("flow-1", False)]


async def test_recovery_stops_the_pod_of_a_workflow_deleted_without_propagation(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor, db: store.Store
) -> None:
    # Fails on the code before: the sweep listed Workflows only, and the pod ran on while
    # its attempt was marked lost and the job ran again.
    now = clock.SystemClock().now()
    spec = wf.validate_spec({"image": IMAGE, "command": ["sleep", "30"]})
    await db.jobs.submit(new=[model.NewJob(executor="argo", spec=spec)], now=now)
    [claimed] = await db.jobs.claim(now=now, limit=1, executors=["argo"])
    launched = launching.build_launch(claimed, reach=launching.Reach(), deadline_seconds=None)
    await wf.launch(launched)
    await db.attempts.record_running(fences=[claimed.attempt.id], now=now)
    await running(cluster, launched.name)
    cluster.api.remove(kube_api.WORKFLOWS, NS, launched.name, "Orphan")
    r = reconciler.Reconciler(
        store=db, executors={"argo": wf}, clock=FrozenClock(now), settings=settings()
    )
    assert (await r.run_once()).orphans_cancelled == 1

    def deleted() -> bool:
        return all(p["metadata"].get("deletionTimestamp") for p in pods_of(cluster, launched.name))

    await eventually(deleted, what="the orphaned pod deleted")
