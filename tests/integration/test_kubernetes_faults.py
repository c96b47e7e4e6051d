"""The kubernetes and argo executors under the faults a real cluster has: lost answers,
name clashes, replaced pods, evictions, deadlines, TTL deletes, broken watches and an
API server that errs or crawls. The real client, against the API double on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import kmock
import pytest

from corral import clock, config, errors, model
from corral.executors import argo, kubernetes
from tests.contract.test_executors import sh
from tests.support import kube_api
from tests.support.launches import make_launch
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(6 * PATIENCE)  # a test waits for at most six things

NS = "default"
JOBS_URL = "/apis/batch/v1/namespaces/default/jobs"
IMAGE = "busybox:1.36"


def settings(**k8s: Any) -> config.Settings:
    return config.Settings(
        executors={
            "kubernetes": {
                "namespace": NS,
                "termination_grace": 2,
                "request_timeout": 1,
                "watch_timeout": 2,
                **k8s,
            }
        }
    )


def launch(name: str, command: list[str], **kw: Any) -> model.Launch:
    return make_launch("kubernetes", name, {"image": IMAGE, "command": command}, **kw)


@pytest.fixture
async def cluster() -> AsyncIterator[kube_api.Cluster]:
    async with kube_api.cluster() as c:
        yield c


@contextlib.asynccontextmanager
async def started(made: Any, cluster: kube_api.Cluster) -> AsyncIterator[Any]:
    """An executor of class `made` on the double, started, closed on exit."""
    executor = made(
        settings=settings(),
        clock=clock.SystemClock(),
        configuration=kube_api.configuration(cluster),
    )
    await executor.start()
    try:
        yield executor
    finally:
        await executor.close()


@pytest.fixture
async def ex(cluster: kube_api.Cluster) -> AsyncIterator[kubernetes.KubernetesExecutor]:
    async with started(kubernetes.KubernetesExecutor, cluster) as executor:
        yield executor


async def observe(ex: Any, name: str) -> model.Observation:
    return (await ex.observe([name]))[name]


async def until(ex: Any, name: str, test: Any) -> model.Observation:
    async def seen() -> model.Observation | None:
        obs = await observe(ex, name)
        return obs if test(obs) else None

    found: model.Observation = await eventually(seen, what=f"{name} as wanted")
    return found


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
    assert (obs.phase, obs.identity) == (model.Phase.SUCCEEDED, model.Identity(1, 1, 1))


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
    spec = {"image": IMAGE, "command": ["true"], "placement": "gone"}
    with pytest.raises(errors.ExecutorError, match="add it back or cancel") as caught:
        await ex.launch(make_launch("kubernetes", "moved-1", spec))
    assert not isinstance(caught.value, errors.LaunchRefused), "not the job's fault"


# --- pods ----------------------------------------------------------------------------------


async def test_a_disrupted_pod_is_replaced_and_the_job_is_still_one_attempt(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, tmp_path: Any
) -> None:
    gate = tmp_path / "go"
    await ex.launch(launch("evict-1", sh(f"while [ ! -e {gate} ]; do sleep 0.05; done")))
    await until(ex, "evict-1", lambda o: o.phase is model.Phase.RUNNING)
    job = cluster.api.get(kube_api.JOBS, NS, "evict-1")
    (first,) = cluster.jobs.pods_of(job)
    cluster.jobs.disrupt(NS, first["metadata"]["name"], "EvictionByEvictionAPI")
    await eventually(
        lambda: len(cluster.jobs.pods_of(job)) == 2, what="a second pod (podFailurePolicy Ignore)"
    )
    assert not (await observe(ex, "evict-1")).phase.finished, "the Job lives on"
    gate.touch()
    obs = await until(ex, "evict-1", lambda o: o.phase.finished)
    assert (obs.phase, obs.identity) == (model.Phase.SUCCEEDED, model.Identity(1, 1, 1))
    assert len(await ex.list_managed({model.JOB_ID: "1"})) == 1, "one Job, one attempt"


async def test_oom_killed(cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor) -> None:
    await ex.launch(launch("oom-1", ["sleep", "30"]))
    await until(ex, "oom-1", lambda o: o.phase is model.Phase.RUNNING)
    (pod,) = cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "oom-1"))
    cluster.kubelet.oom_kill(NS, pod["metadata"]["name"])
    obs = await until(ex, "oom-1", lambda o: o.phase.finished)
    assert (obs.phase, obs.exit_code, obs.reason) == (model.Phase.FAILED, 137, "OOMKilled")


async def test_a_failed_job_whose_pod_is_gone_says_so(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("gone-1", ["false"]))
    await until(ex, "gone-1", lambda o: o.phase.finished)
    for pod in cluster.jobs.pods_of(cluster.api.get(kube_api.JOBS, NS, "gone-1")):
        cluster.api.remove(kube_api.PODS, NS, pod["metadata"]["name"])
    obs = await observe(ex, "gone-1")
    assert obs.phase is model.Phase.FAILED
    assert obs.exit_code is None
    assert obs.reason == "Job failed (BackoffLimitExceeded); its pod is gone, so no exit code"


async def test_cancel_deletes_the_job_and_its_pods(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await ex.launch(launch("stop-1", ["sleep", "30"]))
    await until(ex, "stop-1", lambda o: o.phase is model.Phase.RUNNING)
    await ex.cancel("stop-1", timedelta(seconds=1))
    assert (await observe(ex, "stop-1")).phase is model.Phase.ABSENT
    assert cluster.api.objects(kube_api.PODS) == [], "Background propagation: no orphans"


async def test_a_job_that_finishes_while_being_cancelled_keeps_its_result(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ex.launch(launch("race-1", ["sleep", "30"]))
    await until(ex, "race-1", lambda o: o.phase is model.Phase.RUNNING)

    read = ex._get

    async def read_then_finish(name: str) -> dict[str, Any] | None:
        """The cancel reads the Job running; it completes before the delete arrives."""
        job = await read(name)
        cluster.jobs._finish(cluster.api.get(kube_api.JOBS, NS, name), "Complete", None)
        return job

    monkeypatch.setattr(ex, "_get", read_then_finish)
    await ex.cancel("race-1", timedelta(seconds=1))
    job = cluster.api.get(kube_api.JOBS, NS, "race-1")
    assert "deletionTimestamp" not in job["metadata"], "the delete's precondition refused it"
    assert (await observe(ex, "race-1")).phase is model.Phase.SUCCEEDED


# --- an unreliable API server --------------------------------------------------------------


async def test_5xx_and_429_are_tried_again(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api[f"post {JOBS_URL}"][:1] << 503 << {"kind": "Status", "code": 503}
    cluster.api[f"get {JOBS_URL}/retry-1"][:1] << 429 << {"kind": "Status", "code": 429}
    await ex.launch(launch("retry-1", ["true"]))
    assert (await observe(ex, "retry-1")).phase is not model.Phase.ABSENT


async def test_an_api_server_that_keeps_failing_is_an_executor_error(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api[f"get {JOBS_URL}/down-1"] << 500 << {"kind": "Status", "code": 500}
    with pytest.raises(errors.ExecutorError, match="500"):
        await observe(ex, "down-1")


async def test_a_slow_answer_times_out_instead_of_hanging(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    async def crawl(_: Any) -> dict[str, Any]:
        await asyncio.sleep(30)
        return {}

    cluster.api[f"get {JOBS_URL}/slow-1"] << crawl
    began = time.monotonic()
    with pytest.raises(errors.ExecutorError, match="no answer"):
        await observe(ex, "slow-1")
    assert time.monotonic() - began < 30, "gave up before the answer came (1s a try, 4 tries)"


async def test_forbidden_says_to_check_the_role(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.api[f"get {JOBS_URL}/rbac-1"] << 403 << {"kind": "Status", "code": 403}
    with pytest.raises(errors.ExecutorError, match="Role"):
        await observe(ex, "rbac-1")


# --- watches -------------------------------------------------------------------------------


class Listener:
    """Collects what `ex.events()` yields, from a task started on entry (entry returns
    once it has listed and opened its watch), until exit."""

    def __init__(self, ex: Any, cluster: kube_api.Cluster) -> None:
        self.ex = ex
        self.cluster = cluster
        self.seen: list[model.Observation] = []
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

    async def until(self, names: set[str]) -> list[tuple[str, model.Phase]]:
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


def gated(name: str, gate: Any) -> model.Launch:
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
        cluster.api.compact()  # ...and the history it would resume from is gone: 410
        cluster.api.frozen = False
        assert await heard.until({"gap-1"}) == [("gap-1", model.Phase.SUCCEEDED)]
    lists = [
        r
        for r in list(cluster.api)
        if r.method.value == "GET" and r.url.path == JOBS_URL and "watch" not in r.params
    ]
    assert len(lists) == 2, "the 410 made it list again"


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
        assert await heard.until({"cut-1"}) == [("cut-1", model.Phase.SUCCEEDED)]


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
        assert await heard.until({"proxy-1"}) == [("proxy-1", model.Phase.SUCCEEDED)]
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
        assert await heard.until({"new-1"}) == [("new-1", model.Phase.SUCCEEDED)]


# --- argo ----------------------------------------------------------------------------------


@pytest.fixture
async def wf(cluster: kube_api.Cluster) -> AsyncIterator[argo.ArgoExecutor]:
    async with started(argo.ArgoExecutor, cluster) as executor:
        yield executor


async def test_a_workflow_whose_pod_vanished_fails_instead_of_running_forever(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    await wf.launch(make_launch("argo", "vanish-1", {"image": IMAGE, "command": ["sleep", "30"]}))
    await until(wf, "vanish-1", lambda o: o.phase is model.Phase.RUNNING)
    for pod in cluster.api.objects(kube_api.PODS):
        cluster.api.remove(kube_api.PODS, NS, pod["metadata"]["name"])
    obs = await until(wf, "vanish-1", lambda o: o.phase.finished)
    assert obs.phase is model.Phase.FAILED
    assert obs.failure_class is model.FailureClass.TRANSIENT
    assert obs.reason is not None
    assert obs.reason.startswith("pod deleted")


async def test_argo_cancel_is_terminate_and_keeps_the_record(
    cluster: kube_api.Cluster, wf: argo.ArgoExecutor
) -> None:
    await wf.launch(make_launch("argo", "term-1", {"image": IMAGE, "command": ["sleep", "30"]}))
    await until(wf, "term-1", lambda o: o.phase is model.Phase.RUNNING)
    await wf.cancel("term-1", timedelta(seconds=1))
    obs = await until(wf, "term-1", lambda o: o.phase.finished)
    assert obs.phase is model.Phase.FAILED
    assert obs.reason is not None
    assert obs.reason.startswith("cancelled")
    assert cluster.api.get(kube_api.WORKFLOWS, NS, "term-1")["spec"]["shutdown"] == "Terminate"


async def test_a_kubeconfig_that_cannot_be_read_is_a_config_error(tmp_path: Any) -> None:
    broken = settings(kubeconfig=str(tmp_path / "no-such-kubeconfig"))
    executor = kubernetes.KubernetesExecutor(settings=broken, clock=clock.SystemClock())
    with pytest.raises(errors.ConfigError, match="executors.kubernetes: cannot load"):
        await executor.start()
