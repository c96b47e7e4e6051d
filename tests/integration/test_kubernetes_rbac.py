"""The Role `corral deploy rbac` writes is exactly what the executors use: each executor runs
a representative set of its scenarios against the API double, which keeps every request
as RBAC authorises it (API group, resource or subresource, verb, namespace), and every
call must be granted by the executor's RULES, and every granted verb used by some
scenario. A call the Role lacks fails on a real cluster with 403; a grant no call uses is
a permission corral asks for without need."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import launching, model
from corral.executors import argo, base, kubernetes, rbac
from tests.support import kube_api
from tests.support.cluster import NS, launch, started, until
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(6 * PATIENCE)

LARGE = {"rows": [f"row {n}: {'x' * 80}" for n in range(500)]}
"""A payload past 32 KiB: it goes in a ConfigMap."""
REACH = launching.Reach(api_url="http://127.0.0.1:1", attempt_key="k" * 48)
"""With an api_url, each attempt has a token: it goes in a Secret."""
MANAGED = {model.MANAGED_BY: model.MANAGER}
Used = set[tuple[str, str, str]]


def granted(rules: rbac.Rules) -> Used:
    return {(rule.group, rule.resource, verb) for rule in rules.corral for verb in rule.verbs}


async def listening(
    ex: Any, scenario: Callable[[], Awaitable[None]], api: kube_api.KubeApi
) -> None:
    """`scenario` while `ex.events()` lists and watches."""

    async def heard() -> None:
        async for _ in ex.events():
            pass

    task = asyncio.create_task(heard())
    try:
        await api.watched()
        await scenario()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def launched_twice_then_taken_over(ex: Any, cluster: kube_api.Cluster, kind: str) -> None:
    """A launch with a large payload and an attempt token, made again (409: read back);
    then its owner deleted, orphaning the ConfigMap and the Secret, and launched once
    more: they are given the new owner (patch)."""
    resource = kube_api.JOBS if kind == "kubernetes" else kube_api.WORKFLOWS
    made = launch("big-1", ["true"], kind=kind, payload=LARGE, reach=REACH)
    await ex.launch(made)
    await ex.launch(made)
    await until(ex, "big-1", lambda o: o.phase.finished)
    cluster.api.remove(resource, NS, "big-1", "Orphan")
    await ex.launch(made)
    await until(ex, "big-1", lambda o: o.phase.finished)


async def cancelled(ex: Any) -> None:
    await ex.launch(launch("stop-1", ["sleep", "30"], kind=ex.kind))
    await until(ex, "stop-1", lambda o: o.phase is launching.Phase.RUNNING)
    await ex.cancel("stop-1", timedelta(seconds=1))


async def swept(ex: Any, cluster: kube_api.Cluster, resource: tuple[str, str, str]) -> None:
    """A launch whose Job or Workflow is deleted without propagation: its pod, a stray,
    is found and stopped."""
    await ex.launch(launch("stray-1", ["sleep", "30"], kind=ex.kind))
    await until(ex, "stray-1", lambda o: o.phase is launching.Phase.RUNNING)
    cluster.api.remove(resource, NS, "stray-1", "Orphan")
    assert isinstance(ex, base.LeavesStrays)
    strays = await eventually(lambda: ex.list_strays(MANAGED), what="the stray")
    for stray in strays:
        if stray.launch_gone:
            await ex.stop_stray(stray)


async def relabelled(ex: Any) -> None:
    """An upgrade: what an earlier corral made, with no installation label, is found and
    given this installation's (its Job or Workflow, and its pod that runs)."""
    await ex.launch(launch("old-1", ["sleep", "30"], kind=ex.kind))
    await until(ex, "old-1", lambda o: o.phase is launching.Phase.RUNNING)
    ex.use_installation("install-1")
    unlabelled = [o.name for o in await ex.list_unlabelled()]
    assert "old-1" in unlabelled
    await ex.label(unlabelled)


async def kubernetes_calls(cluster: kube_api.Cluster, tmp_path: Path) -> None:
    async with started(kubernetes.KubernetesExecutor, cluster) as ex:

        async def scenario() -> None:
            await launched_twice_then_taken_over(ex, cluster, "kubernetes")
            async for _ in ex.follow_log("big-1"):  # its pod's log, followed
                pass
            await cancelled(ex)
            cluster.api.deny(kube_api.PODS, "no-root", "containers must set runAsNonRoot")
            await ex.launch(launch("never-1", ["true"]))
            await until(ex, "never-1", lambda o: "FailedCreate" in (o.reason or ""))
            cluster.api.allow(kube_api.PODS)
            await swept(ex, cluster, kube_api.JOBS)
            await ex.list_managed(MANAGED)
            await relabelled(ex)

        await listening(ex, scenario, cluster.api)


async def argo_calls(cluster: kube_api.Cluster, tmp_path: Path) -> None:
    async with started(argo.ArgoExecutor, cluster) as ex:

        async def scenario() -> None:
            await launched_twice_then_taken_over(ex, cluster, "argo")
            await cancelled(ex)
            await swept(ex, cluster, kube_api.WORKFLOWS)
            await ex.list_managed(MANAGED)
            await relabelled(ex)

        await listening(ex, scenario, cluster.api)


SCENARIOS = {
    "kubernetes": (kubernetes_calls, kubernetes.RULES),
    "argo": (argo_calls, argo.RULES),
}


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
async def test_the_role_grants_every_call_and_nothing_else(
    cluster: kube_api.Cluster, tmp_path: Path, kind: str
) -> None:
    calls, rules = SCENARIOS[kind]
    await calls(cluster, tmp_path)
    used: Used = {(c.group, c.resource, c.verb) for c in cluster.api.calls}
    assert used - granted(rules) == set(), "calls the Role does not grant (403 on a cluster)"
    assert granted(rules) - used == set(), "grants no scenario used"
    assert {c.namespace for c in cluster.api.calls} == {NS}, "a Role is namespaced"
