"""The kubernetes executor against an API server under load: answers shed with 429 or 503
and a Retry-After are tried again after what the server asks, within the call's deadline.
The real client, against the API double on loopback; the waits on a clock that skips
them, so a test of a 2 s Retry-After does not take 2 s."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from corral import clock, errors, model
from corral.executors import kubernetes
from tests.integration.test_kubernetes_faults import JOBS_URL, launch, observe, settings
from tests.support import kube_api
from tests.support.wait import PATIENCE

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
async def cluster() -> AsyncIterator[kube_api.Cluster]:
    async with kube_api.cluster() as c:
        yield c


@pytest.fixture
def skipping() -> SkippingClock:
    return SkippingClock()


@pytest.fixture
async def ex(
    cluster: kube_api.Cluster, skipping: SkippingClock
) -> AsyncIterator[kubernetes.KubernetesExecutor]:
    # request_timeout 1 s: a call's deadline is 4 s, (RETRIES + 1) request timeouts
    executor = kubernetes.KubernetesExecutor(
        settings=settings(),
        clock=skipping,
        configuration=kube_api.configuration(cluster),
    )
    await executor.start()
    try:
        yield executor
    finally:
        await executor.close()


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
    assert (await observe(ex, "shed-1")).phase is not model.Phase.ABSENT
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
