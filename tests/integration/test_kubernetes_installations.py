"""Two corral installations sharing a namespace, and an upgrade from a corral that did not
label its objects with its installation: the kubernetes and argo executors on the API
double, with a real store for recovery's part."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import clock, config, errors, launching, model, reconciler, store
from corral.executors import argo, base, kubernetes
from corral.testing import FrozenClock
from tests.support import cluster as double
from tests.support import kube_api
from tests.support.cluster import IMAGE, launch
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(4 * PATIENCE)

P = launching.Phase


def settings(**k8s: Any) -> config.Settings:
    return double.settings(**{"termination_grace": 1, "request_timeout": 2, **k8s})


@contextlib.asynccontextmanager
async def executor(
    made: Any, cluster: kube_api.Cluster, installation: str | None, **k8s: Any
) -> AsyncIterator[Any]:
    """An executor on the double, of `installation` (None: a corral from before them)."""
    async with double.started(made, cluster, using=settings(**k8s)) as ex:
        if installation is not None:
            ex.use_installation(installation)
        yield ex


RESOURCE = {"kubernetes": kube_api.JOBS, "argo": kube_api.WORKFLOWS}
MADE = {"kubernetes": kubernetes.KubernetesExecutor, "argo": argo.ArgoExecutor}


def test_a_name_prefix_takes_corrals_place_and_comes_off_again() -> None:
    ex = kubernetes.KubernetesExecutor(
        settings=settings(name_prefix="corral-staging"), clock=clock.SystemClock()
    )
    assert ex.platform_name("corral-42-1") == "corral-staging-42-1"
    assert ex.launch_name("corral-staging-42-1") == "corral-42-1"
    plain = kubernetes.KubernetesExecutor(settings=settings(), clock=clock.SystemClock())
    assert plain.platform_name("corral-42-1") == plain.launch_name("corral-42-1") == "corral-42-1"
    assert isinstance(ex, base.SharesPlatform)


@pytest.mark.parametrize("prefix", ["Corral", "a" * 25, "-x", "corral_b"])
def test_a_name_prefix_that_is_no_dns_label_is_refused_naming_the_setting(prefix: str) -> None:
    with pytest.raises(errors.ConfigError, match="executors.kubernetes.name_prefix"):
        config.Settings.load(None, executors={"kubernetes": {"name_prefix": prefix}})


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
async def test_two_installations_in_one_namespace_each_see_and_stop_only_their_own(
    kind: str,
) -> None:
    """Job 1 attempt 1 of each installation: two objects, two names, each labelled with
    its installation, each observed, listed and cancelled by its own executor alone."""
    async with (
        kube_api.cluster() as cluster,
        executor(MADE[kind], cluster, "aaaa") as a,
        executor(MADE[kind], cluster, "bbbb", name_prefix="corral-b") as b,
    ):
        await a.launch(launch("corral-1-1", ["sleep", "30"], kind=kind))
        await b.launch(launch("corral-1-1", ["sleep", "30"], kind=kind))
        objects = {o["metadata"]["name"]: o for o in cluster.api.objects(RESOURCE[kind])}
        assert set(objects) == {"corral-1-1", "corral-b-1-1"}
        assert objects["corral-1-1"]["metadata"]["labels"][model.INSTALLATION] == "aaaa"
        assert objects["corral-b-1-1"]["metadata"]["labels"][model.INSTALLATION] == "bbbb"
        for ex in (a, b):
            seen = await ex.observe(["corral-1-1"])
            assert set(seen) == {"corral-1-1"}
            assert seen["corral-1-1"].phase is not P.ABSENT
            mine = await ex.list_managed({model.MANAGED_BY: model.MANAGER})
            assert [o.name for o in mine] == ["corral-1-1"], "its own, under its launch name"
        await b.cancel("corral-1-1", timedelta(seconds=1))
        assert (await a.observe(["corral-1-1"]))["corral-1-1"].phase is not P.ABSENT
        assert cluster.api.find(RESOURCE[kind], "default", "corral-1-1") is not None


async def test_a_name_the_other_installation_holds_is_a_launch_conflict_that_says_so() -> None:
    """Two installations left on the same name prefix: the second launch of a name finds
    the other's Job, and fails naming the setting to change, never adopting it."""
    async with (
        kube_api.cluster() as cluster,
        executor(kubernetes.KubernetesExecutor, cluster, "aaaa") as a,
        executor(kubernetes.KubernetesExecutor, cluster, "bbbb") as b,
    ):
        await a.launch(launch("corral-1-1", ["sleep", "30"]))
        with pytest.raises(errors.LaunchConflict, match="another corral installation") as caught:
            await b.launch(launch("corral-1-1", ["sleep", "30"]))
        assert "executors.kubernetes.name_prefix" in str(caught.value)
        assert (await b.observe(["corral-1-1"]))["corral-1-1"].phase is P.ABSENT
        await b.cancel("corral-1-1", timedelta(seconds=1))  # its own attempt's, it thinks
        assert cluster.api.find(kube_api.JOBS, "default", "corral-1-1") is not None, "not its own"
        assert [chunk async for chunk in b.follow_log("corral-1-1")] == [], "nor its log"


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
async def test_a_workflow_of_the_same_name_of_another_installation_is_not_stopped(
    kind: str,
) -> None:
    async with (
        kube_api.cluster() as cluster,
        executor(MADE[kind], cluster, "aaaa") as a,
        executor(MADE[kind], cluster, "bbbb") as b,
    ):
        await a.launch(launch("corral-1-1", ["sleep", "30"], kind=kind))
        await b.cancel("corral-1-1", timedelta(seconds=1))
        made = cluster.api.get(RESOURCE[kind], "default", "corral-1-1")
        assert not (made.get("spec") or {}).get("shutdown"), "not stopped"
        assert not made["metadata"].get("deletionTimestamp"), "not deleted"


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
async def test_an_upgrade_labels_what_the_earlier_corral_made_and_loses_none_of_it(
    kind: str, tmp_path: Path
) -> None:
    """A Job (or Workflow) made by a corral that did not label its installation is not the
    new one's to read until recovery, finding its attempt in the store by name and
    identity, labels it and its pod; an unlabelled one the store does not hold (another
    installation's) is left as it is."""
    db = store.Store.connect(f"sqlite:///{tmp_path}/corral.db")
    await db.database.migrate()
    frozen = FrozenClock()
    try:
        await db.jobs.submit(
            new=[model.NewJob(executor=kind, spec={"image": IMAGE, "command": ["sleep", "30"]})],
            now=frozen.now(),
        )
        [claimed] = await db.jobs.claim(now=frozen.now(), limit=1, executors=[kind])
        await db.attempts.record_running(fences=[claimed.attempt.id], now=frozen.now())
        name = claimed.attempt.launch_name
        installation = await db.database.installation()
        async with kube_api.cluster() as cluster:
            async with executor(MADE[kind], cluster, None) as old:
                await old.launch(base.launch_for(claimed, settings(), frozen.now()))
                stranger = launch("corral-900-1", ["sleep", "30"], kind=kind, job_id=900, fence=900)
                await old.launch(stranger)
            async with executor(MADE[kind], cluster, installation) as new:
                assert (await new.observe([name]))[name].phase is P.ABSENT, "not its own yet"

                async def pod_runs() -> bool:
                    return any(
                        (p.get("status") or {}).get("phase") == "Running"
                        for p in cluster.api.objects(kube_api.PODS)
                        if p["metadata"]["labels"].get(model.JOB_ID) == str(claimed.job.id)
                    )

                await eventually(pod_runs, what="its pod running")
                rec = reconciler.Reconciler(
                    store=db, executors={kind: new}, clock=frozen, settings=settings()
                )
                summary = await rec.run_once()
                assert summary.labelled == 1
                made = cluster.api.get(RESOURCE[kind], "default", name)
                assert made["metadata"]["labels"][model.INSTALLATION] == installation
                assert (await new.observe([name]))[name].phase is not P.ABSENT
                pods = [
                    p
                    for p in cluster.api.objects(kube_api.PODS)
                    if p["metadata"]["labels"].get(model.JOB_ID) == str(claimed.job.id)
                ]
                assert pods
                assert all(
                    p["metadata"]["labels"].get(model.INSTALLATION) == installation for p in pods
                )
                assert name in await new.still_running([name]), "its pod is read as its own"
                other = cluster.api.get(RESOURCE[kind], "default", "corral-900-1")
                assert model.INSTALLATION not in other["metadata"]["labels"], "left alone"
                assert (await rec.run_once()).labelled == 0
    finally:
        await db.close()


