"""What the tests of the `kubernetes` and `argo` executors share: the API double with its
controllers as a fixture (`cluster`), settings with short limits, an executor of corral's
started on the double (and fixtures of one: `executor_fixture`), launches of one
container (`launch`), and waits on what it observes.

tests/integration/conftest.py makes `cluster` a fixture of every integration test, so the
double is made and closed in one place."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from corral import clock, config, launching
from corral.executors import kube_client
from tests.support import kube_api
from tests.support.launches import make_launch
from tests.support.wait import eventually

NS = "default"
IMAGE = "busybox:1.36"
JOBS_URL = f"/apis/batch/v1/namespaces/{NS}/jobs"


@pytest.fixture
async def cluster() -> AsyncIterator[kube_api.Cluster]:
    """The API double on loopback, its kubelet, Job controller and Argo controller."""
    async with kube_api.cluster() as c:
        yield c


def settings(**k8s: Any) -> config.Settings:
    """`executors.kubernetes` for the double: namespace NS, a 2 s termination grace, and
    short timeouts (a call's deadline is (RETRIES + 1) request timeouts: 4 s), `k8s` over
    them."""
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


@contextlib.asynccontextmanager
async def started(
    made: Callable[..., kube_client.ClusterExecutor],
    cluster: kube_api.Cluster,
    *,
    using: config.Settings | None = None,
    clock_: clock.Clock | None = None,
    **k8s: Any,
) -> AsyncIterator[Any]:
    """An executor of class `made` on the double, started, closed on exit: on `using`, or
    else `settings(**k8s)`, and the system clock unless `clock_` is given."""
    executor = made(
        settings=using or settings(**k8s),
        clock=clock_ or clock.SystemClock(),
        configuration=kube_api.configuration(cluster),
    )
    await executor.start()
    try:
        yield executor
    finally:
        await executor.close()


def executor_fixture(
    made: Callable[..., kube_client.ClusterExecutor],
    *,
    clock_fixture: str | None = None,
    **k8s: Any,
) -> Any:
    """A fixture of an executor of class `made` on the double, `started` with `k8s`, on the
    clock of the fixture named `clock_fixture` (else the system clock). A test module names
    the fixture by assigning it: `ex = executor_fixture(kubernetes.KubernetesExecutor)`."""

    async def fixture(
        cluster: kube_api.Cluster, request: pytest.FixtureRequest
    ) -> AsyncIterator[Any]:
        clock_ = request.getfixturevalue(clock_fixture) if clock_fixture else None
        async with started(made, cluster, clock_=clock_, **k8s) as executor:
            yield executor

    return pytest.fixture(fixture)


def launch(
    name: str,
    command: list[str],
    *,
    kind: str = "kubernetes",
    spec: dict[str, Any] | None = None,
    **kw: Any,
) -> launching.Launch:
    """The launch `name` on `kind` (kubernetes or argo) of one container, IMAGE running
    `command`, `spec` over that spec; `kw` go to `make_launch` (identity, payload, reach)."""
    return make_launch(kind, name, {"image": IMAGE, "command": command, **(spec or {})}, **kw)


async def observe(ex: Any, name: str) -> launching.Observation:
    return (await ex.observe([name]))[name]


async def until(
    ex: Any, name: str, test: Callable[[launching.Observation], bool]
) -> launching.Observation:
    """The first observation of `name` that passes `test` (polled)."""

    async def seen() -> launching.Observation | None:
        obs = await observe(ex, name)
        return obs if test(obs) else None

    found: launching.Observation = await eventually(seen, what=f"{name} as wanted")
    return found


async def finished(ex: Any, name: str) -> launching.Observation:
    """The first observation of `name` that has finished (polled)."""
    return await until(ex, name, lambda o: o.phase.finished)
