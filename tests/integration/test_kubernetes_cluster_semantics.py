"""The kubernetes and argo executors against what a real API server and its controllers do
that a simpler double would not: a Job's failure decided (FailureTarget) while its pod still
terminates, a disrupted pod replaced only once it has failed, watch bookmarks, validation
before the name check, and an Argo Workflow its controller refuses after the API server
took it in. Each test fails if the executor read the cluster the simpler way."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from corral import errors, launching, model
from corral.executors import argo, kubernetes
from tests.support import kube_api
from tests.support.cluster import NS, executor_fixture, launch, observe, started, until
from tests.support.launches import sh
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(6 * PATIENCE)

GRACE = 30
"""The pods' termination grace here: long, so that only a test's gate ends a pod."""


def gated(gate: Path) -> list[str]:
    """A command that runs until SIGTERM, then holds on until `gate` exists and exits 3;
    started once `gate` exists, it exits 0 at once."""
    return sh(
        f"if [ -e {gate} ]; then exit 0; fi;"
        f" trap 'while [ ! -e {gate} ]; do sleep 0.05; done; exit 3' TERM;"
        " while true; do sleep 0.05; done"
    )


ex = executor_fixture(kubernetes.KubernetesExecutor, termination_grace=GRACE)


def conditions(cluster: kube_api.Cluster, name: str) -> list[str]:
    job = cluster.api.get(kube_api.JOBS, NS, name)
    return [c["type"] for c in job["status"].get("conditions") or []]


async def heard(ex: Any, into: list[launching.Observation]) -> None:
    async for obs in ex.events():
        into.append(obs)


async def test_a_job_whose_failure_is_decided_is_not_failed_until_its_pod_has_ended(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, tmp_path: Path
) -> None:
    # Failed only once no pod runs: an attempt read as ended while its pod terminates
    # would let its retry run beside it.
    gate = tmp_path / "gate"
    seen: list[launching.Observation] = []
    listening = asyncio.create_task(heard(ex, seen))
    try:
        await cluster.api.watched()
        await ex.launch(launch("target-1", gated(gate), deadline_seconds=1))
        await eventually(
            lambda: conditions(cluster, "target-1") == ["FailureTarget"], what="FailureTarget"
        )
        (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "target-1"))
        assert pod["metadata"].get("deletionTimestamp"), "its pod terminating"
        assert not (await observe(ex, "target-1")).phase.finished, "not ended yet"
        gate.touch()
        ended = await until(ex, "target-1", lambda o: o.phase.finished)
        assert (ended.phase, ended.failure_class) == (
            launching.Phase.FAILED,
            model.FailureClass.TRANSIENT,
        )
        assert ended.reason is not None
        assert ended.reason.startswith("deadline exceeded")
        await eventually(lambda: seen, what="the finish from the watch")
        assert [(o.name, o.phase) for o in seen] == [("target-1", launching.Phase.FAILED)], (
            "one finish, the Failed one, not the FailureTarget before it"
        )
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


async def test_an_evicted_pod_is_replaced_once_it_has_failed_and_the_attempt_goes_on(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, tmp_path: Path
) -> None:
    # podReplacementPolicy Failed: while the evicted pod terminates no other runs, and
    # the attempt is neither ended nor doubled.
    gate = tmp_path / "gate"
    await ex.launch(launch("evict-2", gated(gate)))
    await until(ex, "evict-2", lambda o: o.phase is launching.Phase.RUNNING)
    job = cluster.api.get(kube_api.JOBS, NS, "evict-2")
    (first,) = cluster.jobs.pods_of(job)
    cluster.jobs.evict(NS, first["metadata"]["name"])
    await eventually(
        lambda: cluster.api.get(kube_api.JOBS, NS, "evict-2")["status"].get("terminating") == 1,
        what="the pod terminating",
    )
    assert [p["metadata"]["name"] for p in cluster.jobs.pods_of(job)] == [
        first["metadata"]["name"]
    ], "no replacement beside it"
    assert not (await observe(ex, "evict-2")).phase.finished, "the attempt goes on"
    gate.touch()
    ended = await until(ex, "evict-2", lambda o: o.phase.finished)
    assert (ended.phase, ended.identity) == (launching.Phase.SUCCEEDED, model.Identity(1, 1, 1))
    assert len(await ex.list_managed({model.JOB_ID: "1"})) == 1, "one Job, one attempt"


async def test_the_watch_resumes_from_a_bookmark_not_from_its_list(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    # A quiet selector's watch is kept fresh by bookmarks: resumed from one after its
    # stream ends, it is not expired by a compaction that the list's version would be.
    api = cluster.api
    api.bookmark_every = 0.05
    listening = asyncio.create_task(heard(ex, []))
    try:
        await api.watched()
        other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "elsewhere"}}
        api.put(kube_api.CONFIGMAPS, other)  # a change the watch does not see
        moved = api.last_rv
        await eventually(
            lambda: any(rv >= moved for rv in api.bookmarked), what="a bookmark past the list"
        )
        api.compact()
        before = set(api.watchers)
        api.end_watches()
        await eventually(lambda: set(api.watchers) - before, what="a watch opened again")
        lists = [c for c in api.calls if (c.resource, c.verb) == ("jobs", "list")]
        assert len(lists) == 1, "resumed from the bookmark: no 410, no list again"
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


async def test_an_invalid_job_whose_name_is_taken_is_refused_as_invalid(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    # The API server validates before it finds the name taken: the launch says what is
    # wrong with the Job, not that another attempt holds the name.
    await ex.launch(launch("taken-1", ["true"]))
    later = launch("taken-1", ["true"], attempt_no=2)
    bad = dataclasses.replace(later, labels={**later.labels, "team": "not a label value!"})
    with pytest.raises(errors.LaunchRefused, match="refused it as invalid") as caught:
        await ex.launch(bad)
    assert "team" in str(caught.value)
    assert not isinstance(caught.value, errors.LaunchConflict)


async def test_a_workflow_argo_refuses_after_it_was_created_fails_permanently(
    cluster: kube_api.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Argo's minimal CRDs let in a Workflow its controller then fails ("invalid spec"),
    # with no pod: the attempt fails with Argo's words, and no retry will do better.
    async with started(argo.ArgoExecutor, cluster) as wf:
        made = wf.template.manifest

        def astray(launched: launching.Launch, spec: Any) -> dict[str, Any]:
            body = made(launched, spec)
            body["spec"]["entrypoint"] = "nowhere"
            return body

        monkeypatch.setattr(wf.template, "manifest", astray)
        await wf.launch(launch("astray-1", ["true"], kind="argo"))
        ended = await until(wf, "astray-1", lambda o: o.phase.finished)
    said = "invalid spec: spec.entrypoint template 'nowhere' undefined"
    assert (ended.phase, ended.failure_class) == (
        launching.Phase.FAILED,
        model.FailureClass.PERMANENT,
    )
    assert ended.reason == f"Workflow refused by Argo: {said}"
    assert ended.message == said
    assert cluster.api.objects(kube_api.PODS) == []
