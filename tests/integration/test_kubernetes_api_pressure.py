"""The kubernetes executor against an API server under load: answers shed with 429 or 503
and a Retry-After are tried again after what the server asks, within the call's deadline.
The real client, against the API double on loopback; the waits on a clock that skips
them, so a test of a 2 s Retry-After does not take 2 s."""

from __future__ import annotations

from typing import Any

import pytest

from corral import clock, errors, launching, model, reconciler, store
from corral.executors import kubernetes
from corral.testing import FrozenClock
from tests.support import kube_api
from tests.support.cluster import JOBS_URL, NS, executor_fixture, launch, observe, settings, until
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(4 * PATIENCE)


class SkippingClock(clock.SystemClock):
    """The system clock, but a sleep returns at once and moves `monotonic` on by its
    length; `slept` keeps each one."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return super().monotonic() + sum(self.slept)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
def skipping() -> SkippingClock:
    return SkippingClock()


# request_timeout 1 s: a call's deadline is 4 s, (RETRIES + 1) request timeouts
ex = executor_fixture(kubernetes.KubernetesExecutor, clock_fixture="skipping")


@pytest.mark.parametrize("code", [429, 503])
async def test_retry_after_is_waited_for_as_long_as_the_server_asks(
    cluster: kube_api.Cluster,
    ex: kubernetes.KubernetesExecutor,
    skipping: SkippingClock,
    code: int,
) -> None:
    # Fails on the code before Retry-After was read: it gave up after 4 quick tries.
    await ex.launch(launch("shed-1", ["sleep", "30"]))
    skipping.slept.clear()
    cluster.api.throttle(f"get {JOBS_URL}", seconds=1, times=3, code=code)
    cluster.api.throttle(f"get {JOBS_URL}/shed-1", seconds=1, times=3, code=code)
    assert (await observe(ex, "shed-1")).phase is not launching.Phase.ABSENT
    assert skipping.slept == [1.0, 1.0, 1.0], "waited what the server asked, each time"


async def test_a_retry_after_past_the_deadline_is_cut_to_it_then_fails(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, skipping: SkippingClock
) -> None:
    await ex.launch(launch("shed-2", ["sleep", "30"]))
    skipping.slept.clear()
    cluster.api.throttle(f"get {JOBS_URL}", seconds=30, times=100)
    cluster.api.throttle(f"get {JOBS_URL}/shed-2", seconds=30, times=100)
    with pytest.raises(errors.ExecutorError, match="429"):
        await observe(ex, "shed-2")
    assert len(skipping.slept) == 1, "one wait, to the deadline, then no time left"
    assert 3.0 < skipping.slept[0] <= 4.0


# --- pods left behind ----------------------------------------------------------------------


async def test_a_pod_whose_job_was_deleted_without_propagation_is_a_stray(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    # Fails on the code before strays: nothing listed corral's pods apart from their Jobs.
    await ex.launch(launch("stray-1", ["sleep", "30"]))
    await ex.launch(launch("kept-1", ["sleep", "30"]))

    async def running() -> bool:
        pods = [p for p in cluster.api.objects(kube_api.PODS) if p["status"].get("phase")]
        return len([p for p in pods if p["status"]["phase"] == "Running"]) == 2

    await eventually(running, what="both pods running")
    cluster.api.remove(kube_api.JOBS, NS, "stray-1", "Orphan")  # kubectl --cascade=orphan
    strays = await ex.list_strays({model.MANAGED_BY: model.MANAGER})
    by_launch = {s.launch_name: s for s in strays}
    assert by_launch["stray-1"].launch_gone
    assert not by_launch["kept-1"].launch_gone
    assert by_launch["stray-1"].identity == launch("stray-1", []).identity
    await ex.stop_stray(by_launch["stray-1"])

    async def stopped() -> bool:
        left = await ex.list_strays({model.MANAGED_BY: model.MANAGER})
        return [s.launch_name for s in left] == ["kept-1"]

    await eventually(stopped, what="the stray pod stopping, the other left alone")
    await ex.stop_stray(by_launch["stray-1"])  # again, gone or going: fine


# --- observation by lists ------------------------------------------------------------------


def reads(cluster: kube_api.Cluster) -> tuple[int, int]:
    """The GETs of the Jobs' collection (lists) and of single Jobs (reads) so far."""
    gets = [r for r in list(cluster.api) if r.method.value == "GET" and "watch" not in r.params]
    lists = sum(1 for r in gets if r.url.path == JOBS_URL)
    singles = sum(1 for r in gets if r.url.path.startswith(JOBS_URL + "/"))
    return lists, singles


