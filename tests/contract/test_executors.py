"""The executor contract: what the dispatcher and the reconciler rely on, whatever the
platform. The same tests run against the process executor (real processes), and the
kubernetes and argo executors (the real Kubernetes client against the API double, whose
kubelet runs each pod's command as a real process). With `-m cluster` and KUBECONFIG set,
they run against a real cluster instead of the double (see tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import clock, config, errors, launching, model
from corral.executors import argo, base, kubernetes, process, registry
from tests.support import cluster as double
from tests.support import kube_api, procs
from tests.support.launches import make_launch, sh
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(4 * PATIENCE)  # a test waits for at most four things

KINDS = tuple(kind for kind in registry.known() if kind != "http")
"""Every registered executor (the `corral.executors` entry points) runs this suite, but
`http`: it runs no command, keeps nothing on a platform, and has a suite of its own
against real HTTP servers (tests/integration/test_http_executor.py)."""
IMAGE = "busybox:1.36"
REAL_CLUSTER = pytest.param("kubernetes-cluster", marks=pytest.mark.cluster)
"""The kubernetes executor on the cluster of KUBECONFIG, in CORRAL_TEST_NAMESPACE (a
namespace of its own: the tests count what corral manages there, and delete it)."""


@dataclass
class Backend:
    kind: str
    executor: Any
    cluster: kube_api.Cluster | None = None
    real: bool = False

    async def listening(self) -> None:
        """Return once `events()` is listening: on the double, once its watch is open. The
        process executor needs no wait: it yields the finish of every launch it made."""
        if self.cluster is not None:
            await self.cluster.api.watched()

    def quiet(self) -> bool:
        """Whether no command of any launch still runs here (so none can write any more):
        the double's kubelet has seen every pod's process end, or no process runs in a
        run folder of the process executor."""
        if self.cluster is not None:
            return not self.cluster.kubelet.tasks
        return not procs.running_under(self.executor.root)

    def same_machine(self) -> None:
        """Skip a test that reads what a command left on this machine's disk."""
        if self.real:
            pytest.skip("the command runs in a pod of the real cluster, not on this machine")

    def spec(self, command: Sequence[str]) -> dict[str, Any]:
        if self.kind == "process":
            return {"command": list(command)}
        return {"image": IMAGE, "command": list(command)}

    def launch(
        self,
        name: str,
        command: Sequence[str],
        *,
        job_id: int = 1,
        attempt_no: int = 1,
        fence: int = 1,
        deadline_seconds: float | None = None,
        payload: Any = None,
    ) -> launching.Launch:
        return make_launch(
            self.kind,
            name,
            self.spec(command),
            job_id=job_id,
            attempt_no=attempt_no,
            fence=fence,
            deadline_seconds=deadline_seconds,
            payload=payload,
        )

    async def wait_for(
        self, name: str, until: Callable[[launching.Observation], bool]
    ) -> launching.Observation:
        async def seen() -> launching.Observation | None:
            obs = (await self.executor.observe([name]))[name]
            return obs if until(obs) else None

        found: launching.Observation = await eventually(seen, what=f"{name} as wanted")
        return found

    async def finished(self, name: str) -> launching.Observation:
        return await self.wait_for(name, lambda o: o.phase.finished)


CLUSTER_SETTINGS = config.Settings(
    executors={"kubernetes": {"namespace": "default", "termination_grace": 2}}
)
"""The cluster executors' settings in this suite: the defaults but a 2 s termination grace."""


@pytest.fixture(params=[*KINDS, REAL_CLUSTER])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    kind: str = request.param
    if kind == "kubernetes-cluster":
        async for real in real_cluster():
            yield real
        return
    maker = BACKENDS.get(kind)
    if maker is None:
        pytest.fail(
            f"executor {kind!r} is registered but has no contract backend: add one to"
            " BACKENDS in tests/contract/test_executors.py"
        )
    async for made in maker(kind, tmp_path):
        yield made


async def process_backend(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), poll_interval=0.05, kill_grace=2
    )
    await ex.start()
    yield Backend(kind, ex)
    await ex.close()


