"""corral's loops on the kubernetes and argo executors, end to end: `runtime.serve` reads a
kubeconfig that points at the API double, jobs go in through the client, and Jobs and
Workflows come out; recovery settles what happened while corral was down."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral import (
    client,
    clock,
    config,
    errors,
    launching,
    model,
    reconciler,
    recovery,
    runtime,
    store,
)
from corral.executors import argo, base, kube_objects, kubernetes, kubernetes_owned
from corral.testing import FrozenClock
from corral.timeouts import Timeouts
from tests.support import kube_api
from tests.support.cluster import IMAGE, finished
from tests.support.wait import PATIENCE, eventually

pytestmark = [pytest.mark.timeout(4 * PATIENCE), pytest.mark.slow]

J, A, P = model.JobState, model.AttemptState, launching.Phase


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": url}}],
                "users": [{"name": "corral", "user": {"token": "not-checked"}}],
                "contexts": [
                    {"name": "double", "context": {"cluster": "double", "user": "corral"}}
                ],
                "current-context": "double",
            }
        )
    )
    return path


def make_settings(
    tmp_path: Path, url: str, *, cluster: dict[str, Any] | None = None, **timeouts: Any
) -> config.Settings:
    return config.Settings(
        database_url=f"sqlite:///{tmp_path}/corral.db",
        state_dir=tmp_path / "state",
        executors={
            "enabled": ["kubernetes", "argo"],
            "kubernetes": {
                "namespace": "default",
                "kubeconfig": str(kubeconfig(tmp_path / "kubeconfig", url)),
                "termination_grace": 1,
                "request_timeout": 10,
                "watch_timeout": 3,
                **(cluster or {}),
            },
        },
        timeouts=Timeouts(
            margin="500ms",
            tick_margin="50ms",
            dispatch_interval="200ms",
            observe_interval="300ms",
            reconcile_interval="300ms",
            launch_grace="5s",
            lease_timeout="10s",
            attempt_deadline="20s",
            cancel_grace="1s",
            **{"recovery_grace": "30s", **timeouts},
        ),
    )


@dataclass
class Corral:
    client: client.Client
    cluster: kube_api.Cluster

    async def wait(self, job_id: int, *states: model.JobState) -> Any:
        async def there() -> Any:
            view = await self.client.job(job_id)
            return view if view.job.state in states else None

        return await eventually(there, every=0.1, what=f"job {job_id} {states}")


async def migrated(settings: config.Settings) -> None:
    db = store.Store.connect(settings.database_url)
    await db.database.migrate()
    await db.close()


@pytest.fixture
async def corral(tmp_path: Path) -> AsyncIterator[Corral]:
    async with kube_api.cluster() as cluster:
        settings = make_settings(tmp_path, cluster.url)
        await migrated(settings)
        stop = asyncio.Event()
        loops = asyncio.create_task(runtime.serve(settings, stop))
        async with runtime.connect(settings) as c:
            try:
                yield Corral(c, cluster)
            finally:
                stop.set()
                await asyncio.wait_for(loops, PATIENCE)


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
async def test_jobs_run_as_jobs_and_workflows(corral: Corral, kind: str) -> None:
    ok, _ = await corral.client.submit(
        executor=kind, spec={"image": IMAGE, "command": ["sh", "-c", "echo hi"]}
    )
    bad, _ = await corral.client.submit(
        executor=kind,
        spec={"image": IMAGE, "command": ["sh", "-c", "echo broken >&2; exit 3"]},
        max_attempts=1,
    )
    assert (await corral.wait(ok, J.SUCCEEDED)).attempts[0].state == A.SUCCEEDED
    view = await corral.wait(bad, J.FAILED, J.QUARANTINED)
    assert view.attempts[0].exit_code == 3
    resource = kube_api.JOBS if kind == "kubernetes" else kube_api.WORKFLOWS
    made = {o["metadata"]["name"] for o in corral.cluster.api.objects(resource)}
    assert made == {view.attempts[0].launch_name for view in [await corral.client.job(ok), view]}


async def test_a_job_the_api_server_refuses_is_quarantined_not_retried(corral: Corral) -> None:
    corral.cluster.api.validators[kube_api.JOBS] = lambda _: ["refused by an admission policy"]
    job_id, _ = await corral.client.submit(
        executor="kubernetes", spec={"image": IMAGE, "command": ["true"]}, max_attempts=5
    )
    view = await corral.wait(job_id, J.QUARANTINED)
    assert len(view.attempts) == 1
    assert view.attempts[0].failure_class is model.FailureClass.PERMANENT
    reasons = " ".join(e.reason for e in view.events)
    assert "launch refused by the platform" in reasons
    assert "refused by an admission policy" in reasons


async def test_cancel_deletes_the_job(corral: Corral) -> None:
    job_id, _ = await corral.client.submit(
        executor="kubernetes", spec={"image": IMAGE, "command": ["sleep", "30"]}
    )
    await corral.wait(job_id, J.RUNNING)
    name = (await corral.client.job(job_id)).attempts[0].launch_name
    found = corral.cluster.api.find
    await eventually(lambda: found(kube_api.JOBS, "default", name), what="the Job made")
    await corral.client.cancel(job_id)
    await corral.wait(job_id, J.CANCELLED)
    await eventually(lambda: found(kube_api.JOBS, "default", name) is None, what="the Job deleted")
    await eventually(lambda: corral.cluster.api.objects(kube_api.PODS) == [], what="its pod gone")


async def test_a_pod_that_cannot_start_is_explained_then_quarantined(tmp_path: Path) -> None:
    bad = "ghcr.io/acme/etl:9.9"
    pulling = 'failed to pull image "ghcr.io/acme/etl:9.9": not found'
    async with kube_api.cluster() as cluster:
        cluster.kubelet.bad_images[bad] = ("ErrImagePull", pulling)
        settings = make_settings(tmp_path, cluster.url, cluster={"pod_start_timeout": "3s"})
        await migrated(settings)
        stop = asyncio.Event()
        loops = asyncio.create_task(runtime.serve(settings, stop))
        async with runtime.connect(settings) as c:
            try:
                job_id, _ = await c.submit(
                    executor="kubernetes", spec={"image": bad, "command": ["true"]}, max_attempts=3
                )

                async def explained() -> str | None:
                    said = await c.explain(job_id)
                    return said if "ErrImagePull" in said else None

                said = await eventually(explained, what="explain saying why it waits")
                assert "not started on its platform (waiting to start: ErrImagePull" in said
                assert pulling in said
                view = await Corral(c, cluster).wait(job_id, J.QUARANTINED)
            finally:
                stop.set()
                await asyncio.wait_for(loops, PATIENCE)
    assert len(view.attempts) == 1, "permanent: not retried"
    assert view.attempts[0].failure_class is model.FailureClass.PERMANENT
    reasons = [e.reason for e in view.events]
    assert any(r.startswith("pod did not start in ") for r in reasons), reasons


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
async def test_a_job_in_another_allowed_namespace_is_launched_read_and_stopped_there(
    tmp_path: Path, kind: str
) -> None:
    from corral.executors import argo

    made = {"kubernetes": kubernetes.KubernetesExecutor, "argo": argo.ArgoExecutor}[kind]
    resource = kube_api.JOBS if kind == "kubernetes" else kube_api.WORKFLOWS
    async with kube_api.cluster() as cluster:
        settings = make_settings(tmp_path, cluster.url, cluster={"namespaces": ["default", "etl"]})

        async def started() -> Any:
            ex = made(
                settings=settings,
                clock=clock.SystemClock(),
                configuration=kube_api.configuration(cluster),
            )
            await ex.start()
            return ex

        launcher, fresh = await started(), await started()  # fresh: a restart, knowing nothing
        try:
            spec = launcher.validate_spec(
                {"image": IMAGE, "command": ["sleep", "30"], "namespace": "etl"}
            )
            new = model.NewJob(executor=kind, spec=spec, payload={"big": "x" * 40_000})
            launch = base.launch_for(model.first_claim(new, NOW), settings, NOW)
            await launcher.launch(launch)
            await launcher.launch(launch)  # again: its 409 is read back in "etl"
            found = cluster.api.find
            assert found(resource, "etl", launch.name) is not None
            assert found(resource, "default", launch.name) is None
            assert found(kube_api.CONFIGMAPS, "etl", launch.name) is not None, "owned, beside it"
            for ex in (launcher, fresh):
                seen = (await ex.observe([launch.name]))[launch.name]
                assert seen.phase is not P.ABSENT
            await fresh.cancel(launch.name, timedelta(seconds=1))
            if kind == "kubernetes":
                await eventually(
                    lambda: found(resource, "etl", launch.name) is None, what="the Job deleted"
                )
            else:
                stopped_wf = found(resource, "etl", launch.name)
                assert stopped_wf["spec"]["shutdown"] == "Terminate"
        finally:
            await launcher.close()
            await fresh.close()


NOW = datetime(2026, 1, 1, tzinfo=UTC)


# --- while corral was down -------------------------------------------------------------------


async def running_attempt(
    db: store.Store, frozen: FrozenClock, settings: config.Settings, ex: Any, command: list[str]
) -> model.Claimed:
    """A job claimed, launched on the double and recorded running; then corral "stops"."""
    await db.jobs.submit(
        new=[model.NewJob(executor=ex.kind, spec={"image": IMAGE, "command": command})],
        now=frozen.now(),
    )
    [claimed] = await db.jobs.claim(now=frozen.now(), limit=1, executors=[ex.kind])
    await ex.launch(base.launch_for(claimed, settings, frozen.now()))
    await db.attempts.record_running(fences=[claimed.attempt.id], now=frozen.now())
    return claimed


@contextlib.asynccontextmanager
async def stopped(
    made: Any, tmp_path: Path, executor: Any = kubernetes.KubernetesExecutor
) -> AsyncIterator[tuple[Any, ...]]:
    """A cluster, a store, a started executor (of class `executor`) and a reconciler on a
    frozen clock: corral as recovery finds it after a stop, its loops not running."""
    async with kube_api.cluster() as cluster:
        settings = made(tmp_path, cluster.url)
        await migrated(settings)
        db = store.Store.connect(settings.database_url)
        ex = executor(
            settings=settings,
            clock=clock.SystemClock(),
            configuration=kube_api.configuration(cluster),
        )
        await ex.start()
        frozen = FrozenClock()
        rec = reconciler.Reconciler(
            store=db, executors={ex.kind: ex}, clock=frozen, settings=settings
        )
        yield cluster, db, ex, frozen, settings, rec
        await ex.close()
        await db.close()


@pytest.fixture
async def down(tmp_path: Path) -> AsyncIterator[tuple[Any, ...]]:
    async with stopped(make_settings, tmp_path) as parts:
        yield parts


API = {"api_url": "http://127.0.0.1:1", "attempt_key": "k" * 48}
"""Settings under which attempts get CORRAL_API_URL and an attempt token."""


@pytest.fixture
async def down_with_api(tmp_path: Path) -> AsyncIterator[tuple[Any, ...]]:
    def with_api(tmp_path: Path, url: str) -> config.Settings:
        return make_settings(tmp_path, url).model_copy(update=API)

    async with stopped(with_api, tmp_path) as parts:
        yield parts


async def test_a_job_that_finished_while_corral_was_down_is_settled_by_recovery(
    down: tuple[Any, ...],
) -> None:
    _cluster, db, ex, frozen, settings, rec = down
    c = await running_attempt(db, frozen, settings, ex, ["sh", "-c", "exit 4"])
    await finished(ex, c.attempt.launch_name)
    frozen.advance(11)  # past its lease: recovery looks at it
    summary = await rec.run_once()
    assert summary.completed == 1
    [attempt] = await db.attempts.list(job_id=c.job.id)
    assert (attempt.state, attempt.exit_code) == (A.FAILED, 4)


async def test_a_job_ttl_deleted_while_corral_was_down_is_lost_with_an_event(
    down: tuple[Any, ...],
) -> None:
    cluster, db, ex, frozen, settings, rec = down
    c = await running_attempt(db, frozen, settings, ex, ["true"])
    name = c.attempt.launch_name
    await finished(ex, name)
    cluster.jobs.ttl_expire("default", name)  # its outcome is gone with it
    frozen.advance(11)
    await rec.run_once()
    [attempt] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.RUNNING, "absent for a moment is no proof: not a success, no retry"
    frozen.advance(30)  # past recovery_grace
    await rec.run_once()
    [attempt, *_] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.LOST, "never a silent success"
    events = [e.reason for e in await db.events.list(job_id=c.job.id)]
    assert any("lost: not on the platform past recovery_grace" in r for r in events), events
    job = await db.jobs.get(job_id=c.job.id)
    assert job.state is J.QUEUED, "retried, and the run log says why"


async def test_a_launch_cut_short_before_its_payload_config_map_is_finished_by_recovery(
    down: tuple[Any, ...],
) -> None:
    """A dispatcher that stopped between the Job's create and its ConfigMap's (here: an API
    server that refused the second) leaves a Job whose pod waits for its volume; recovery,
    which launches a launching attempt it finds again before it adopts it, makes it."""
    cluster, db, ex, frozen, settings, rec = down
    payload = {"rows": ["é" * 100] * 200}  # 40 KB: a ConfigMap's
    command = ["sh", "-c", 'test "$(cat "$CORRAL_PAYLOAD_FILE")" = "$EXPECTED"']
    spec = {
        "image": IMAGE,
        "command": command,
        "env": {"EXPECTED": launching.payload_json(payload)},
    }
    await db.jobs.submit(
        new=[model.NewJob(executor="kubernetes", spec=spec, payload=payload)], now=frozen.now()
    )
    [claimed] = await db.jobs.claim(now=frozen.now(), limit=1, executors=["kubernetes"])
    name = claimed.attempt.launch_name
    cluster.api["post /api/v1/namespaces/default/configmaps"][:4] << 503 << {"code": 503}
    with pytest.raises(errors.ExecutorError, match="ConfigMap"):
        await ex.launch(base.launch_for(claimed, settings, frozen.now()))
    assert (await ex.observe([name]))[name].phase is P.PENDING, "its pod waits"
    frozen.advance(6)  # past launch_grace
    summary = await rec.run_once()
    assert (summary.adopted, summary.relaunched) == (1, 0)
    config_map = cluster.api.get(kube_api.CONFIGMAPS, "default", name)
    job_uid = cluster.api.get(kube_api.JOBS, "default", name)["metadata"]["uid"]
    assert [o["uid"] for o in config_map["metadata"]["ownerReferences"]] == [job_uid]
    await finished(ex, name)
    assert (await ex.observe([name]))[name].phase is P.SUCCEEDED, "it read its payload"
    [attempt] = await db.attempts.list(job_id=claimed.job.id)
    assert attempt.state == A.RUNNING, "adopted: its finish is the dispatcher's to apply"


async def test_a_launch_cut_short_before_its_token_secret_is_finished_by_recovery(
    down_with_api: tuple[Any, ...],
) -> None:
    """As for the ConfigMap: a Job whose pod waits for the Secret of its attempt token
    (CreateContainerConfigError) gets it when recovery launches the attempt again."""
    cluster, db, ex, frozen, settings, rec = down_with_api
    command = ["sh", "-c", 'test -n "$CORRAL_ATTEMPT_TOKEN" && test -n "$CORRAL_API_URL"']
    await db.jobs.submit(
        new=[model.NewJob(executor="kubernetes", spec={"image": IMAGE, "command": command})],
        now=frozen.now(),
    )
    [claimed] = await db.jobs.claim(now=frozen.now(), limit=1, executors=["kubernetes"])
    name = claimed.attempt.launch_name
    cluster.api["post /api/v1/namespaces/default/secrets"][:4] << 503 << {"code": 503}
    with pytest.raises(errors.ExecutorError, match="Secret"):
        await ex.launch(base.launch_for(claimed, settings, frozen.now()))
    assert (await ex.observe([name]))[name].phase is P.PENDING, "its pod waits"
    frozen.advance(6)  # past launch_grace
    summary = await rec.run_once()
    assert (summary.adopted, summary.relaunched) == (1, 0)
    secret = cluster.api.get(kube_api.SECRETS, "default", name)
    job_uid = cluster.api.get(kube_api.JOBS, "default", name)["metadata"]["uid"]
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [job_uid]
    token = launching.attempt_token(API["attempt_key"], claimed.job.id, claimed.attempt.id)
    stored = base64.b64decode(secret["data"][kubernetes_owned.ATTEMPT_TOKEN_KEY]).decode()
    assert stored == token
    assert token not in json.dumps(cluster.api.get(kube_api.JOBS, "default", name))
    await finished(ex, name)
    assert (await ex.observe([name]))[name].phase is P.SUCCEEDED, "it had its token"


# --- stopping: a deleted Job's pod runs on for its termination grace ---------------------------


@pytest.fixture(params=["kubernetes", "argo"])
async def down_slow(tmp_path: Path, request: Any) -> AsyncIterator[tuple[Any, ...]]:
    """As `down`, on either executor, with pods given a long termination grace (60 s): a
    stop takes that long."""

    def slow(tmp_path: Path, url: str) -> config.Settings:
        return make_settings(tmp_path, url, cluster={"termination_grace": 60}, recovery_grace="90s")

    made = {"kubernetes": kubernetes.KubernetesExecutor, "argo": argo.ArgoExecutor}
    async with stopped(slow, tmp_path, made[request.param]) as parts:
        yield parts


def lingers(gate: Path) -> list[str]:
    """A command that takes SIGTERM slowly: it ends (143) only once `gate` exists."""
    on_term = f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 143"
    loop = "echo loaded 40 rows; while true; do sleep 0.05; done"
    return ["sh", "-c", f"trap '{on_term}' TERM; {loop}"]


async def overdue_and_stopping(
    down: tuple[Any, ...], command: list[str], *, late: float = 0
) -> tuple[model.Claimed, recovery.Pass]:
    """An attempt running past its deadline (and `late` seconds more), stopped by recovery
    while its pod lingers."""
    _cluster, db, ex, frozen, _settings, rec = down
    c = await running_attempt(db, frozen, _settings, ex, command)
    name = c.attempt.launch_name
    await eventually(lambda: _running(ex, name), what=f"{name} running", every=0.1)
    frozen.advance(22 + late)  # past its deadline (20 s) and cancel_grace (1 s)
    summary = await rec.run_once()
    return c, summary


async def _running(ex: Any, name: str) -> bool:
    return (await ex.observe([name]))[name].phase is P.RUNNING


async def test_a_stopped_attempt_ends_only_once_its_pod_is_gone(
    down_slow: tuple[Any, ...], tmp_path: Path
) -> None:
    """Recovery stops an attempt past its deadline; its Job goes at once, but its pod runs
    on in its termination grace. The attempt stays running, with one `stopping` event,
    and its job is not retried beside it until the pod has ended."""
    cluster, db, ex, frozen, _settings, rec = down_slow
    gate = tmp_path / "gate"
    c, summary = await overdue_and_stopping(down_slow, lingers(gate))
    name = c.attempt.launch_name
    assert (summary.timed_out, summary.stopping) == (1, 1)
    if ex.kind == "kubernetes":
        assert cluster.api.find(kube_api.JOBS, "default", name) is None, "the Job is deleted"
    assert name in await ex.still_running([name]), "its pod is still Terminating"
    seen = (await ex.observe([name]))[name]
    assert not seen.phase.finished, "a dispatcher looking now sees no end to record"
    frozen.advance(1)
    summary = await rec.run_once()
    assert summary.stopping == 1
    [attempt] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.RUNNING, "not ended while its pod runs"
    assert (await db.jobs.get(job_id=c.job.id)).state is J.RUNNING, "no retry beside it"
    stopping = [e for e in await db.events.list(job_id=c.job.id) if "stopping" in e.reason]
    assert len(stopping) == 1, "said once"
    assert "Terminating" in stopping[0].reason or "Running" in stopping[0].reason
    gate.touch()  # the pod ends
    await eventually(lambda: _gone(ex, name), what=f"{name}'s pod ended", every=0.1)
    frozen.advance(1)
    summary = await rec.run_once()
    assert summary.stopping == 0
    [attempt, *_] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.FAILED
    assert "timed out" in (attempt.reason or "")
    assert (await db.jobs.get(job_id=c.job.id)).state is J.QUEUED, "retried now"
    # Its pod's log, read before it was stopped (gone since): why it ran so long.
    output = (await db.runlogs.of_job(job_id=c.job.id))[attempt.id]
    stream = output.stream(kube_objects.LOG_STREAM)
    assert stream is not None
    assert stream.text == "loaded 40 rows\n"


async def test_a_pod_that_outlives_its_whole_grace_no_longer_holds_its_attempt(
    down_slow: tuple[Any, ...], tmp_path: Path
) -> None:
    """A pod still there past the deadline, cancel_grace, its termination grace and the
    margin is taken for stuck on a lost node: the attempt ends, and its job may retry."""
    _cluster, db, _ex, frozen, _settings, rec = down_slow
    c, summary = await overdue_and_stopping(down_slow, lingers(tmp_path / "never"))
    assert summary.stopping == 1
    frozen.advance(61)  # past termination_grace (60 s) and the margin
    summary = await rec.run_once()
    assert summary.stopping == 0
    [attempt, *_] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.FAILED
    assert (await db.jobs.get(job_id=c.job.id)).state is J.QUEUED


async def _gone(ex: Any, name: str) -> bool:
    return name not in await ex.still_running([name])


async def test_a_late_stop_still_gives_the_pod_its_whole_grace(
    down_slow: tuple[Any, ...], tmp_path: Path
) -> None:
    """Recovery that first stops an attempt long past its deadline (it was down) counts the
    pod's grace from the stop, not from the deadline: the attempt does not end at once."""
    db = down_slow[1]
    c, summary = await overdue_and_stopping(down_slow, lingers(tmp_path / "gate"), late=60)
    assert summary.stopping == 1
    [attempt] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.RUNNING, "its pod has just had SIGTERM"