async def test_observe_is_one_list_not_a_read_per_job(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    # Fails on the code before lists: observe read each Job by name (five GETs).
    names = [f"many-{i}" for i in range(5)]
    for name in names:
        await ex.launch(launch(name, ["sleep", "30"]))
    before = reads(cluster)
    seen = await ex.observe([*names, "never-1"])
    lists, singles = (a - b for a, b in zip(reads(cluster), before, strict=True))
    assert (lists, singles) == (1, 0)
    assert seen["never-1"].phase is launching.Phase.ABSENT
    assert all(seen[name].phase is not launching.Phase.ABSENT for name in names)


def pod_lists(cluster: kube_api.Cluster) -> int:
    """The lists of pods so far (by label selector, for any Job's or all of corral's)."""
    path = f"/api/v1/namespaces/{NS}/pods"
    return sum(
        1
        for r in list(cluster.api)
        if r.method.value == "GET" and r.url.path == path and "watch" not in r.params
    )


async def test_the_pods_of_many_finished_jobs_are_one_list_not_one_a_job(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    # Fails on the code before: each finished Job's pods were listed by its controller-uid.
    names = [f"done-{i}" for i in range(5)]
    for name in names:
        await ex.launch(launch(name, ["sh", "-c", "echo bye; exit 3"]))
    for name in names:
        await until(ex, name, lambda o: o.phase.finished)
    before = pod_lists(cluster)
    seen = await ex.observe(names)
    assert pod_lists(cluster) - before == 1
    assert all(seen[name].exit_code == 3 for name in names), "each read its own pod"
    running = await ex.observe([])
    assert running == {}
    assert pod_lists(cluster) - before == 1, "no Job asked for: no pods listed"


async def test_one_malformed_job_leaves_its_name_unknown_not_the_page(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    # Fails on the code before: one Job's malformed conditions failed the whole observe.
    await ex.launch(launch("good-1", ["sleep", "30"]))
    await ex.launch(launch("bad-1", ["sleep", "30"]))
    cluster.api.patch(kube_api.JOBS, NS, "bad-1", {"status": {"conditions": ["Complete"]}})
    seen = await ex.observe(["good-1", "bad-1"])
    assert "bad-1" not in seen, "no observation: recovery takes it as unknown"
    assert seen["good-1"].phase is not launching.Phase.ABSENT


async def test_recovery_stops_the_pod_of_a_job_deleted_without_propagation(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor, db: store.Store
) -> None:
    # Fails on the code before strays: the sweep listed Jobs only, and the pod ran on
    # while its attempt was marked lost and the job ran again.
    now = clock.SystemClock().now()
    spec = ex.validate_spec({"image": "busybox:1.36", "command": ["sleep", "30"]})
    await db.jobs.submit(new=[model.NewJob(executor="kubernetes", spec=spec)], now=now)
    [claimed] = await db.jobs.claim(now=now, limit=1, executors=["kubernetes"])
    launched = launching.build_launch(claimed, reach=launching.Reach(), deadline_seconds=None)
    await ex.launch(launched)
    await db.attempts.record_running(fences=[claimed.attempt.id], now=now)

    def pod() -> dict[str, Any] | None:
        return next(iter(cluster.api.objects(kube_api.PODS)), None)

    await eventually(
        lambda: (p := pod()) is not None and p["status"].get("phase") == "Running",
        what="its pod running",
    )
    cluster.api.remove(kube_api.JOBS, NS, launched.name, "Orphan")
    r = reconciler.Reconciler(
        store=db, executors={"kubernetes": ex}, clock=FrozenClock(now), settings=settings()
    )
    assert (await r.run_once()).orphans_cancelled == 1
    await eventually(
        lambda: (p := pod()) is None or bool(p["metadata"].get("deletionTimestamp")),
        what="the orphaned pod deleted",
    )