async def test_an_upgrade_that_also_changed_the_name_prefix_leaves_the_old_objects_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Objects an earlier corral made under another name prefix are not this one's names:
    they are left unlabelled, said once a look, and not looked for again every pass."""
    db = store.Store.connect(f"sqlite:///{tmp_path}/corral.db")
    await db.database.migrate()
    frozen = FrozenClock()
    try:
        spec = {"image": IMAGE, "command": ["sleep", "30"]}
        await db.jobs.submit(new=[model.NewJob(executor="kubernetes", spec=spec)], now=frozen.now())
        [claimed] = await db.jobs.claim(now=frozen.now(), limit=1, executors=["kubernetes"])
        async with kube_api.cluster() as cluster:
            async with executor(kubernetes.KubernetesExecutor, cluster, None) as old:
                await old.launch(base.launch_for(claimed, settings(), frozen.now()))
            made = kubernetes.KubernetesExecutor
            async with executor(made, cluster, "aaaa", name_prefix="corral-b") as new:
                rec = reconciler.Reconciler(
                    store=db, executors={"kubernetes": new}, clock=frozen, settings=settings()
                )
                assert (await rec.run_once()).labelled == 0
                assert "under another name prefix" in caplog.text
                job = cluster.api.get(kube_api.JOBS, "default", claimed.attempt.launch_name)
                assert model.INSTALLATION not in job["metadata"]["labels"]
    finally:
        await db.close()


async def test_the_store_makes_one_installation_id_and_keeps_it(tmp_path: Path) -> None:
    db = store.Store.connect(f"sqlite:///{tmp_path}/corral.db")
    await db.database.migrate()
    try:
        first = await db.database.installation()
        assert re.fullmatch("[0-9a-f]{16}", first)
        assert model.label_problem(model.INSTALLATION, first) is None
        await db.database.migrate()
        assert await db.database.installation() == first
    finally:
        await db.close()