async def test_a_restarted_recovery_does_not_take_a_stopping_attempt_for_lost(
    down_slow: tuple[Any, ...], tmp_path: Path
) -> None:
    """A reconciler that stopped an attempt and then restarted no longer knows it: past
    recovery_grace the attempt's Job is absent, but its pod still runs, so it is stopped
    again and ends lost only once the pod has ended, never beside its retry. (A stopped
    Workflow stays, as the record: its attempt is stopped again and ends timed out.)"""
    _cluster, db, ex, frozen, settings, _rec = down_slow
    gate = tmp_path / "gate"
    c, _ = await overdue_and_stopping(down_slow, lingers(gate))
    fresh = reconciler.Reconciler(
        store=db, executors={ex.kind: ex}, clock=frozen, settings=settings
    )
    frozen.advance(70)  # past recovery_grace (90 s from its start)
    summary = await fresh.run_once()
    assert (summary.lost, summary.stopping) == (0, 1)
    [attempt] = await db.attempts.list(job_id=c.job.id)
    assert attempt.state == A.RUNNING
    gate.touch()
    name = c.attempt.launch_name
    await eventually(lambda: _gone(ex, name), what=f"{name}'s pod ended", every=0.1)
    frozen.advance(1)
    await fresh.run_once()
    [attempt, *_] = await db.attempts.list(job_id=c.job.id)
    if ex.kind == "kubernetes":
        assert attempt.state == A.LOST
        assert "its pods were stopped" in (attempt.reason or "")
    else:
        assert attempt.state == A.FAILED
        assert "timed out" in (attempt.reason or "")
    assert (await db.jobs.get(job_id=c.job.id)).state is J.QUEUED
