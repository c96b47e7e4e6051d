"""The kubernetes and argo executors under the faults a real cluster has: lost answers,
name clashes, replaced pods, evictions, deadlines, TTL deletes, broken watches and an
API server that errs or crawls. The real client, against the API double on loopback."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import kmock
import pytest

from corral import clock, errors, launching, model
from corral.executors import argo, argo_manifest, kubernetes, kubernetes_owned
from tests.support import kube_api
from tests.support.cluster import (
    JOBS_URL,
    NS,
    executor_fixture,
    launch,
    observe,
    settings,
    started,
    until,
)
from tests.support.launches import sh
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(6 * PATIENCE)  # a test waits for at most six things


ex = executor_fixture(kubernetes.KubernetesExecutor)


def creates(cluster: kube_api.Cluster) -> int:
    return sum(1 for r in list(cluster.api) if r.method.value == "POST" and r.url.path == JOBS_URL)


def watches(cluster: kube_api.Cluster) -> int:
    return sum(1 for r in list(cluster.api) if r.params.get("watch") == "true")


# --- launching -----------------------------------------------------------------------------


async def test_create_stored_but_its_answer_lost_is_launched_once(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api.reply_lost[("create", "jobs")] = 1  # stored, then 504 to the client
    await ex.launch(launch("lost-1", ["true"]))
    assert creates(cluster) == 2, "tried again, and the second create saw 409"
    assert len(cluster.api.objects(kube_api.JOBS)) == 1
    obs = await until(ex, "lost-1", lambda o: o.phase.finished)
    assert (obs.phase, obs.identity) == (launching.Phase.SUCCEEDED, model.Identity(1, 1, 1))


async def test_409_from_an_earlier_attempts_job_is_a_conflict(
    ex: kubernetes.KubernetesExecutor,
) -> None:
    await ex.launch(launch("clash-1", ["sleep", "5"], attempt_no=1, fence=1))
    with pytest.raises(errors.LaunchConflict) as caught:
        await ex.launch(launch("clash-1", ["sleep", "5"], attempt_no=2, fence=2))
    assert "belongs to job 1 attempt 1 fence 1" in str(caught.value)
    assert "this launch is job 1 attempt 2 fence 2" in str(caught.value)


async def test_409_from_our_own_job_being_deleted_is_not_launched(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    mine = launch("dying-1", ["sleep", "5"])
    await ex.launch(mine)
    cluster.api.patch(kube_api.JOBS, NS, "dying-1", {"metadata": {"finalizers": ["x/hold"]}})
    cluster.api.remove(kube_api.JOBS, NS, "dying-1", "Background")
    with pytest.raises(errors.LaunchConflict, match="being deleted"):
        await ex.launch(mine)


async def test_an_invalid_job_refused_by_the_api_server_is_launch_refused(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api.validators[kube_api.JOBS] = lambda _: ["spec.template: refused by policy"]
    with pytest.raises(errors.LaunchRefused, match="refused by policy"):
        await ex.launch(launch("refused-1", ["true"]))


async def test_a_placement_class_removed_since_submit_says_to_add_it_back(
    ex: kubernetes.KubernetesExecutor,
) -> None:
    with pytest.raises(errors.ExecutorError, match="add it back or cancel") as caught:
        await ex.launch(launch("moved-1", ["true"], spec={"placement": "gone"}))
    assert not isinstance(caught.value, errors.LaunchRefused), "not the job's fault"


# --- pods ----------------------------------------------------------------------------------


async def test_a_disrupted_pod_is_replaced_and_the_job_is_still_one_attempt(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, tmp_path: Any
) -> None:
    gate = tmp_path / "go"
    await ex.launch(launch("evict-1", sh(f"while [ ! -e {gate} ]; do sleep 0.05; done")))
    await until(ex, "evict-1", lambda o: o.phase is launching.Phase.RUNNING)
    job = cluster.api.get(kube_api.JOBS, NS, "evict-1")
    (first,) = cluster.jobs.pods_of(job)
    cluster.jobs.disrupt(NS, first["metadata"]["name"], "EvictionByEvictionAPI")
    await eventually(
        lambda: len(cluster.jobs.pods_of(job)) == 2, what="a second pod (podFailurePolicy Ignore)"
    )
    assert not (await observe(ex, "evict-1")).phase.finished, "the Job lives on"
    gate.touch()
    obs = await until(ex, "evict-1", lambda o: o.phase.finished)
    assert (obs.phase, obs.identity) == (launching.Phase.SUCCEEDED, model.Identity(1, 1, 1))
    assert len(await ex.list_managed({model.JOB_ID: "1"})) == 1, "one Job, one attempt"


async def test_oom_killed(cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor) -> None:
    await ex.launch(launch("oom-1", ["sleep", "30"]))
    await until(ex, "oom-1", lambda o: o.phase is launching.Phase.RUNNING)
    (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "oom-1"))
    cluster.kubelet.oom_kill(NS, pod["metadata"]["name"])
    obs = await until(ex, "oom-1", lambda o: o.phase.finished)
    assert (obs.phase, obs.exit_code, obs.reason) == (launching.Phase.FAILED, 137, "OOMKilled")


async def test_a_failed_job_whose_pod_is_gone_says_so(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("gone-1", ["false"]))
    await until(ex, "gone-1", lambda o: o.phase.finished)
    for pod in cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "gone-1")):
        cluster.api.remove(kube_api.PODS, NS, pod["metadata"]["name"])
    obs = await observe(ex, "gone-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.exit_code is None
    assert obs.reason == "Job failed (BackoffLimitExceeded); its pod is gone, so no exit code"


async def test_cancel_deletes_the_job_and_its_pods(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("stop-1", ["sleep", "30"]))
    await until(ex, "stop-1", lambda o: o.phase is launching.Phase.RUNNING)
    await ex.cancel("stop-1", timedelta(seconds=1))
    assert (await observe(ex, "stop-1")).phase is launching.Phase.ABSENT
    await eventually(  # Terminating until its container ends, then gone
        lambda: cluster.api.objects(kube_api.PODS) == [], what="Background propagation: no orphans"
    )


async def test_a_job_that_finishes_while_being_cancelled_keeps_its_result(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ex.launch(launch("race-1", ["sleep", "30"]))
    await until(ex, "race-1", lambda o: o.phase is launching.Phase.RUNNING)

    read = ex._get

    async def read_then_finish(name: str) -> dict[str, Any] | None:
        """The cancel reads the Job running; its pod exits 0, so the Job completes,
        before the delete arrives."""
        job = await read(name)
        (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, name))
        cluster.kubelet.end(NS, pod["metadata"]["name"], 0)
        return job

    monkeypatch.setattr(ex, "_get", read_then_finish)
    await ex.cancel("race-1", timedelta(seconds=1))
    job = cluster.api.get(kube_api.JOBS, NS, "race-1")
    assert "deletionTimestamp" not in job["metadata"], "the delete's precondition refused it"
    assert (await observe(ex, "race-1")).phase is launching.Phase.SUCCEEDED


# --- an unreliable API server --------------------------------------------------------------


async def test_5xx_and_429_are_tried_again(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api[f"post {JOBS_URL}"][:1] << 503 << {"kind": "Status", "code": 503}
    cluster.api[f"get {JOBS_URL}/retry-1"][:1] << 429 << {"kind": "Status", "code": 429}
    await ex.launch(launch("retry-1", ["true"]))
    assert (await observe(ex, "retry-1")).phase is not launching.Phase.ABSENT


async def test_an_api_server_that_keeps_failing_is_an_executor_error(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api[f"get {JOBS_URL}"] << 500 << {"kind": "Status", "code": 500}
    with pytest.raises(errors.ExecutorError, match="500"):
        await observe(ex, "down-1")


async def test_a_slow_answer_times_out_instead_of_hanging(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    async def crawl(_: Any) -> dict[str, Any]:
        await asyncio.sleep(30)
        return {}

    cluster.api[f"get {JOBS_URL}"] << crawl
    began = time.monotonic()
    with pytest.raises(errors.ExecutorError, match="no answer"):
        await observe(ex, "slow-1")
    assert time.monotonic() - began < 30, "gave up before the answer came (1s a try, 4 tries)"


async def test_forbidden_says_to_check_the_role(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api[f"get {JOBS_URL}"] << 403 << {"kind": "Status", "code": 403}
    with pytest.raises(errors.ExecutorError, match="Role"):
        await observe(ex, "rbac-1")


# --- watches -------------------------------------------------------------------------------


class Listener:
    """Collects what `ex.events()` yields, from a task started on entry (entry returns
    once it has listed and opened its watch), until exit."""

    def __init__(self, ex: Any, cluster: kube_api.Cluster) -> None:
        self.ex = ex
        self.cluster = cluster
        self.seen: list[launching.Observation] = []
        self.marks = 0

    async def _listen(self) -> None:
        async for obs in self.ex.events():
            self.seen.append(obs)

    async def __aenter__(self) -> Listener:
        self.task = asyncio.create_task(self._listen())
        await self.cluster.api.watched()
        return self

    async def __aexit__(self, *_: object) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def until(self, names: set[str]) -> list[tuple[str, launching.Phase]]:
        """What was heard, once `names` were, and a Job launched after them has finished and
        been heard too: the stream yields in order, so anything it yielded twice is in."""
        await eventually(lambda: names <= {o.name for o in self.seen}, what=f"{names} heard")
        self.marks += 1
        mark = f"mark-{self.marks}"
        await self.ex.launch(
            launch(mark, ["true"], job_id=900 + self.marks, fence=900 + self.marks)
        )
        await eventually(lambda: mark in {o.name for o in self.seen}, what=f"{mark} heard")
        return [(o.name, o.phase) for o in self.seen if not o.name.startswith("mark-")]


def gated(name: str, gate: Any) -> launching.Launch:
    """A launch whose command runs until `gate` exists."""
    return launch(name, sh(f"while [ ! -e {gate} ]; do sleep 0.05; done"))


async def test_the_watch_lists_again_after_410_and_yields_what_it_missed(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, tmp_path: Any
) -> None:
    gate = tmp_path / "go"
    await ex.launch(gated("gap-1", gate))
    async with Listener(ex, cluster) as heard:
        cluster.api.end_watches()  # the stream ends...
        cluster.api.frozen = True
        gate.touch()  # ...the Job finishes while no stream is open...
        await until(ex, "gap-1", lambda o: o.phase.finished)
        before = lists(cluster)  # observe lists too: count from here
        cluster.api.compact()  # ...and the history it would resume from is gone: 410
        cluster.api.frozen = False
        assert await heard.until({"gap-1"}) == [("gap-1", launching.Phase.SUCCEEDED)]
    assert lists(cluster) - before == 1, "the 410 made it list again"


def lists(cluster: kube_api.Cluster) -> int:
    """The lists of Jobs (not watches) the double has answered."""
    return sum(
        1
        for r in list(cluster.api)
        if r.method.value == "GET" and r.url.path == JOBS_URL and "watch" not in r.params
    )


async def test_a_silently_cut_watch_times_out_and_resumes(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, tmp_path: Any
) -> None:
    gate = tmp_path / "go"
    await ex.launch(gated("cut-1", gate))
    async with Listener(ex, cluster) as heard:
        cluster.api.frozen = True  # open, but nothing arrives: only the client's timeout helps
        opened = watches(cluster)
        gate.touch()
        await until(ex, "cut-1", lambda o: o.phase.finished)
        await eventually(  # after watch_timeout 2s + request_timeout 1s
            lambda: watches(cluster) > opened, what="the silent watch given up and opened again"
        )
        cluster.api.frozen = False
        assert await heard.until({"cut-1"}) == [("cut-1", launching.Phase.SUCCEEDED)]


async def test_a_watch_answered_by_error_pages_backs_off_and_recovers(
    cluster: kube_api.Cluster,
    ex: kubernetes.KubernetesExecutor,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A proxy in front of the API server answers watches with HTML (then with nothing):
    # the stream must neither die nor spin.
    watching = cluster.api["get", JOBS_URL, kmock.params(watch="true")]
    watching[:2] << 503 << b"<html>502 Bad Gateway</html>"
    watching[:3] << 503 << b""
    gate = tmp_path / "go"
    await ex.launch(gated("proxy-1", gate))
    heard = Listener(ex, cluster)
    began = time.monotonic()
    heard.task = asyncio.create_task(heard._listen())
    try:
        await cluster.api.watched()
        gate.touch()
        assert await heard.until({"proxy-1"}) == [("proxy-1", launching.Phase.SUCCEEDED)]
    finally:
        await heard.__aexit__()
    took = time.monotonic() - began
    # The refusals, then a watch per watch_timeout (2s) for as long as the test took, however
    # slow the machine: a stream that spins instead of pausing tries many times a second.
    assert 3 <= watches(cluster) <= 6 + took / 2, "refused, paused, tried again: no spinning"
    assert "watch broke" in caplog.text


async def test_jobs_finished_before_the_first_list_are_left_to_recovery(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("old-1", ["true"], fence=1))
    await until(ex, "old-1", lambda o: o.phase.finished)
    async with Listener(ex, cluster) as heard:
        await ex.launch(launch("new-1", ["true"], job_id=2, fence=2))
        assert await heard.until({"new-1"}) == [("new-1", launching.Phase.SUCCEEDED)]


# --- argo ----------------------------------------------------------------------------------


wf = executor_fixture(argo.ArgoExecutor)


async def test_a_workflow_whose_pod_vanished_fails_instead_of_running_forever(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    await wf.launch(launch("vanish-1", ["sleep", "30"], kind="argo"))
    await until(wf, "vanish-1", lambda o: o.phase is launching.Phase.RUNNING)
    for pod in cluster.api.objects(kube_api.PODS):
        cluster.api.remove(kube_api.PODS, NS, pod["metadata"]["name"])
    obs = await until(wf, "vanish-1", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.FAILED
    assert obs.failure_class is model.FailureClass.TRANSIENT
    assert obs.reason is not None
    assert obs.reason.startswith("pod deleted")


async def test_argo_cancel_is_terminate_and_keeps_the_record(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    await wf.launch(launch("term-1", ["sleep", "30"], kind="argo"))
    await until(wf, "term-1", lambda o: o.phase is launching.Phase.RUNNING)
    await wf.cancel("term-1", timedelta(seconds=1))
    obs = await until(wf, "term-1", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert obs.reason.startswith("cancelled")
    assert cluster.api.get(kube_api.WORKFLOWS, NS, "term-1")["spec"]["shutdown"] == "Terminate"


async def test_a_kubeconfig_that_cannot_be_read_is_a_config_error(tmp_path: Any) -> None:
    broken = settings(kubeconfig=str(tmp_path / "no-such-kubeconfig"))
    executor = kubernetes.KubernetesExecutor(settings=broken, clock=clock.SystemClock())
    with pytest.raises(errors.ConfigError, match="executors.kubernetes: cannot load"):
        await executor.start()


# --- payloads, on Jobs and Workflows ---------------------------------------------------------

CONFIGMAPS_URL = "/api/v1/namespaces/default/configmaps"
SMALL = {"text": "grüße, 世界, 🐎", "n": [1, 2.5, True, None]}
LARGE = {"rows": [f"row {n}: {'é' * 40}" for n in range(500)]}  # ~44 KB: past 32 KiB
OWNERS = {
    "kubernetes": (kube_api.JOBS, "batch/v1", "Job"),
    "argo": (kube_api.WORKFLOWS, argo_manifest.API_VERSION, "Workflow"),
}
READ_PAYLOAD = (
    'if [ -n "${CORRAL_PAYLOAD_FILE:-}" ]; then'
    ' printf %s "$CORRAL_PAYLOAD_FILE" > {out}.where; stat -c %a "$CORRAL_PAYLOAD_FILE" > {out}.mode;'
    ' cat "$CORRAL_PAYLOAD_FILE" > {out}; else printf %s "$CORRAL_PAYLOAD" > {out}; fi'
)


@pytest.fixture(params=["kubernetes", "argo"])
async def either(request: pytest.FixtureRequest, cluster: kube_api.Cluster) -> AsyncIterator[Any]:
    made = {"kubernetes": kubernetes.KubernetesExecutor, "argo": argo.ArgoExecutor}[request.param]
    async with started(made, cluster) as executor:
        yield executor


def payload_launch(kind: str, name: str, payload: Any, out: Any, **kw: Any) -> launching.Launch:
    command = sh(READ_PAYLOAD.replace("{out}", str(out)))
    return launch(name, command, kind=kind, payload=payload, **kw)


def owner_of(cluster: kube_api.Cluster, kind: str, name: str) -> dict[str, Any]:
    resource, api_version, owner_kind = OWNERS[kind]
    found = cluster.api.get(resource, NS, name)
    return {
        "apiVersion": api_version,
        "kind": owner_kind,
        "name": name,
        "uid": found["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": True,
    }


async def test_a_small_payload_is_in_the_environment_and_makes_no_config_map(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    out = tmp_path / "out"
    await either.launch(payload_launch(either.kind, "small-1", SMALL, out))
    obs = await until(either, "small-1", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.SUCCEEDED
    assert out.read_bytes().decode() == launching.payload_json(SMALL), "UTF-8 as it is"
    assert cluster.api.objects(kube_api.CONFIGMAPS) == []


async def test_a_large_payload_is_an_owned_config_map_mounted_read_only(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    out = tmp_path / "out"
    await either.launch(payload_launch(either.kind, "large-1", LARGE, out))
    obs = await until(either, "large-1", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.SUCCEEDED
    assert json.loads(out.read_text(encoding="utf-8")) == LARGE
    assert Path(f"{out}.mode").read_text() == "444\n"
    # The double mounts a volume in a folder of this machine: the path says where it is.
    assert Path(f"{out}.where").read_text().endswith("/payload.json")
    [pod] = cluster.api.objects(kube_api.PODS)
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CORRAL_PAYLOAD_FILE"] == "/var/run/corral/payload/payload.json"
    assert "CORRAL_PAYLOAD" not in env
    config_map = cluster.api.get(kube_api.CONFIGMAPS, NS, "large-1")
    assert config_map["metadata"]["ownerReferences"] == [owner_of(cluster, either.kind, "large-1")]
    resource = OWNERS[either.kind][0]
    assert (
        config_map["metadata"]["labels"]
        == cluster.api.get(resource, NS, "large-1")["metadata"]["labels"]
    )
    assert config_map["data"] == {"payload.json": launching.payload_json(LARGE)}


async def test_the_config_map_goes_when_its_owner_is_deleted(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    await either.launch(payload_launch(either.kind, "gone-2", LARGE, tmp_path / "out"))
    await until(either, "gone-2", lambda o: o.phase.finished)
    assert cluster.api.find(kube_api.CONFIGMAPS, NS, "gone-2") is not None
    if either.kind == "kubernetes":
        cluster.jobs.ttl_expire(NS, "gone-2")  # the TTL controller deletes it in the background
    else:
        cluster.api.remove(kube_api.WORKFLOWS, NS, "gone-2")  # the Workflow's TTL, the same
    assert cluster.api.find(kube_api.CONFIGMAPS, NS, "gone-2") is None


async def test_a_cancelled_jobs_config_map_goes_with_it(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("stop-2", ["sleep", "30"], payload=LARGE))
    await until(ex, "stop-2", lambda o: o.phase is launching.Phase.RUNNING)
    await ex.cancel("stop-2", timedelta(seconds=1))
    assert cluster.api.find(kube_api.CONFIGMAPS, NS, "stop-2") is None


async def test_a_launch_cut_short_before_its_config_map_is_finished_by_the_next(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    # As a crash between the two creates leaves it: the owner made, its ConfigMap not.
    cluster.api[f"post {CONFIGMAPS_URL}"][:4] << 503 << {"kind": "Status", "code": 503}
    out = tmp_path / "out"
    cut = payload_launch(either.kind, "cut-2", LARGE, out)
    with pytest.raises(errors.ExecutorError, match="ConfigMap"):
        await either.launch(cut)
    assert cluster.api.find(kube_api.CONFIGMAPS, NS, "cut-2") is None
    waiting = await until(either, "cut-2", lambda o: o.phase is not launching.Phase.ABSENT)
    assert waiting.phase is launching.Phase.PENDING, "its pod waits for the ConfigMap"
    [pod] = cluster.api.objects(kube_api.PODS)
    await eventually(
        lambda: waiting_reason(cluster, pod["metadata"]["name"]) == "ContainerCreating",
        what="the pod in ContainerCreating",
    )
    assert not out.exists()
    await either.launch(dataclasses.replace(cut, relaunch=True))  # as recovery asks again
    obs = await until(either, "cut-2", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.SUCCEEDED
    assert json.loads(out.read_text(encoding="utf-8")) == LARGE
    config_map = cluster.api.get(kube_api.CONFIGMAPS, NS, "cut-2")
    assert config_map["metadata"]["ownerReferences"] == [owner_of(cluster, either.kind, "cut-2")]
    resource = OWNERS[either.kind][0]
    assert len(cluster.api.objects(resource)) == 1, "one owner: its 409 counted as launched"


def waiting_reason(cluster: kube_api.Cluster, pod: str) -> str | None:
    statuses = cluster.api.get(kube_api.PODS, NS, pod)["status"].get("containerStatuses") or [{}]
    reason = statuses[0].get("state", {}).get("waiting", {}).get("reason")
    return None if reason is None else str(reason)


async def test_a_config_map_create_whose_answer_was_lost_counts_as_made(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    cluster.api.reply_lost[("create", "configmaps")] = 1  # stored, then 504 to the client
    await either.launch(payload_launch(either.kind, "lost-2", LARGE, tmp_path / "out"))
    assert len(cluster.api.objects(kube_api.CONFIGMAPS)) == 1
    assert (
        await until(either, "lost-2", lambda o: o.phase.finished)
    ).phase is launching.Phase.SUCCEEDED


async def test_a_config_map_left_by_an_earlier_owner_of_the_name_is_taken_over(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    # The name's earlier Job (or Workflow) was deleted and its garbage not yet collected,
    # or the ConfigMap was orphaned: it must not go while the new pod needs it.
    out = tmp_path / "out"
    mine = payload_launch(either.kind, "left-1", LARGE, out)
    _, api_version, owner_kind = OWNERS[either.kind]
    stale = {"apiVersion": api_version, "kind": owner_kind, "name": "left-1", "uid": "gone-uid"}
    cluster.api.put(
        kube_api.CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "left-1",
                "namespace": NS,
                "labels": dict(mine.labels),
                "ownerReferences": [stale],
            },
            "data": {"payload.json": launching.payload_json(LARGE)},
        },
    )
    await either.launch(mine)
    config_map = cluster.api.get(kube_api.CONFIGMAPS, NS, "left-1")
    assert config_map["metadata"]["ownerReferences"] == [owner_of(cluster, either.kind, "left-1")]
    assert (
        await until(either, "left-1", lambda o: o.phase.finished)
    ).phase is launching.Phase.SUCCEEDED
    assert json.loads(out.read_text(encoding="utf-8")) == LARGE


async def test_a_config_map_of_another_attempt_is_a_conflict(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    other = payload_launch(either.kind, "theirs-1", LARGE, tmp_path / "out", fence=7)
    cluster.api.put(
        kube_api.CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "theirs-1", "namespace": NS, "labels": dict(other.labels)},
            "data": {"payload.json": "{}"},
        },
    )
    with pytest.raises(errors.LaunchConflict, match="fence 7"):
        await either.launch(payload_launch(either.kind, "theirs-1", LARGE, tmp_path / "out"))


# --- the attempt token, on Jobs and Workflows ------------------------------------------------

SECRETS_URL = "/api/v1/namespaces/default/secrets"
ATTEMPT_KEY = "k" * 48
API_REACH = launching.Reach(api_url="http://127.0.0.1:1", attempt_key=ATTEMPT_KEY)
READ_TOKEN = 'printf %s "$CORRAL_ATTEMPT_TOKEN" > {out}; test -n "$CORRAL_ATTEMPT_TOKEN"'


def token_launch(kind: str, name: str, out: Any, **kw: Any) -> launching.Launch:
    command = sh(READ_TOKEN.replace("{out}", str(out)))
    return launch(name, command, kind=kind, reach=API_REACH, **kw)


def secret_token(cluster: kube_api.Cluster, name: str) -> str:
    data = cluster.api.get(kube_api.SECRETS, NS, name)["data"]
    return base64.b64decode(data[kubernetes_owned.ATTEMPT_TOKEN_KEY]).decode()


async def test_the_attempt_token_reaches_the_pod_from_a_secret_its_owner_owns(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    out = tmp_path / "out"
    mine = token_launch(either.kind, "token-1", out, job_id=5, fence=8)
    token = launching.attempt_token(ATTEMPT_KEY, 5, 8)
    assert mine.env["CORRAL_ATTEMPT_TOKEN"] == token
    await either.launch(mine)
    obs = await until(either, "token-1", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.SUCCEEDED, obs
    assert out.read_text() == token, "the pod's environment has it"
    resource = OWNERS[either.kind][0]
    for made in (cluster.api.get(resource, NS, "token-1"), *cluster.api.objects(kube_api.PODS)):
        assert token not in json.dumps(made), "never in the Job, Workflow or pod in the clear"
    secret = cluster.api.get(kube_api.SECRETS, NS, "token-1")
    assert secret["metadata"]["ownerReferences"] == [owner_of(cluster, either.kind, "token-1")]
    assert secret["metadata"]["labels"] == dict(mine.labels)
    assert (secret["type"], secret["immutable"]) == ("Opaque", True)
    assert secret_token(cluster, "token-1") == token
    assert cluster.api.objects(kube_api.CONFIGMAPS) == [], "a small payload needs none"
    if either.kind == "kubernetes":
        cluster.jobs.ttl_expire(NS, "token-1")  # the TTL controller deletes it in the background
    else:
        cluster.api.remove(kube_api.WORKFLOWS, NS, "token-1")  # the Workflow's TTL, the same
    assert cluster.api.find(kube_api.SECRETS, NS, "token-1") is None, "collected with its owner"


async def test_a_launch_without_a_token_makes_no_secret(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    await either.launch(payload_launch(either.kind, "plain-1", SMALL, tmp_path / "out"))
    obs = await until(either, "plain-1", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.SUCCEEDED
    assert cluster.api.objects(kube_api.SECRETS) == []


async def test_a_launch_cut_short_before_its_secret_is_finished_by_the_next(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    # As a crash between the two creates leaves it: the owner made, its Secret not. The
    # payload's ConfigMap is made too, before the Secret.
    cluster.api[f"post {SECRETS_URL}"][:4] << 503 << {"kind": "Status", "code": 503}
    out = tmp_path / "out"
    command = sh(READ_TOKEN.replace("{out}", str(out)))
    cut = launch("cut-3", command, kind=either.kind, reach=API_REACH, payload=LARGE)
    with pytest.raises(errors.ExecutorError, match="Secret"):
        await either.launch(cut)
    assert cluster.api.find(kube_api.SECRETS, NS, "cut-3") is None
    assert cluster.api.find(kube_api.CONFIGMAPS, NS, "cut-3") is not None
    waiting = await until(either, "cut-3", lambda o: o.phase is not launching.Phase.ABSENT)
    assert waiting.phase is launching.Phase.PENDING, "its pod waits for the Secret"
    [pod] = cluster.api.objects(kube_api.PODS)
    await eventually(
        lambda: waiting_reason(cluster, pod["metadata"]["name"]) == "CreateContainerConfigError",
        what="the pod in CreateContainerConfigError",
    )
    assert not out.exists()
    await either.launch(dataclasses.replace(cut, relaunch=True))  # as recovery asks again
    obs = await until(either, "cut-3", lambda o: o.phase.finished)
    assert obs.phase is launching.Phase.SUCCEEDED
    assert out.read_text() == cut.env["CORRAL_ATTEMPT_TOKEN"]
    secret = cluster.api.get(kube_api.SECRETS, NS, "cut-3")
    assert secret["metadata"]["ownerReferences"] == [owner_of(cluster, either.kind, "cut-3")]
    assert len(cluster.api.objects(OWNERS[either.kind][0])) == 1, "its 409 counted as launched"


async def test_a_secret_left_by_an_earlier_owner_of_the_name_is_taken_over(
    cluster: kube_api.Cluster, either: Any, tmp_path: Any
) -> None:
    out = tmp_path / "out"
    mine = token_launch(either.kind, "left-2", out)
    _, api_version, owner_kind = OWNERS[either.kind]
    stale = {"apiVersion": api_version, "kind": owner_kind, "name": "left-2", "uid": "gone-uid"}
    owner = {"apiVersion": api_version, "kind": owner_kind, "name": "left-2", "uid": "x"}
    left = kubernetes_owned.attempt_secret(mine, namespace=NS, owner=owner)
    assert left is not None
    left["metadata"]["ownerReferences"] = [stale]
    cluster.api.put(kube_api.SECRETS, left)
    await either.launch(mine)
    secret = cluster.api.get(kube_api.SECRETS, NS, "left-2")
    assert secret["metadata"]["ownerReferences"] == [owner_of(cluster, either.kind, "left-2")]
    assert (
        await until(either, "left-2", lambda o: o.phase.finished)
    ).phase is launching.Phase.SUCCEEDED
    assert out.read_text() == mine.env["CORRAL_ATTEMPT_TOKEN"]