async def cluster_backend(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    """The kubernetes or argo executor on the real client, against the API double."""
    made = {"kubernetes": kubernetes.KubernetesExecutor, "argo": argo.ArgoExecutor}[kind]
    async with (
        kube_api.cluster() as cluster,
        double.started(made, cluster, using=CLUSTER_SETTINGS) as ex,
    ):
        yield Backend(kind, ex, cluster)


BACKENDS: dict[str, Callable[[str, Path], AsyncIterator[Backend]]] = {
    "process": process_backend,
    "kubernetes": cluster_backend,
    "argo": cluster_backend,
}
"""How the suite gets each registered executor, with the platform (or its double) it needs."""


async def real_cluster() -> AsyncIterator[Backend]:
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.skip("-m cluster needs KUBECONFIG (and CORRAL_TEST_NAMESPACE)")
    settings = config.Settings(
        executors={
            "kubernetes": {
                "namespace": os.environ.get("CORRAL_TEST_NAMESPACE", "corral-test"),
                "kubeconfig": kubeconfig,
                "termination_grace": 2,
            }
        }
    )
    ex = kubernetes.KubernetesExecutor(settings=settings, clock=clock.SystemClock())
    await ex.start()
    try:
        yield Backend("kubernetes", ex, real=True)
    finally:
        for obs in await ex.list_managed({model.MANAGED_BY: model.MANAGER}):
            await ex.cancel(obs.name, timedelta(seconds=1))
        ends = time.monotonic() + 60  # names are reused by the next test: wait them out
        while await ex.list_managed({model.MANAGED_BY: model.MANAGER}):
            assert time.monotonic() < ends, "the test Jobs were not deleted within 60s"
            await asyncio.sleep(1)
        await ex.close()


def test_it_is_an_executor(backend: Backend) -> None:
    assert isinstance(backend.executor, base.Executor)
    assert backend.executor.kind == backend.kind.removesuffix("-cluster")


async def test_success(backend: Backend) -> None:
    await backend.executor.launch(backend.launch("ok-1", sh("echo hello")))
    obs = await backend.finished("ok-1")
    assert obs.phase is launching.Phase.SUCCEEDED
    assert obs.exit_code == 0
    assert obs.identity == model.Identity(1, 1, 1)
    assert obs.started_at is not None
    assert obs.finished_at is not None
    assert obs.started_at.tzinfo is not None
    assert obs.finished_at >= obs.started_at


async def test_failure_gives_exit_code_and_last_line(backend: Backend) -> None:
    await backend.executor.launch(
        backend.launch("bad-1", sh("echo working; echo oops >&2; exit 3"))
    )
    obs = await backend.finished("bad-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.exit_code == 3
    assert obs.message == "oops"
    assert obs.identity == model.Identity(1, 1, 1)


async def test_launch_twice_runs_once(backend: Backend, tmp_path: Path) -> None:
    backend.same_machine()
    marks = tmp_path / "marks"
    launch = backend.launch("once-1", sh(f"echo x >> {marks}"))
    await asyncio.gather(backend.executor.launch(launch), backend.executor.launch(launch))
    await backend.executor.launch(launch)
    await backend.finished("once-1")
    await eventually(backend.quiet, what="no command still running")  # a second run is done
    assert marks.read_text() == "x\n"


async def test_same_name_other_identity_conflicts(backend: Backend) -> None:
    await backend.executor.launch(backend.launch("clash-1", ["sleep", "5"], fence=1))
    with pytest.raises(errors.LaunchConflict, match="clash-1"):
        await backend.executor.launch(backend.launch("clash-1", ["sleep", "5"], fence=2))
    await backend.executor.cancel("clash-1", timedelta(seconds=1))


async def test_list_managed_by_selector(backend: Backend) -> None:
    ex = backend.executor
    await ex.launch(backend.launch("sel-1", ["true"], job_id=1))
    await ex.launch(backend.launch("sel-2", ["true"], job_id=2))
    await ex.launch(backend.launch("sel-3", ["true"], job_id=2, attempt_no=2, fence=3))
    mine = await ex.list_managed({model.JOB_ID: "2"})
    assert sorted(o.name for o in mine) == ["sel-2", "sel-3"]
    assert all(o.identity is not None and o.identity.job_id == 2 for o in mine)
    assert len(await ex.list_managed({model.MANAGED_BY: model.MANAGER})) == 3
    assert await ex.list_managed({"other": "x"}) == []


async def test_observe_absent(backend: Backend) -> None:
    obs = await backend.executor.observe(["never-1"])
    assert obs == {"never-1": launching.Observation("never-1", launching.Phase.ABSENT)}


async def test_cancel_stops_it(backend: Backend, tmp_path: Path) -> None:
    backend.same_machine()
    after = tmp_path / "after"
    await backend.executor.launch(backend.launch("cancel-1", sh(f"sleep 3; touch {after}")))
    await backend.wait_for("cancel-1", lambda o: o.phase is launching.Phase.RUNNING)
    await backend.executor.cancel("cancel-1", timedelta(seconds=1))
    obs = await backend.wait_for(
        "cancel-1", lambda o: o.phase in (launching.Phase.FAILED, launching.Phase.ABSENT)
    )
    assert obs.phase is not launching.Phase.SUCCEEDED
    await eventually(backend.quiet, what="the command stopped")  # so it can touch nothing later
    assert not after.exists(), "the command was stopped, not left to finish"


async def test_cancel_absent_or_finished_is_a_noop(backend: Backend) -> None:
    ex = backend.executor
    await ex.launch(backend.launch("done-1", ["true"]))
    done = await backend.finished("done-1")
    assert done.phase is launching.Phase.SUCCEEDED
    managed = await ex.list_managed({model.MANAGED_BY: model.MANAGER})

    await ex.cancel("never-1", timedelta(seconds=1))
    assert await ex.observe(["never-1"]) == {
        "never-1": launching.Observation("never-1", launching.Phase.ABSENT)
    }, "cancelling an absent name creates nothing"
    assert await ex.list_managed({model.MANAGED_BY: model.MANAGER}) == managed

    await ex.cancel("done-1", timedelta(seconds=1))
    after = (await ex.observe(["done-1"]))["done-1"]
    assert (after.phase, after.exit_code, after.reason) == (
        launching.Phase.SUCCEEDED,
        0,
        done.reason,
    ), "a finished launch keeps its result: cancelling it changes nothing"
    assert after.identity == model.Identity(1, 1, 1)
    assert await ex.list_managed({model.MANAGED_BY: model.MANAGER}) == managed


async def test_deadline(backend: Backend) -> None:
    await backend.executor.launch(backend.launch("late-1", ["sleep", "30"], deadline_seconds=1))
    obs = await backend.finished("late-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert obs.reason.startswith("deadline exceeded"), obs.reason
    assert obs.failure_class is model.FailureClass.TRANSIENT


async def test_events_yield_each_finish_once(backend: Backend) -> None:
    seen: list[launching.Observation] = []

    async def listen() -> None:
        async for obs in backend.executor.events():
            seen.append(obs)

    task = asyncio.create_task(listen())
    await backend.listening()  # the stream is up before anything finishes
    await backend.executor.launch(backend.launch("ev-1", ["true"], fence=1))
    await backend.executor.launch(backend.launch("ev-2", ["false"], job_id=2, fence=2))
    await eventually(lambda: {o.name for o in seen} >= {"ev-1", "ev-2"}, what="both finishes")
    # A later launch's finish, heard after theirs: anything yielded twice is in by then.
    await backend.executor.launch(backend.launch("ev-3", ["true"], job_id=3, fence=3))
    await eventually(lambda: "ev-3" in {o.name for o in seen}, what="the later finish")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    by_name = {o.name: o for o in seen}
    assert sorted(o.name for o in seen) == ["ev-1", "ev-2", "ev-3"], "each finish once"
    assert by_name["ev-1"].phase is launching.Phase.SUCCEEDED
    assert (by_name["ev-2"].phase, by_name["ev-2"].exit_code) == (launching.Phase.FAILED, 1)


async def test_a_spec_with_an_unknown_field_is_refused(backend: Backend) -> None:
    spec = {**backend.spec(["true"]), "comand": ["typo"]}
    with pytest.raises(errors.InvalidInput, match="comand"):
        backend.executor.validate_spec(spec)


# --- the payload ---------------------------------------------------------------------------------

READ_PAYLOAD = (
    'if [ -n "${CORRAL_PAYLOAD_FILE:-}" ]; then cat "$CORRAL_PAYLOAD_FILE";'
    ' elif [ -n "${CORRAL_PAYLOAD+set}" ]; then printf %s "$CORRAL_PAYLOAD";'
    " else printf null; fi"
)
"""How a job reads its payload on any executor (docs/how-a-job-runs.md): the file, else the
variable, else it is null."""
UNICODE = {"text": "grüße, 世界, 🐎", "quote": 'say "hi"\n', "n": [1, 2.5, True, None]}
LARGE = {"rows": [f"row {n}: {'é' * 40}" for n in range(500)]}  # ~44 KB: past 32 KiB


@pytest.mark.parametrize(
    "payload",
    [UNICODE, None, LARGE, "a string", 0],
    ids=["unicode", "none", "large", "string", "zero"],
)
async def test_the_command_reads_its_payload(
    backend: Backend, tmp_path: Path, payload: Any
) -> None:
    backend.same_machine()
    out = tmp_path / "payload.out"
    await backend.executor.launch(
        backend.launch("payload-1", sh(f"{READ_PAYLOAD} > {out}"), payload=payload)
    )
    obs = await backend.finished("payload-1")
    assert obs.phase is launching.Phase.SUCCEEDED, obs
    assert json.loads(out.read_text(encoding="utf-8")) == payload
